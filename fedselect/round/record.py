"""The record of a run (simulated or on Flower): one :class:`RoundRecord` per round, beside the round that makes it,
with helpers and exports. :mod:`fedselect.simulation.history` re-exports it."""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..ledger import Costs

__all__ = ["History", "RoundRecord", "Traffic"]


@dataclass
class Traffic:
    """Messages and serialised bytes of one kind of exchange on the wire (down: server to clients)."""

    messages_down: int = 0
    bytes_down: int = 0
    messages_up: int = 0
    bytes_up: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class RoundRecord:
    """What happened in round ``round`` (rounds start at 0), in any world: the simulator, a Flower run, the
    synthetic test oracle (:func:`fedselect.round.play_round` writes it).

    Attributes
    ----------
    round : int
    clients : list of int
        The distinct clients chosen (those in ``failed`` did not report).
    weights : list of float
        The aggregation weight each client's delta received (the simulator: one per chosen
        client, 0 for those that failed; a Flower run: one per reporting client).
    lr : float or None
        The local learning rate of the round (None where the server does not set it: Flower).
    test_accuracy, test_loss : float or None
        Of the aggregated model w^{t+1}; None in rounds that were not evaluated.
    global_loss : float or None
        sum_k p_k l_k(w^{t+1}) when the trainer tracks it.
    costs : Costs
        Everything the round cost, oracle queries included.
    failed : list of int
        The chosen clients that did not report (client failures; their weight is 0). A
        Flower run lists every client that failed a query or a train message this round.
    seconds : float
        Wall-clock time of the round (excluded from equality and repr).
    reported : list of int or None
        The chosen clients whose update was aggregated, where a runtime records it (Flower).
    traffic : dict of str to Traffic
        Messages and bytes on the wire per kind of exchange (Flower: ``hello``, ``loss``,
        ``update``, ``trial``, ``train``, ``evaluate``); empty in simulation.
    rejected : dict of int to str
        Clients whose reply the server refused this round, with the reason.
    errors : list of str
        What went wrong this round and was contained (a selector's exception fed by clients'
        answers, a non-finite aggregate).
    evaluation : dict of str to float
        A centralised evaluation after the round (Flower's ``start(evaluate_fn=...)``), if any.
    wall_seconds : float or None
        Measured seconds the round waited on its clients (Flower: each exchange of the round's
        oracle questions and training, from sending to the last reply or the timeout, summed);
        None where nothing was measured (simulation). Excluded from equality and repr.
    reply_seconds : dict of int to float
        Measured seconds from sending each client its training message to its reply, for the
        clients whose training reply was used (Flower); empty in simulation. Excluded from
        equality and repr.
    sim_seconds : float or None
        Simulated seconds the round lasted, its critical path on the simulator's clock
        (:mod:`fedselect.clock`); None when no clock ran.
    sim_time : float or None
        Simulated time at the end of the round (the sum of the rounds' ``sim_seconds`` plus
        any wait for a client to come online); None when no clock ran.

    Notes
    -----
    :meth:`to_dict` writes the last nine fields only when set, so the records of a run
    without a clock (and the result files and digests made of them) are what they always were.
    """

    round: int
    clients: list[int]
    weights: list[float] = field(default_factory=list)
    lr: float | None = None
    test_accuracy: float | None = None
    test_loss: float | None = None
    global_loss: float | None = None
    costs: Costs = field(default_factory=Costs)
    failed: list[int] = field(default_factory=list)
    seconds: float = field(default=0.0, compare=False, repr=False)
    reported: list[int] | None = None
    traffic: dict[str, Traffic] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    evaluation: dict[str, float] = field(default_factory=dict)
    wall_seconds: float | None = field(default=None, compare=False, repr=False)
    reply_seconds: dict[int, float] = field(default_factory=dict, compare=False, repr=False)
    sim_seconds: float | None = None
    sim_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "round": self.round,
            "clients": list(self.clients),
            "weights": list(self.weights),
            "lr": self.lr,
            "test_accuracy": self.test_accuracy,
            "test_loss": self.test_loss,
            "global_loss": self.global_loss,
            "costs": self.costs.to_dict(),
            "failed": list(self.failed),
            "seconds": self.seconds,
        }
        out.update(self._optional_dict())
        return out

    def _optional_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.reported is not None:
            out["reported"] = list(self.reported)
        if self.traffic:
            out["traffic"] = {k: v.to_dict() for k, v in self.traffic.items()}
        if self.rejected:
            out["rejected"] = {str(k): v for k, v in self.rejected.items()}
        if self.errors:
            out["errors"] = list(self.errors)
        if self.evaluation:
            out["evaluation"] = dict(self.evaluation)
        if self.wall_seconds is not None:
            out["wall_seconds"] = float(self.wall_seconds)
        if self.reply_seconds:
            out["reply_seconds"] = {str(k): float(v) for k, v in self.reply_seconds.items()}
        if self.sim_seconds is not None:
            out["sim_seconds"] = float(self.sim_seconds)
        if self.sim_time is not None:
            out["sim_time"] = float(self.sim_time)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RoundRecord:
        d = dict(d)
        if "test_accuracy" not in d and isinstance(d.get("evaluation"), dict):  # a Flower run's records_path line
            ev = d["evaluation"]
            d["test_accuracy"] = ev.get("test-accuracy", ev.get("accuracy"))
            d["test_loss"] = ev.get("test-loss", ev.get("loss"))
        d["costs"] = Costs(**d.get("costs", {}))
        if "traffic" in d:
            d["traffic"] = {str(k): Traffic(**v) for k, v in d["traffic"].items()}
        if "rejected" in d:
            d["rejected"] = {int(k): str(v) for k, v in d["rejected"].items()}
        if "reply_seconds" in d:
            d["reply_seconds"] = {int(k): float(v) for k, v in d["reply_seconds"].items()}
        return cls(**d)


