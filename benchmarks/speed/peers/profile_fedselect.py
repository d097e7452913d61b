"""Where fedselect's round of a ``bench_peers`` job spends its time (``bench_peers --profile [--jobs cnn]``).

The MLP job (Fashion-MNIST, 100 clients of 2 label shards, 10 a round, MLP 784-200-200-10, one epoch
of batch 50, lr 0.05, the mean) through ``FederatedTrainer(selector="random", n_threads=1)``, profiled
from the end of the warm-up round to the end of the last timed round (the final round, which
evaluates the test set, is outside the window) by ``cProfile`` with the process's CPU time as its
clock (``time.process_time``), so that a busy machine's waits for a core are left out: each torch
call (``torch.bmm``, ``Tensor.sub_``, ...) is timed as the built-in it is, and each Python function's
own time is Python overhead. Printed: the window's wall and CPU time per round, the top functions
by own CPU time with their share, and the shares of the groups the lead decides hot-path changes
by: matrix products, gathers and indexing, copies, casts, subtractions, other torch calls, Python.
``shapes=True`` adds ``torch.profiler``'s operators with their input shapes (their times are wall
time, so only their proportions mean something on a busy machine).

``job="cnn"``: the CNN job instead (FedCor's CIFAR-10 CNN on the job's CIFAR-shaped pool, written
as ``bench_peers`` writes it). Its local training is autograd's, so cProfile sees the backward pass
as one built-in (``run_backward``); the operator table (``shapes=True``, implied) says what is in it.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections import defaultdict

# Substrings of a built-in's name (cProfile's "{method 'sub_' of 'torch._C.TensorBase' objects}",
# "{built-in method torch.bmm}"), tried in this order.
GROUPS = (
    ("matmul", ("bmm", "mm'", "mm}", "matmul", "linear", "addmm")),
    ("gather/index", ("index", "gather", "take", "__getitem__", "__setitem__")),
    ("copy", ("copy_", "clone", "contiguous", "torch.cat", "torch.stack")),
    ("cast", ("'to'", "'float'", "'double'", "'type'", "_to_copy")),
    ("subtraction", ("sub", "__rsub__")),
    ("convolution and pooling (forward)", ("conv", "pool")),
    ("autograd's backward pass", ("run_backward",)),
)


def _group(func: tuple[str, int, str]) -> str:
    filename, _, name = func
    if filename != "~":
        return "Python (own time of Python functions)"
    if "torch" not in name:
        return "other built-ins"
    return next((g for g, keys in GROUPS if any(k in name for k in keys)), "other torch calls")


def _cnn_federation(n_clients: int) -> object:
    """The CNN job's federation as ``bench_peers`` writes it and fedselect's driver reads it."""
    import tempfile
    from pathlib import Path

    import fedselect
    from benchmarks.speed.bench_peers import write_job
    from benchmarks.speed.peers._common import load_job

    with tempfile.TemporaryDirectory() as tmp:
        path = write_job("cnn", Path(tmp), n_clients=n_clients, cnn_samples=50_000, dataset=None, seed=0)
        job, X, y, parts = load_job(str(path))
    Xn, yn = X.numpy(), y.numpy()
    return fedselect.Federation(Xn, yn, list(parts), Xn[:500], yn[:500], n_classes=int(job["n_classes"]))


def main(
    rounds: int = 5,
    n_clients: int = 100,
    dataset: str = "fmnist",
    top: int = 15,
    shapes: bool = False,
    job: str = "mlp",
) -> dict[str, float]:
    """Profile ``rounds`` rounds after one warm-up; print the tables; return the group shares of CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import fedselect

    if job == "cnn":
        fed = _cnn_federation(n_clients)
        model, model_params, shapes = "cnn", {}, True
    else:
        fed = fedselect.make_federation(
            dataset, partition="shards", shards_per_client=2, n_clients=n_clients, random_state=0
        )
        model, model_params = "mlp", {"hidden": [200, 200]}
    cprof = cProfile.Profile(time.process_time)
    tprof = profile(activities=[ProfilerActivity.CPU], record_shapes=True) if shapes else None
    window: list[tuple[float, float]] = []

    def callback(trainer: object, record: object) -> None:
        t = record.round  # type: ignore[attr-defined]
        if t == 0:
            window.append((time.perf_counter(), time.process_time()))
            if tprof is not None:
                tprof.start()
            cprof.enable()
        elif t == rounds:
            cprof.disable()
            if tprof is not None:
                tprof.stop()
            window.append((time.perf_counter(), time.process_time()))

    fedselect.FederatedTrainer(
        selector="random", model=model, model_params=model_params, clients_per_round=10,
        rounds=rounds + 2, local_epochs=1, batch_size=50, lr=0.05, aggregation="mean", eval_every=rounds + 2,
        stop_at_target=False, random_state=0, n_threads=1, callback=callback,
    ).fit(fed)  # fmt: skip
    wall, cpu = window[1][0] - window[0][0], window[1][1] - window[0][1]
    stats = pstats.Stats(cprof).stats  # type: ignore[attr-defined]
    own = {func: row[2] for func, row in stats.items()}  # tottime: the function's own CPU seconds
    calls = {func: row[1] for func, row in stats.items()}
    total = sum(own.values())
    print(
        f"profile: {rounds} rounds after 1 warm-up, per round {wall / rounds:.4f} s wall, {cpu / rounds:.4f} s CPU "
        f"({total / rounds:.4f} s inside the profiler's functions), torch {torch.__version__}, 1 thread, job {job}"
    )
    print("| function (own CPU time) | calls/round | ms/round | share |\n|---|---|---|---|")
    for func in sorted(own, key=own.__getitem__, reverse=True)[:top]:
        name = func[2] if func[0] == "~" else f"{func[0].split('fedselect/')[-1]}:{func[1]} {func[2]}"
        ms, share = 1e3 * own[func] / rounds, 100 * own[func] / total
        print(f"| {name} | {calls[func] / rounds:.0f} | {ms:.2f} | {share:.1f} % |")
    shares: dict[str, float] = defaultdict(float)
    for func, seconds in own.items():
        shares[_group(func)] += seconds / total
    print("| group | share of CPU time |\n|---|---|")
    for group, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"| {group} | {100 * share:.1f} % |")
    if tprof is not None:
        events = tprof.key_averages(group_by_input_shape=True)
        op_total = sum(e.self_cpu_time_total for e in events)
        print("| torch operator | input shapes | calls/round | share of operator time |\n|---|---|---|---|")
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
            share = 100 * e.self_cpu_time_total / op_total
            print(f"| {e.key} | {e.input_shapes} | {e.count / rounds:.0f} | {share:.1f} % |")
    return dict(shares)
