"""What a system-aware selector knows of each client's round time: observed durations, else declared ones."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..clock import BYTES_PER_FLOAT
from ..profiles import SystemProfiles
from ..selection import ClientOracle, ClientPool, RoundFeedback, check_client_ids

__all__ = ["DurationKnowledge", "declared_durations"]


def declared_durations(
    profiles: SystemProfiles, n_samples: np.ndarray, samples_per_round: int | None, n_parameters: int
) -> np.ndarray:
    """Each client's expected round time from declared profiles, as FedScale registers clients.

    ``profiles.round_time`` with one float32 model down and one up (4 bytes per parameter) and
    ``samples_per_round`` training samples (``n_k``, one local epoch, when None).
    """
    samples = n_samples if samples_per_round is None else np.full(n_samples.size, samples_per_round)
    size = float(BYTES_PER_FLOAT * n_parameters)
    return np.asarray(profiles.round_time(np.arange(n_samples.size), size, size, samples), dtype=np.float64)


class DurationKnowledge:
    """Mixin for selectors with a ``profiles`` parameter and a per-client ``duration_`` (NaN: unknown).

    ``duration_[k]`` is the latest duration the server observed for client k (``feedback.durations``),
    else, once the global model's size is known, its declared one (:func:`declared_durations` of
    ``profiles`` with ``samples_per_round``), else NaN. Observed durations always win over declared ones.

    A client the server stopped waiting for (``feedback.timed_out``) is a censored observation:
    its duration is at least ``timed_out_after``. ``duration_[k]`` becomes the larger of that bound
    and what was known (the bound when nothing was), and ``censored_[k]`` says the value is a
    lower bound, until a reply gives a duration again.
    """

    profiles: SystemProfiles | None
    samples_per_round: int | None
    n_samples_: np.ndarray
    n_clients_: int
    duration_: np.ndarray
    censored_: np.ndarray
    declared_: bool

    def identifying_params(self) -> dict[str, Any]:
        """As :meth:`BaseSelector.identifying_params`, with ``profiles`` by its content's fingerprint."""
        params = super().identifying_params()  # type: ignore[misc]
        if params.get("profiles") is not None:
            params["profiles"] = f"SystemProfiles:{params['profiles'].fingerprint()}"
        return params

    def _start_durations(self, pool: ClientPool) -> None:
        """Check ``profiles`` against the pool and forget every duration (all unknown, none declared)."""
        if self.profiles is not None and self.profiles.n_clients != pool.n_clients:
            raise ValueError(
                f"{type(self).__name__}: parameter profiles describes {self.profiles.n_clients} clients but the "
                f"federation has {pool.n_clients}; expected one profile per client"
            )
        self.duration_ = np.full(pool.n_clients, np.nan)
        self.censored_ = np.zeros(pool.n_clients, dtype=bool)
        self.declared_ = False

    def _declare_durations(self, oracle: ClientOracle) -> None:
        """Fill the unknown durations from ``profiles``, once (the model's size comes from the oracle)."""
        if self.profiles is not None and not self.declared_:
            n_parameters = int(np.asarray(oracle.global_parameters()).size)
            declared = declared_durations(self.profiles, self.n_samples_, self.samples_per_round, n_parameters)
            self.duration_ = np.where(np.isnan(self.duration_), declared, self.duration_)
            self.declared_ = True

    def _ensure_censored(self) -> np.ndarray:
        """``censored_``, made (all False) for a selector restored from a checkpoint written before it existed."""
        if not hasattr(self, "censored_"):
            self.censored_ = np.zeros(self.duration_.size, dtype=bool)
        return self.censored_

    def _timed_out_ids(self, feedback: RoundFeedback) -> np.ndarray:
        """The feedback's ``timed_out`` clients, checked against the pool (before ``update`` writes anything)."""
        if feedback.timed_out is None or not feedback.timed_out.size:
            return np.zeros(0, dtype=np.int64)
        return check_client_ids(feedback.timed_out, self.n_clients_, what=f"{type(self).__name__}.update (timed_out)")

    def _observe_durations(self, feedback: RoundFeedback, ids: np.ndarray, late: np.ndarray) -> None:
        """Record the durations the server measured for the reporters ``ids`` and the lower bounds of the
        clients ``late`` it stopped waiting for (:meth:`_timed_out_ids`), when the feedback has them."""
        self._ensure_censored()
        if feedback.durations is not None:
            self.duration_[ids] = np.asarray(feedback.durations, dtype=np.float64)
            self.censored_[ids] = False
        if not late.size or feedback.timed_out_after is None:
            return
        bound = np.asarray(feedback.timed_out_after, dtype=np.float64)
        known = self.duration_[late]
        raise_to = np.isnan(known) | (bound >= known)  # the bound says more than what was known
        self.duration_[late[raise_to]] = bound[raise_to]
        self.censored_[late[raise_to]] = True
