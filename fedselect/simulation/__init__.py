"""The simulator: batched local training, the paid oracle, per-round history."""

from .checkpoint import (
    CheckpointMismatchError,
    CorruptFileWarning,
    LegacyCheckpointError,
    UnsafeStateError,
    UntrustedCheckpointError,
)
from .costs import Costs
from .engine import Engine, LocalSchedule, aggregate_buffers
from .history import History, RoundRecord
from .models import FedCorCNN, FedCorMLP, LogisticRegression, build_model
from .trainer import DivergenceError, FederatedTrainer, SimulationOracle, lr_at

__all__ = [
    "CheckpointMismatchError",
    "CorruptFileWarning",
    "DivergenceError",
    "Costs",
    "Engine",
    "FedCorCNN",
    "FedCorMLP",
    "FederatedTrainer",
    "History",
    "LegacyCheckpointError",
    "LocalSchedule",
    "LogisticRegression",
    "RoundRecord",
    "SimulationOracle",
    "UnsafeStateError",
    "UntrustedCheckpointError",
    "aggregate_buffers",
    "build_model",
    "lr_at",
]
