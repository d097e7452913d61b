"""The official FedCor code of July 2022 (commit 8ce23fb, behind the paper's Table 1) as settings of FedCorSelector.

Its training loop differs from the default (the paper's text, which the 2023 code also follows) in two ways that
are parameters here: the warm-up fits start at ``gpr_begin = 10`` (``warmup_fit_start``), so on the FMNIST schedule
they see at most 6 loss-change vectors where the default's see up to 11; and its annealing branch also runs in the
random warm-up rounds before that (``anneal_before_fit_start``), so the Algorithm-1 selections up to the first GP
round start from factors that the warm-up picks lowered.

The expectations are written out by hand from ``src/federated_main.py`` at 8ce23fb, in this numbering: its epoch e
trains round e; its branch ``gpr_begin <= epoch <= warmup`` appends ``l(w^{e+1}) - l(w^e)`` and fits on the last
``group_size`` vectors after round e's training, i.e. in our select call of round e + 1; its ``else`` branch
(``update_discount``) runs for every epoch before ``gpr_begin`` and for the Algorithm-1 rounds that are not GP
rounds. Its GP step (``epoch > warmup and epoch % GPR_interval == 0``) runs after round e's aggregation, on
w^{e+1}, and chooses round e + 1: in our numbering its GP rounds are t = e + 1, one round after the paper's
(``gp_round_offset=1`` in CODE_2022; the default keeps the paper's rounds, and the runs recorded before the parameter).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedselect.presets import FEDCOR_2022_CODE, get_preset
from fedselect.selection import ClientPool
from fedselect.selectors import _gp
from fedselect.selectors.fedcor import CODE_2022, FedCorSelector

from .test_fedcor import FAST, GroupOracle, spied

W, DT, BETA, THETA, N_PICK = 15, 10, 0.95, 0.8, 4  # the FMNIST command's schedule


def _trace(selector: FedCorSelector, monkeypatch, rounds: int = 24):
    """Run ``rounds`` rounds on a GroupOracle; what was asked, fitted, and the factors each Algorithm 1 used."""
    spy = spied(selector, monkeypatch)
    used: dict[int, np.ndarray] = {}
    real = _gp.greedy_select
    current = {"t": -1}

    def recording(x, noise, weights, alpha, n, **kwargs):
        used[current["t"]] = np.array(alpha, dtype=float)
        return real(x, noise, weights, alpha, n, **kwargs)

    monkeypatch.setattr(_gp, "greedy_select", recording)
    oracle = GroupOracle()
    selector.fit(ClientPool(np.full(oracle.n_clients, 50)))
    picks, after = [], []
    for t in range(rounds):
        current["t"] = t
        picks.append(selector.select(N_PICK, round=t, oracle=oracle).clients)
        after.append(selector.alpha_.copy())
        oracle.advance()
    losses_at = [r for r, kind, _ in oracle.calls if kind == "losses"]
    return spy.calls, picks, used, after, losses_at, oracle.n_clients


def _factors_2022(
    picks: list[np.ndarray], n_clients: int, rounds: int, *, gpr_begin: int, offset: int = 1
) -> dict[int, np.ndarray]:
    """The factors each Algorithm-1 selection of the 2022 loop uses, by hand.

    Epochs before gpr_begin: the else branch multiplies the factors of the round's (random) picks by beta.
    Epochs gpr_begin..W: the warm-up branch, no annealing. After the warm-up: the GP step of epoch e (e > W,
    e % DT == 0) resets every factor before the selection of round e + 1 (``offset=1``; ``offset=0``: the paper's
    rounds, t % DT == 0), and every Algorithm-1 selection's picks are then multiplied by beta.
    """
    alpha = np.ones(n_clients)
    for e in range(gpr_begin):
        alpha[picks[e]] *= BETA
    out = {}
    for t in range(W + 1, rounds):
        if t - offset > W and (t - offset) % DT == 0:
            alpha = np.ones(n_clients)
        out[t] = alpha.copy()
        alpha[picks[t]] *= BETA
    return out


def test_code_2022_is_one_documented_parameter_set_and_the_presets_row():
    assert CODE_2022 == FEDCOR_2022_CODE == {"theta": 0.8, "gp_history": "latest", "posterior_noise": True,
                                             "warmup_fit_start": 10, "anneal_before_fit_start": True,
                                             "gp_round_offset": 1}
    for name in ("fedcor-fmnist-2spc", "fedcor-fmnist-1spc", "fedcor-fmnist-dir"):
        label, params = get_preset(name).selectors["FedCor (2022 code)"]
        assert label == "fedcor" and params == {"warmup_rounds": W, "gp_interval": DT, "beta": BETA, **CODE_2022}
        # the paper's row is untouched: theta 0.9 and the default reading
        assert get_preset(name).selectors["FedCor"][1] == {"warmup_rounds": W, "gp_interval": DT, "beta": BETA,
                                                          "theta": 0.9}
    _, cifar = get_preset("fedcor-cifar10-2spc").selectors["FedCor (2022 code)"]
    assert cifar == {"warmup_rounds": 20, "gp_interval": 50, "beta": 0.9, **CODE_2022, "theta": 0.97}
    sel = FedCorSelector(**CODE_2022)
    assert (sel.theta, sel.warmup_fit_start, sel.warmup_rounds, sel.gp_interval) == (0.8, 10, W, DT)


def test_the_2022_loop_trace(monkeypatch):
    """Losses from round 10 on, warm-up fits on the vectors of rounds 10..t-1 (at most 6), the first GP round (21) on
    the last warm-up vector and its trial, and the warm-up picks of rounds 0-9 carried into rounds 16-20."""
    rounds = 24
    fits, picks, used, after, losses_at, n_clients = _trace(FedCorSelector(**CODE_2022, **FAST, random_state=0),
                                                            monkeypatch, rounds)
    # no loss asked before gpr_begin; every client's loss at the start of rounds 10..W+1
    assert losses_at == list(range(10, W + 2))
    # warm-up fits in the select calls of rounds 11..16, each on every vector since round 10: 1, 2, ..., 6 vectors
    warmup, gp = fits[: W + 1 - 10], fits[W + 1 - 10:]
    assert [c["rounds"] for c in warmup] == [list(range(10, t)) for t in range(11, W + 2)]
    for c, t in zip(warmup, range(11, W + 2)):
        np.testing.assert_allclose(c["weights"], THETA ** (t - 1 - np.arange(10, t, dtype=float)))
    # the first GP round (21, after epoch 20): the last warm-up vector and the trial, the older weighted theta^DT
    assert [c["rounds"] for c in gp] == [[W, 21]]
    np.testing.assert_allclose(gp[0]["weights"], [THETA**DT, 1.0])
    # the factors every Algorithm-1 selection used: the 2022 loop's, warm-up picks of rounds 0-9 included
    want = _factors_2022(picks, n_clients, rounds, gpr_begin=10)
    assert sorted(used) == list(range(W + 1, rounds))
    for t in range(W + 1, rounds):
        np.testing.assert_allclose(used[t], want[t], rtol=0, atol=0, err_msg=f"round {t}")
    assert used[W + 1].min() < 1  # the carry-over is there to see: some warm-up pick weighs round 16
    for t in range(W + 1, 21):
        assert not np.array_equal(used[t], _factors_2022(picks, n_clients, rounds, gpr_begin=0)[t])
    np.testing.assert_array_equal(used[21], np.ones(n_clients))  # the reset wipes the carry-over
    # after each warm-up round before 10 the factors of its picks are down by beta, as the else branch does
    for e in range(10):
        expected = np.ones(n_clients)
        for r in range(e + 1):
            expected[picks[r]] *= BETA
        np.testing.assert_allclose(after[e], expected, rtol=0, atol=0)


def test_the_default_fits_from_round_0_on_up_to_11_vectors_and_anneals_no_warmup_pick(monkeypatch):
    rounds = 22
    fits, picks, used, after, losses_at, n_clients = _trace(FedCorSelector(**FAST, random_state=0), monkeypatch,
                                                            rounds)
    assert losses_at == list(range(0, W + 2))
    warmup = fits[: W + 1]
    assert [c["rounds"] for c in warmup] == [list(range(max(0, t - 11), t)) for t in range(1, W + 2)]
    assert max(len(c["rounds"]) for c in warmup) == 11
    want = _factors_2022(picks, n_clients, rounds, gpr_begin=0, offset=0)
    for t in range(W + 1, rounds):
        np.testing.assert_array_equal(used[t], want[t])
    np.testing.assert_array_equal(used[W + 1], np.ones(n_clients))
    for e in range(W + 1):
        np.testing.assert_array_equal(after[e], np.ones(n_clients))


def test_each_2022_difference_is_its_own_parameter(monkeypatch):
    """warmup_fit_start alone moves the fits and asks no loss before it, but anneals nothing; the carry-over alone
    (fits from round 0) has no round before the fit start to anneal."""
    start_only = {**CODE_2022, "anneal_before_fit_start": False}
    fits, _, used, _, losses_at, n = _trace(FedCorSelector(**start_only, **FAST, random_state=0), monkeypatch)
    assert losses_at == list(range(10, W + 2)) and len(fits[0]["rounds"]) == 1
    np.testing.assert_array_equal(used[W + 1], np.ones(n))
    monkeypatch.undo()
    carry_only = {**CODE_2022, "warmup_fit_start": 0}
    _, _, used, _, losses_at, n = _trace(FedCorSelector(**carry_only, **FAST, random_state=0), monkeypatch)
    assert losses_at == list(range(0, W + 2))
    np.testing.assert_array_equal(used[W + 1], np.ones(n))


def test_the_2022_setting_with_the_real_gp():
    """The fit log of a real (unspied) run: 6 warm-up fits on 1..6 vectors, then 2 vectors per GP round (21, 31)."""
    oracle = GroupOracle()
    selector = FedCorSelector(**CODE_2022, rank=3, warmup_iters=3, gp_iters=3, random_state=0)
    selector.fit(ClientPool(np.full(oracle.n_clients, 50)))
    for t in range(32):
        selector.select(N_PICK, round=t, oracle=oracle)
        oracle.advance()
    assert [(f.round, f.kind, f.n_vectors) for f in selector.fit_log_] == [
        *[(t, "warmup", t - 10) for t in range(11, W + 2)], (21, "gp_round", 2), (31, "gp_round", 2)]


def test_warmup_fit_start_must_be_a_warmup_round():
    with pytest.raises(ValueError, match=r"warmup_fit_start=16 is invalid.*warmup_rounds=15"):
        FedCorSelector(warmup_fit_start=16).fit(ClientPool([10] * 30))
    with pytest.raises(ValueError, match=r"warmup_fit_start=-1"):
        FedCorSelector(warmup_fit_start=-1).fit(ClientPool([10] * 30))
    with pytest.raises(ValueError, match=r"anneal_before_fit_start='yes'"):
        FedCorSelector(anneal_before_fit_start="yes").fit(ClientPool([10] * 30))


def test_the_new_parameters_leave_recorded_runs_identified_as_before():
    """At their defaults (today's behaviour) they are not part of what identifies a run; the 2022 setting is."""
    default = FedCorSelector().identifying_params()
    assert "warmup_fit_start" not in default and "anneal_before_fit_start" not in default
    code = FedCorSelector(**CODE_2022).identifying_params()
    assert code["warmup_fit_start"] == 10 and code["anneal_before_fit_start"] is True


@pytest.mark.parametrize(
    ("warmup", "offset", "gp_rounds"),
    [
        (W, 0, [20, 30]),  # the paper's rounds: every recorded run, the 2022-code rows included
        (W, 1, [21, 31]),  # the 2022 code: the GP step after epochs 20 and 30 chooses rounds 21 and 31
        (20, 0, [30]),  # warmup a multiple of the interval: no GP round at t = W
        (20, 1, [31]),  # nor in the 2022 code (epoch > warmup): 21 is an Algorithm-1 round without a trial
    ],
)
def test_which_rounds_are_gp_rounds_under_each_reading(monkeypatch, warmup, offset, gp_rounds):
    """The rounds whose select call runs a trial and refits (the oracle's trial calls), and resets the factors."""
    selector = FedCorSelector(warmup_rounds=warmup, gp_interval=DT, gp_round_offset=offset, **FAST, random_state=0)
    spy = spied(selector, monkeypatch)
    oracle = GroupOracle()
    selector.fit(ClientPool(np.full(oracle.n_clients, 50)))
    after = []
    for t in range(35):
        selector.select(N_PICK, round=t, oracle=oracle)
        after.append(selector.alpha_.copy())
        oracle.advance()
    assert sorted({r for r, kind, _ in oracle.calls if kind == "trial"}) == gp_rounds
    assert [c["rounds"][-1] for c in spy.calls if c["rounds"][-1] > warmup] == gp_rounds
    for t in gp_rounds:  # the reset before the GP round's pick: only that pick is annealed after it
        assert np.count_nonzero(after[t] < 1) == N_PICK < np.count_nonzero(after[t - 1] < 1)


def test_gp_round_offset_is_checked_and_identifies_only_when_set():
    with pytest.raises(ValueError, match="gp_round_offset"):
        FedCorSelector(gp_round_offset=DT).fit(ClientPool([10] * 30))
    with pytest.raises(ValueError, match="gp_round_offset"):
        FedCorSelector(gp_round_offset=-1).fit(ClientPool([10] * 30))
    assert "gp_round_offset" not in FedCorSelector().identifying_params()
    assert FedCorSelector(**CODE_2022).identifying_params()["gp_round_offset"] == 1
