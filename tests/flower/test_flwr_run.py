"""`flwr run examples/flower-fedcor` under Flower's simulation engine, exactly as docs/flower.rst says.

The CLI starts a local SuperLink in simulation mode in the background and leaves it running;
the test gives it free ports and a temporary FLWR_HOME, and stops it afterwards by the PID the
docs tell a user to find (the flower-superlink whose log file lies in that FLWR_HOME).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

pytestmark = pytest.mark.flower_simulation

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 2


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _pids_with(text):
    """Processes whose command line contains ``text`` (here: a unique temporary directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def _cmdline(pid):
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the background SuperLink through /proc")
def test_flwr_run_of_the_example_under_the_simulation_engine(tmp_path):
    flwr = Path(sys.executable).with_name("flwr")
    if not flwr.exists():
        pytest.skip("the flwr CLI is not installed next to this Python")
    home = tmp_path / "flwr-home"
    home.mkdir()
    records = tmp_path / "records-{run_id}.jsonl"
    http_port, control_port = _free_ports(2)
    env = dict(os.environ)
    env.update({
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    })
    cmd = [
        str(flwr), "run", "examples/flower-fedcor", "--stream",
        "--federation-config", "num-supernodes=4",
        "--run-config", f"dataset='digits' num-clients=4 clients-per-round=2 num-server-rounds={ROUNDS} "
                        f"warmup-rounds=1 gp-interval=2 lr=0.05 records-path='{records}'",
    ]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    finally:
        # What docs/flower.rst says: the flower-superlink whose log file is under this FLWR_HOME, by its PID
        # (its ServerApp processes follow it).
        link = [pid for pid in _pids_with(f"{home}/local-superlink/") if "flower-superlink" in _cmdline(pid)]
        for pid in link:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while _pids_with(str(home)) and time.monotonic() < deadline:
            time.sleep(0.2)
    out = proc.stdout + proc.stderr
    assert len(link) == 1, out[-3000:]
    # The strategy logs each round as it ends.
    rounds = [line for line in out.splitlines() if "fedselect round" in line]
    # `flwr run` exits 0 even when the run fails on the SuperLink: the round lines and records are the evidence.
    assert proc.returncode == 0, out[-3000:]
    assert "ServerApp raised an exception" not in out, out[-3000:]
    assert len(rounds) == ROUNDS, out[-3000:]
    assert all("failed []" in line for line in rounds), rounds
    assert "4 simulated SuperNodes" in out
    # ... and appends each round's record to records-path ({run_id} replaced by the run's id).
    (path,) = tmp_path.glob("records-*.jsonl")
    run_id = path.name[len("records-"):-len(".jsonl")]
    assert f"Successfully started run {run_id}" in out
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["round"] for r in lines] == list(range(ROUNDS))
    assert all(r["failed"] == [] and len(r["clients"]) == 2 for r in lines), lines
    assert _pids_with(str(home)) == []
