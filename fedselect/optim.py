"""The clients' local optimiser as one settings object.

A client trains with SGD from the global model :math:`w^t`; one step on a mini-batch gradient
:math:`g` is (PyTorch's ``torch.optim.SGD`` with dampening 0, plus FedProx's proximal term)

.. math::

    d = g + \\lambda w + \\mu (w - w^t), \\qquad
    v \\leftarrow m v + d, \\qquad
    w \\leftarrow w - \\eta \\, (d + m v \\text{ if Nesterov else } v),

with :math:`v = 0` at the start of local training and :math:`m = 0` giving plain SGD
(Li et al., *Federated Optimization in Heterogeneous Networks*, MLSys 2020, eq. 2, for
:math:`\\mu`). The five numbers travel together from the trainer (or Flower's client app) to
every computing path of the engine; :class:`LocalSGD` carries them as one value, checked once.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from numbers import Real
from typing import Any, ClassVar

from ._validation import Interval, InvalidParameterError, outside_stacklevel, validate_parameters

__all__ = ["LocalSGD", "OPTIMIZER_KEYS", "as_optimizer", "flat_settings", "resolve_optimizer"]

#: The flat keyword names each field of :class:`LocalSGD` had (and keeps, for a deprecation
#: period) on :class:`~fedselect.FederatedTrainer`; stored run keys use these names.
OPTIMIZER_KEYS: tuple[str, ...] = ("lr", "momentum", "nesterov", "weight_decay", "prox_mu")


@dataclass(frozen=True)
class LocalSGD:
    """Local SGD settings: step size, momentum, Nesterov, weight decay and FedProx's mu.

    One step on a mini-batch gradient ``g`` at parameters ``w`` started from the global model
    ``w^t`` is ``d = g + weight_decay * w + prox_mu * (w - w^t)``; with momentum ``m > 0``,
    ``v <- m v + d`` and the step uses ``d + m v`` (Nesterov) or ``v``; ``w <- w - lr * step``.
    This is ``torch.optim.SGD(lr, momentum, weight_decay, nesterov)`` with dampening 0, plus
    FedProx's proximal term (Li et al., MLSys 2020, eq. 2). A learning-rate schedule over rounds
    (the trainer's ``lr_schedule``) multiplies ``lr``.

    Parameters
    ----------
    lr : float, default 0.05
        Step size, > 0.
    momentum : float, default 0.0
        Heavy-ball momentum in [0, 1); the velocity starts at zero every local training.
    nesterov : bool, default False
        Nesterov's look-ahead; needs ``momentum > 0``.
    weight_decay : float, default 0.0
        L2 coefficient added to the gradient, >= 0.
    prox_mu : float, default 0.0
        FedProx's proximal coefficient, >= 0 (0 is FedAvg's local SGD).

    Raises
    ------
    fedselect.InvalidParameterError
        When a value is out of range, or ``nesterov`` is set without momentum.

    Examples
    --------
    >>> from fedselect import LocalSGD
    >>> LocalSGD(lr=0.1, momentum=0.9)
    LocalSGD(lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0, prox_mu=0.0)
    >>> LocalSGD(lr=0.1).with_lr(0.05).lr
    0.05
    """

    lr: float = 0.05
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    prox_mu: float = 0.0

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "lr": [Interval(Real, 0, None, closed="neither")],
        "momentum": [Interval(Real, 0, 1, closed="left")],
        "nesterov": ["boolean"],
        "weight_decay": [Interval(Real, 0, None, closed="left")],
        "prox_mu": [Interval(Real, 0, None, closed="left")],
    }

    def __post_init__(self) -> None:
        validate_parameters(self, asdict(self), self._parameter_constraints)
        if self.nesterov and not self.momentum:
            raise InvalidParameterError("LocalSGD: nesterov=True needs momentum > 0; got momentum=0.")

    def with_lr(self, lr: float) -> LocalSGD:
        """The same settings with another step size (a scheduled round's)."""
        return replace(self, lr=lr)

    def to_dict(self) -> dict[str, Any]:
        """The settings as the flat ``{name: value}`` mapping stored run keys use."""
        return {k: getattr(self, k) for k in OPTIMIZER_KEYS}


def resolve_optimizer(owner: Any, optimizer: LocalSGD | None, flat: Mapping[str, Any]) -> LocalSGD:
    """The local optimiser an estimator's parameters give: ``optimizer`` or its flat keywords, never both.

    ``flat`` holds the deprecated flat keywords (:data:`OPTIMIZER_KEYS`) as the owner has them. With
    ``optimizer`` given, every flat keyword must be at its default (else an error naming both); without it,
    a flat keyword away from its default warns (``DeprecationWarning``, attributed to the caller outside
    fedselect, so a script sees it and the command line does not; they keep working for a deprecation
    period) and the settings are built from them.
    """
    name = owner if isinstance(owner, str) else type(owner).__name__
    default = LocalSGD().to_dict()
    changed = {k: v for k, v in flat.items() if k in default and v != default[k]}
    if optimizer is not None:
        if changed:
            given = ", ".join(f"{k}={v!r}" for k, v in changed.items())
            raise InvalidParameterError(
                f"{name}: optimizer={optimizer!r} and the flat keyword(s) {given} are both set; give the local "
                "optimiser's settings once, in optimizer=LocalSGD(...)"
            )
        return optimizer
    if changed:
        given = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        warnings.warn(
            f"{name}: the flat optimiser keywords ({given}) are deprecated and will be removed in fedselect 1.0; "
            f"pass optimizer=LocalSGD({given}) instead (fedselect.LocalSGD)",
            DeprecationWarning,
            stacklevel=outside_stacklevel(),
        )
    return LocalSGD(**{k: flat.get(k, default[k]) for k in OPTIMIZER_KEYS})


def flat_settings(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with an ``optimizer`` entry written back as the flat keywords its fields away from their
    defaults are (what run keys and recorded settings hold): ``LocalSGD(lr=0.1)`` is ``lr=0.1`` in a trainer's
    identity and settings (which hold every flat key) and in a comparison's run key (which holds the keys
    given, so an explicit ``lr=0.05``, the default, is a key of its own however it is spelled)."""
    out = {k: v for k, v in params.items() if k != "optimizer"}
    opt = params.get("optimizer")
    if isinstance(opt, LocalSGD):
        default = LocalSGD().to_dict()
        out.update({k: v for k, v in opt.to_dict().items() if v != default[k]})
    return out


def as_optimizer(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Trainer keywords in a settings mapping (a preset's, the command line's, a comparison's), with their flat
    optimiser keys gathered into ``optimizer=LocalSGD(...)``: how fedselect's own code builds a trainer from
    settings that store the flat keys (run keys and recorded settings keep them)."""
    out = {k: v for k, v in kwargs.items() if k not in OPTIMIZER_KEYS}
    flat = {k: kwargs[k] for k in OPTIMIZER_KEYS if k in kwargs}
    if flat and out.get("optimizer") is None:
        out["optimizer"] = LocalSGD(**flat)
    elif flat:
        out.update(flat)  # both spelled: the trainer refuses it with the message naming both
    return out
