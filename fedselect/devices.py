"""The devices fedselect trains on: which this machine has, and what a name such as ``"auto"`` means here.

A leaf module (it imports only torch and :mod:`fedselect._validation`), filed low so that the engine, the
trainer, the selectors that compute on a device (FedCor's GP) and Flower's client helpers all check a
``device`` parameter by the same rule (:data:`DEVICE_CONSTRAINTS`) and record it the same way
(:func:`device_setting`).
"""

from __future__ import annotations

from typing import Any

import torch

from ._validation import InstanceOf

__all__ = ["DEVICE_CONSTRAINTS", "available_devices", "device_setting", "resolve_device"]


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def available_devices() -> list[str]:
    """The device names this machine can train on: ``"cpu"``, ``"auto"``, and ``"cuda"``, ``"cuda:N"`` and
    ``"mps"`` where torch sees such a device."""
    out = ["cpu", "auto"]
    if torch.cuda.is_available():
        out += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if _mps_available():
        out.append("mps")
    return out


def _why_not(kind: str) -> str:
    if kind == "cuda":
        if torch.version.cuda is None:
            return f"this torch ({torch.__version__}) was built without CUDA"
        return "torch sees no CUDA GPU (check CUDA_VISIBLE_DEVICES and the driver)"
    return "torch sees no Apple GPU (MPS needs macOS on Apple silicon)"


def resolve_device(device: str | torch.device = "cpu") -> torch.device:
    """The torch device that ``device`` names on this machine, checked to exist.

    Parameters
    ----------
    device : str or torch.device, default "cpu"
        ``"cpu"``, ``"cuda"`` (the current CUDA GPU), ``"cuda:N"``, ``"mps"`` (Apple GPUs), a
        :class:`torch.device` of one of those kinds, or ``"auto"``: CUDA if torch sees a CUDA GPU,
        else MPS if it sees one, else the CPU.

    Returns
    -------
    torch.device
        With its index for a GPU (``cuda:0``, ``mps:0``), as tensors on it report their device.

    Raises
    ------
    ValueError
        A device this machine does not have (the message says what it has and why not), or a
        kind of device fedselect does not train on.
    TypeError
        ``device`` is neither a string nor a torch.device.
    """
    if isinstance(device, str) and device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps", 0) if _mps_available() else torch.device("cpu")
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(
                f"device={device!r} is not a device name; use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto' "
                f"(available here: {', '.join(map(repr, available_devices()))})"
            ) from exc
    else:
        raise TypeError(f"device={device!r} must be a device name (str) or a torch.device, not {type(device).__name__}")
    have = ", ".join(map(repr, available_devices()))
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} is not available: {_why_not('cuda')}; available here: {have}")
        n = torch.cuda.device_count()
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if not 0 <= index < n:
            raise ValueError(
                f"device={device!r} is not available: torch sees {n} CUDA GPU(s), "
                f"cuda:0 to cuda:{n - 1}; available here: {have}"
            )
        return torch.device("cuda", index)
    if dev.type == "mps":
        if not _mps_available():
            raise ValueError(f"device={device!r} is not available: {_why_not('mps')}; available here: {have}")
        return torch.device("mps", 0)
    raise ValueError(
        f"device={device!r}: fedselect trains on 'cpu', 'cuda', 'cuda:N' or 'mps' devices, not "
        f"{dev.type!r}; available here: {have}"
    )


def device_setting(device: str | torch.device) -> str:
    """``device`` as a run's settings record it, after checking it (:func:`resolve_device`).

    ``"auto"`` becomes the kind of device it chose here (``"cpu"``, ``"cuda"``, ``"mps"``), so a
    record says which kind of machine ran; every form of the CPU (``"cpu:0"``,
    ``torch.device("cpu")``) is ``"cpu"``; a torch.device is its name; another name is kept as given.
    """
    resolved = resolve_device(device)
    if (isinstance(device, str) and device == "auto") or resolved.type == "cpu":
        return resolved.type
    return str(device)


class _Device(InstanceOf):
    """A device name or torch.device that :func:`resolve_device` accepts on this machine."""

    def is_satisfied_by(self, value: Any) -> bool:
        if not super().is_satisfied_by(value):
            return False
        try:
            resolve_device(value)
        except (TypeError, ValueError):
            return False
        return True

    def __str__(self) -> str:
        if self.type is not str:
            return "a torch.device of those kinds"
        have = [d for d in available_devices() if not d.startswith("cuda:")]
        if torch.cuda.is_available():
            have.append(f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        lacking = [
            f"no {kind}: {_why_not(kind)}"
            for kind, there in (("cuda", torch.cuda.is_available()), ("mps", _mps_available()))
            if not there
        ]
        return f"one of the devices this machine has ({', '.join(have)}{''.join('; ' + x for x in lacking)})"

    def invalid_examples(self) -> list[Any]:
        out: list[Any] = ["tpu", "meta", "cuda:x", "", 0, None, torch.device("meta")]
        if not torch.cuda.is_available():
            out += ["cuda", "cuda:0", torch.device("cuda")]
        if not _mps_available():
            out.append("mps")
        return out


DEVICE_CONSTRAINTS: list[Any] = [_Device(str), _Device(torch.device)]
"""The declared constraint of a ``device`` parameter (:mod:`fedselect._validation`): a name or a
torch.device of a device this machine has, checked by :func:`resolve_device`."""
