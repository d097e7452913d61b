"""bench_scale's report of a point killed at its time limit: how far it got, and the bound that follows."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.speed import bench_scale as bs


def test_a_timed_out_point_says_how_far_it_got():
    err = b"a warning\nBENCH_SCALE_ROUND 0 12.5\nBENCH_SCALE_ROUND 1 30.0\n"
    msg = bs.timed_out_message(err, 5100.0)
    assert "rounds 0-1 finished by 30 s" in msg
    assert "more than 10.20 s/round amortised" in msg  # 5100 s over the 500-round schedule
    assert "no round finished" in bs.timed_out_message(None, 600.0)


def test_a_killed_worker_s_progress_reaches_the_parent():
    """What the parent reads on a timeout: the lines the worker wrote before it was killed (POSIX keeps them)."""
    code = f"import sys, time; print({bs.PROGRESS_PREFIX!r} + '0 0.5', file=sys.stderr, flush=True); time.sleep(60)"
    try:
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3)
    except subprocess.TimeoutExpired as exc:
        assert "rounds 0-0 finished by 0 s" in bs.timed_out_message(exc.stderr, 3.0)
    else:
        raise AssertionError("the worker was not killed")
