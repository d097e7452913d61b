"""fedselect's side of a ``bench_peers`` job: ``FederatedTrainer(selector="random", n_threads=1).fit``.

The federation is the job's pool and index matrix as a :class:`fedselect.Federation` (test split:
the pool's first 500 samples, evaluated only before the first round and in the last round, which
is never timed). A round's seconds are the wall time between the trainer's callbacks of two
consecutive rounds, so they hold everything ``fit`` does for the round (selection, the batched local
training, aggregation, the ledger, the history record). The run has ``warmup + rounds + 1`` rounds
(``warmup`` at least 1): the first are the warm-up, the last evaluates the test set, neither is timed. Run as
``python run_fedselect.py JOB.json`` from the repository root (or with fedselect installed).
"""

from __future__ import annotations

import sys
import time

from _common import emit, load_job, timings

import fedselect


def main(path: str) -> None:
    job, X, y, parts = load_job(path)
    Xn, yn = X.numpy(), y.numpy()
    fed = fedselect.Federation(Xn, yn, list(parts), Xn[:500], yn[:500], n_classes=int(job["n_classes"]))
    model = ("mlp", {"hidden": list(job["hidden"])}) if job["model"] == "mlp" else ("cnn", {})
    warmup, rounds = int(job["warmup"]), int(job["rounds"])
    stamps: list[tuple[float, float]] = []
    trainer = fedselect.FederatedTrainer(
        selector="random",
        model=model[0],
        model_params=model[1],
        clients_per_round=int(job["clients_per_round"]),
        rounds=warmup + rounds + 1,
        local_epochs=int(job["epochs"]),
        batch_size=int(job["batch_size"]),
        lr=float(job["lr"]),
        aggregation="mean",
        eval_every=warmup + rounds + 1,
        stop_at_target=False,
        random_state=int(job["seed"]),
        n_threads=1,
        callback=lambda trainer, record: stamps.append((time.perf_counter(), time.process_time())),
    )
    trainer.fit(fed)
    emit("fedselect", timings(stamps[warmup - 1 : -1]), version=fedselect.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
