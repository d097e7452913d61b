"""Where fedselect's round of ``bench_peers``' MLP job spends its time (``bench_peers --profile``).

The MLP job (Fashion-MNIST, 100 clients of 2 label shards, 10 a round, MLP 784-200-200-10, one epoch
of batch 50, lr 0.05, the mean) through ``FederatedTrainer(selector="random", n_threads=1)``, with
``torch.profiler`` recording CPU operators from the end of the warm-up round to the end of the
last timed round (the final round, which evaluates the test set, is outside the window). Printed:
the window's wall and CPU time per round; each operator's self time and its share of the
window's CPU time (the process's own, so that waiting for a busy core is left out); the shares
of the groups the lead decides hot-path changes by (matrix products, gathers, copies, casts,
subtractions, other operators) and the rest (Python and everything outside torch operators).
The operators' self times are measured in wall time, so on a busy machine they are inflated
too and the rest is an underestimate; run it on an idle machine for the record.
"""

from __future__ import annotations

import time
from collections import defaultdict

GROUPS = {
    "matmul": ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul", "aten::linear"),
    "gather/index": ("aten::index", "aten::index_select", "aten::gather", "aten::take", "aten::embedding"),
    "copy": ("aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::stack"),
    "cast": ("aten::_to_copy", "aten::to"),
    "subtraction": ("aten::sub", "aten::sub_", "aten::rsub"),
}


def main(
    rounds: int = 5, n_clients: int = 100, dataset: str = "fmnist", top: int = 15, shapes: bool = False
) -> dict[str, float]:
    """Profile ``rounds`` rounds after one warm-up; print the table; return the group shares."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import fedselect

    fed = fedselect.make_federation(
        dataset, partition="shards", shards_per_client=2, n_clients=n_clients, random_state=0
    )
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=shapes)
    window: list[tuple[float, float]] = []

    def callback(trainer: object, record: object) -> None:
        t = record.round  # type: ignore[attr-defined]
        if t == 0:
            window.append((time.perf_counter(), time.process_time()))
            prof.start()
        elif t == rounds:
            prof.stop()
            window.append((time.perf_counter(), time.process_time()))

    fedselect.FederatedTrainer(
        selector="random", model="mlp", model_params={"hidden": [200, 200]}, clients_per_round=10,
        rounds=rounds + 2, local_epochs=1, batch_size=50, lr=0.05, aggregation="mean", eval_every=rounds + 2,
        stop_at_target=False, random_state=0, n_threads=1, callback=callback,
    ).fit(fed)  # fmt: skip
    wall = window[1][0] - window[0][0]
    cpu_us = (window[1][1] - window[0][1]) * 1e6
    events = prof.key_averages(group_by_input_shape=shapes)
    per_round = f"per round {wall / rounds:.4f} s wall, {cpu_us / 1e6 / rounds:.4f} s CPU (profiler on)"
    print(f"profile: {rounds} rounds after 1 warm-up, {per_round}, torch {torch.__version__}, 1 thread")
    print("| operator | shapes | calls/round | self ms/round | share of CPU |\n|---|---|---|---|---|")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        self_ms, share = e.self_cpu_time_total / 1e3 / rounds, 100 * e.self_cpu_time_total / cpu_us
        print(
            f"| {e.key} | {e.input_shapes if shapes else ''} | {e.count / rounds:.0f} | {self_ms:.2f} | {share:.1f} % |"
        )
    shares: dict[str, float] = defaultdict(float)
    for e in events:
        group = next((g for g, names in GROUPS.items() if e.key in names), "other operators")
        shares[group] += e.self_cpu_time_total / cpu_us
    shares["outside operators (Python, allocation, profiler)"] = 1.0 - sum(shares.values())
    print("| group | share of CPU |\n|---|---|")
    for group, share in shares.items():
        print(f"| {group} | {100 * share:.1f} % |")
    return dict(shares)
