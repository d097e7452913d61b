"""What every oracle query and every round cost (the class lives in :mod:`fedselect.ledger`)."""

from __future__ import annotations

from ..ledger import Costs

__all__ = ["Costs"]
