"""The finiteness checks every round makes on the clients' updates and the new global model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedselect.aggregation import all_finite, finite_rows

BIG = float(np.finfo(np.float32).max) / 2  # finite, yet two of them sum to infinity in float32


@pytest.mark.parametrize(
    ("row", "finite"),
    [
        ([1.0, -2.0, 3.0], True),
        ([1.0, float("nan"), 3.0], False),
        ([float("inf"), 0.0, 0.0], False),
        ([float("-inf"), float("inf"), 0.0], False),  # the sum is NaN
        ([BIG, BIG, BIG], True),  # the sum overflows, the entries are finite: the entries decide
        ([-BIG, -BIG, 1.0], True),
    ],
)
def test_finite_rows_is_exact_even_where_a_row_sum_overflows(row, finite):
    updates = torch.tensor([[0.5, 0.25, 0.0], row], dtype=torch.float32)
    assert finite_rows(updates).tolist() == [True, finite]
    assert all_finite(updates) is finite
    assert all_finite(torch.tensor(row, dtype=torch.float32)) is finite


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=6),
        min_size=1,
        max_size=4,
    ).filter(lambda rows: len({len(r) for r in rows}) == 1)
)
def test_finite_rows_equals_isfinite(rows):
    updates = torch.tensor(rows, dtype=torch.float32)
    assert torch.equal(finite_rows(updates), torch.isfinite(updates).all(dim=1))
    assert all_finite(updates) == bool(torch.isfinite(updates).all())


def test_an_empty_update_is_finite():
    assert finite_rows(torch.zeros(3, 0)).tolist() == [True] * 3
    assert all_finite(torch.zeros(0))
