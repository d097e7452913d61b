"""Kept importable: the record of a run lives beside the round, in :mod:`fedselect.round.record`."""

from __future__ import annotations

from ..round.record import History, RoundRecord, Traffic

__all__ = ["History", "RoundRecord", "Traffic"]