@dataclass
class History:
    """The rounds of one run and what a reader asks of them.

    Attributes
    ----------
    rounds : list of RoundRecord
    model_size : int
        D, floats in one model (to convert model transfers into floats).
    config : dict
        The trainer's and selector's parameters and the federation's description.
    """

    rounds: list[RoundRecord] = field(default_factory=list)
    model_size: int = 0
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.rounds)

    def __repr__(self) -> str:
        acc = self.final_accuracy()
        acc_s = "n/a" if acc is None else f"{acc:.4f}"
        return f"History(rounds={len(self.rounds)}, final_accuracy={acc_s}, model_size={self.model_size})"

    # -- questions ------------------------------------------------------------------
    def accuracies(self) -> list[tuple[int, float]]:
        """(round, test accuracy) of every evaluated round."""
        return [(r.round, r.test_accuracy) for r in self.rounds if r.test_accuracy is not None]

    def rounds_to_accuracy(self, target: float) -> int | None:
        """t + 1 for the first round t whose test accuracy is at least ``target``, or None."""
        for r in self.rounds:
            if r.test_accuracy is not None and r.test_accuracy >= target:
                return r.round + 1
        return None

    def time_to_accuracy(self, target: float) -> float | None:
        """Simulated seconds (``sim_time``) at the end of the first round whose test accuracy is at least
        ``target``; None if it is never reached or the run kept no clock."""
        for r in self.rounds:
            if r.test_accuracy is not None and r.test_accuracy >= target:
                return None if r.sim_time is None else float(r.sim_time)
        return None

    def rounds_trained_nobody(self) -> int:
        """The rounds in which no chosen client reported (every one ``failed``): they trained nobody."""
        return sum(1 for r in self.rounds if len(r.failed) >= len(r.clients))

    def final_accuracy(self) -> float | None:
        acc = self.accuracies()
        return acc[-1][1] if acc else None

    def best_accuracy(self) -> float | None:
        acc = self.accuracies()
        return max(a for _, a in acc) if acc else None

    def total_costs(self, up_to_round: int | None = None) -> Costs:
        """Costs summed over rounds 0..``up_to_round - 1`` (all rounds by default)."""
        total = Costs()
        for r in self.rounds:
            if up_to_round is not None and r.round >= up_to_round:
                break
            total += r.costs
        return total

    def costs_to_accuracy(self, target: float) -> Costs | None:
        """Costs paid until ``target`` was first reached (inclusive), or None if never."""
        n = self.rounds_to_accuracy(target)
        return None if n is None else self.total_costs(n)

    def convergent_round(self, tolerance: float = 0.01, window: int = 10) -> int | None:
        """FedLDCS's "convergent round": the first t whose accuracy stays within ``tolerance`` of
        itself over rounds t..t+window-1 and stays so to the end (None if never)."""
        acc = self.accuracies()
        if len(acc) < window:
            return None
        vals = [a for _, a in acc]
        stable_from = None
        for i in range(len(vals) - window + 1):
            seg = vals[i : i + window]
            ok = max(seg) - min(seg) <= tolerance
            if ok and stable_from is None:
                stable_from = i
            elif not ok:
                stable_from = None
        return None if stable_from is None else acc[stable_from][0]

    def selection_counts(self, n_clients: int) -> list[int]:
        """How often each client trained."""
        counts = [0] * n_clients
        for r in self.rounds:
            for k in r.clients:
                counts[k] += 1
        return counts

    # -- export ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"model_size": self.model_size, "config": self.config, "rounds": [r.to_dict() for r in self.rounds]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        return cls([RoundRecord.from_dict(r) for r in d["rounds"]], d.get("model_size", 0), d.get("config", {}))

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """Serialise to JSON (and write it to ``path`` if given)."""
        text = json.dumps(self.to_dict(), default=_jsonable)
        if path is not None:
            with open(path, "w") as fh:
                fh.write(text)
        return text

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike[str]) -> History:
        s = str(path_or_text)
        if not s.lstrip().startswith("{"):
            with open(s) as fh:
                s = fh.read()
        return cls.from_dict(json.loads(s))

    def to_csv(self, path: str | os.PathLike[str]) -> None:
        """One row per round: scalars, the chosen clients, costs, and the failed clients, ids ``;``-joined;
        then ``sim_seconds`` and ``sim_time`` when a clock ran."""
        cost_keys = list(Costs().to_dict())
        clocked = any(r.sim_time is not None for r in self.rounds)
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["round", "test_accuracy", "test_loss", "global_loss", "lr", "seconds", "clients", *cost_keys,
                        "failed", *(("sim_seconds", "sim_time") if clocked else ())])
            for r in self.rounds:
                c = r.costs.to_dict()
                w.writerow(
                    [r.round, r.test_accuracy, r.test_loss, r.global_loss, r.lr, f"{r.seconds:.4f}",
                     ";".join(map(str, r.clients)), *(c[k] for k in cost_keys), ";".join(map(str, r.failed)),
                     *((r.sim_seconds, r.sim_time) if clocked else ())]
                )


def _jsonable(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return repr(obj)
