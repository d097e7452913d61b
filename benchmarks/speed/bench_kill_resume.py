"""Rounds redone after ``kill -9`` at random moments, and whether the resumed run equals an uninterrupted one.

For each selector, a child process runs ``FederatedTrainer.fit`` with ``checkpoint_dir`` and
``checkpoint_every=k`` on a digits federation (30 clients, 2 label shards each, 5 per round),
logging each completed round (from the callback, flushed) to a file. The parent kills it with
SIGKILL at a random moment (a random time after a randomly chosen round of that process), starts
the same call again, and so on ``--kills`` times; then lets it finish. Per kill:
``redone`` = (last round completed before the kill) + 1 - (first round completed after it), the
rounds trained twice. Goal: redone <= k, and the final history equals an uninterrupted run's in
every per-round field.

Usage::

    python -m benchmarks.speed.bench_kill_resume [--kills 8] [--every 10] [--rounds 80]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SELECTORS = {
    "random": {},
    "power-of-choice": {"d": 10},
    "fedcor": {"warmup_rounds": 5, "gp_interval": 5, "warmup_iters": 50, "gp_iters": 50},
}

CHILD = """
import json, sys
from fedselect import FederatedTrainer, get_selector, make_federation
name, params, ckpt, log, out, every, rounds = sys.argv[1:8]
fed = make_federation("digits", partition="shards", n_clients=30, shards_per_client=2, random_state=0)
fh = open(log, "a")
fh.write("start\\n"); fh.flush()
def cb(trainer, record):
    fh.write(f"{record.round}\\n"); fh.flush()
tr = FederatedTrainer(selector=get_selector(name, **json.loads(params)), rounds=int(rounds), clients_per_round=5,
                      local_epochs=1, batch_size=16, random_state=0, n_threads=1, callback=cb,
                      checkpoint_dir=None if ckpt == "-" else ckpt, checkpoint_every=int(every))
tr.fit(fed)
tr.history_.to_json(out)
"""


def child(name: str, ckpt: str, log: Path, out: Path, every: int, rounds: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    cmd = [
        sys.executable,
        "-c",
        CHILD,
        name,
        json.dumps(SELECTORS[name]),
        ckpt,
        str(log),
        str(out),
        str(every),
        str(rounds),
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def runs_of(log: Path) -> list[list[int]]:
    runs: list[list[int]] = []
    if log.exists():
        for line in log.read_text().split():
            if line == "start":
                runs.append([])
            elif runs:
                runs[-1].append(int(line))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(
        f"kill -9 at random moments: digits N=30, C=5, {args.rounds} rounds, checkpoint_every={args.every}, "
        f"{args.kills} kills per selector"
    )
    worst = 0
    for name in SELECTORS:
        tmp = Path(tempfile.mkdtemp(prefix="kill-resume-"))
        ref_out = tmp / "ref.json"
        p = child(name, "-", tmp / "ref.log", ref_out, args.every, args.rounds)
        p.wait()
        log, out, ckpt = tmp / "run.log", tmp / "out.json", tmp / "ckpt"
        kills = 0
        while kills < args.kills and not out.exists():
            started = len(runs_of(log))
            p = child(name, str(ckpt), log, out, args.every, args.rounds)
            goal = rng.randint(1, 2 * args.every)
            while p.poll() is None:
                r = runs_of(log)
                if len(r) > started and len(r[-1]) >= goal:
                    break
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.1))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                kills += 1
            if p.wait() not in (0, -signal.SIGKILL):
                raise SystemExit(f"the child run failed with status {p.returncode}; run it by hand to see why")
        if not out.exists():
            child(name, str(ckpt), log, out, args.every, args.rounds).wait()
        from fedselect.simulation import History

        equal = History.from_json(out) == History.from_json(ref_out)
        runs = runs_of(log)
        redone = [b[-1] + 1 - a[0] for b, a in itertools.pairwise(runs) if b and a]
        worst = max([worst, *redone])
        print(
            f"{name:>16}: {kills} kills, killed after rounds {[b[-1] if b else None for b in runs[:-1]]}, "
            f"rounds redone per kill {redone} (max {max(redone, default=0)}, goal <= {args.every}); "
            f"history equal to an uninterrupted run: {equal}"
        )
    print(f"max rounds redone over all kills: {worst} (k = {args.every})")


if __name__ == "__main__":
    main()
