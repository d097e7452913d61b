"""The restricted pickle keeps the names that checkpoint files record for its rebuild functions."""

from __future__ import annotations

import io
import pickle

from fedselect.simulation import checkpoint as ck
from fedselect.simulation import safe_pickle


def test_the_rebuilders_are_found_under_the_name_files_record():
    """Files name them fedselect.simulation.checkpoint._rebuild_*, though safe_pickle defines them."""
    unpickler = safe_pickle.SafeUnpickler(io.BytesIO(b""), {})
    assert len(safe_pickle._REBUILDERS) == 14
    for name, rebuild in safe_pickle._REBUILDERS.items():
        assert rebuild.__module__ == safe_pickle.RECORDED_MODULE == ck.__name__
        assert getattr(ck, name) is rebuild
        assert pickle.loads(pickle.dumps(rebuild)) is rebuild
        assert unpickler.find_class(ck.__name__, name) is rebuild
