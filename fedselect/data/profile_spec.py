"""Client devices as ``make_federation(profiles=...)`` takes them: the forms, what each resolves to, how it is recorded.

A federation's clients may carry :class:`~fedselect.profiles.SystemProfiles` (compute speed,
bandwidth, latency, availability). :func:`resolve_profiles` turns what a user gives (a kind, a
mapping of generator parameters, a profiles file or a SystemProfiles) into them, with a random
stream of their own; :func:`describe_profiles` writes the given form as plain JSON for a run's
metadata; :data:`PROFILES_CONSTRAINTS` declares the forms for parameter validation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from numbers import Integral
from typing import Any

import numpy as np

from .._validation import InstanceOf, Predicate
from ..profiles import SystemProfiles, homogeneous, sample_profiles

__all__ = ["PROFILES_CONSTRAINTS", "PROFILE_KINDS", "describe_profiles", "resolve_profiles"]

PROFILE_KINDS = ("homogeneous", "mobile")
"""The named device profiles ``make_federation(profiles=...)`` builds (see :func:`resolve_profiles`)."""

_PROFILE_FILES = (".npz", ".json")
_PROFILES_STREAM = 0x70726F66  # "prof": the tag of the profiles' own random stream, apart from the data's


def _is_system_profiles(value: Any) -> bool:
    return isinstance(value, SystemProfiles)


def _profiles_seed(random_state: Any) -> Any:
    """The random state the ``"mobile"`` devices are drawn with, for the federation's ``random_state``.

    An int seed s gives ``SeedSequence((s, 0x70726F66))``'s first 32-bit word: a stream of its own,
    so the devices do not depend on the draws of the partition (which uses ``RandomState(s)``).
    A RandomState is used as it is (after the data were drawn from it); None draws unseeded.
    """
    if isinstance(random_state, Integral) and not isinstance(random_state, bool):
        return int(np.random.SeedSequence((int(random_state), _PROFILES_STREAM)).generate_state(1)[0])
    return random_state


def _profiles_error(spec: Any, why: str, *, forms: bool = False) -> ValueError:
    """The one shape of a profiles error; ``forms`` adds what ``profiles`` may be."""
    text = f"make_federation: profiles={spec!r:.80} is invalid: {why.rstrip('.')}"
    if forms:
        text += (
            f". Expected None, one of {PROFILE_KINDS}, the path of a profiles file ({' or '.join(_PROFILE_FILES)}, "
            "written by SystemProfiles.save), a mapping {'kind': 'homogeneous' or 'mobile', <parameter>: <value>, "
            "...} or a fedselect.profiles.SystemProfiles"
        )
    return ValueError(text)


def resolve_profiles(spec: Any, n_clients: int, random_state: Any = None) -> SystemProfiles | None:
    """The :class:`~fedselect.profiles.SystemProfiles` that ``make_federation(profiles=spec)`` gives its clients.

    Parameters
    ----------
    spec : None, str, path, mapping or SystemProfiles
        What :func:`make_federation`'s ``profiles`` takes:

        * None: no profiles (homogeneous, always-available devices; no clock unless the
          trainer's ``clock=True``);
        * ``"homogeneous"``: :func:`fedselect.profiles.homogeneous` at its defaults, every
          client the median device of ``"mobile"`` (a forward pass of 4.53 ms per sample,
          780,800 bytes/s both ways, no latency, always online);
        * ``"mobile"``: :func:`fedselect.profiles.sample_profiles` at its defaults: log-normal
          compute (FedScale's ``get_completion_time_lognormal``: median 4.53 ms per forward
          pass, sigma 0.6) and bandwidth (matched to a reading of FedScale's
          ``client_device_capacity`` trace: median 6,100 kbit/s, sigma 1.1), no latency, always
          online; ``docs/profiles.rst`` states every source. Drawn with a random stream of its
          own derived from ``random_state`` (an int seed s: ``SeedSequence((s, 0x70726F66))``),
          so each seed of a comparison gets its own devices, independent of its partition;
        * a mapping ``{"kind": "homogeneous" or "mobile", **params}``: that generator with
          ``params`` (its keyword parameters, e.g. ``{"kind": "mobile", "mean_online": 3600}``
          for on/off availability; ``"random_state"`` fixes the devices whatever the
          federation's seed);
        * a path (str or os.PathLike) ending ``.npz`` or ``.json``: a file written by
          :meth:`SystemProfiles.save <fedselect.profiles.SystemProfiles.save>`, read with
          :meth:`~fedselect.profiles.SystemProfiles.load` (never unpickled); it must hold
          ``n_clients`` clients;
        * a :class:`~fedselect.profiles.SystemProfiles` of ``n_clients`` clients, used as is.
    n_clients : int
        The federation's number of clients.
    random_state : int, RandomState instance or None
        The federation's seed (used by ``"mobile"`` only).

    Returns
    -------
    SystemProfiles or None

    Raises
    ------
    ValueError
        An unknown kind or parameter, a bad value, a file that is missing or not a profiles
        file, or profiles of another number of clients; the message names the spec.

    Examples
    --------
    >>> resolve_profiles("mobile", 5, random_state=0) == resolve_profiles("mobile", 5, random_state=0)
    True
    >>> resolve_profiles({"kind": "homogeneous", "latency": 0.1}, 3).latency.tolist()
    [0.1, 0.1, 0.1]
    """
    if spec is None:
        return None
    if isinstance(spec, SystemProfiles):
        profiles = spec
    elif isinstance(spec, Mapping) or (isinstance(spec, str) and spec in PROFILE_KINDS):
        params = {"kind": spec} if isinstance(spec, str) else dict(spec)
        kind = params.pop("kind", None)
        if kind not in PROFILE_KINDS:
            raise _profiles_error(spec, f"its 'kind' is {kind!r}, not one of {PROFILE_KINDS}", forms=True)
        make = homogeneous if kind == "homogeneous" else sample_profiles
        import inspect

        allowed = [p for p in inspect.signature(make).parameters if p != "n_clients"]
        unknown = sorted(str(k) for k in params if k not in allowed)
        if unknown:
            raise _profiles_error(spec, f"{kind!r} takes the parameters {allowed}, not {unknown}")
        if kind == "mobile":
            params.setdefault("random_state", _profiles_seed(random_state))
        try:
            profiles = make(int(n_clients), **params)
        except (TypeError, ValueError) as exc:
            raise _profiles_error(spec, str(exc)) from exc
    elif isinstance(spec, str | os.PathLike):
        path = os.fspath(spec)
        if not isinstance(path, str) or not path.endswith(_PROFILE_FILES):
            raise _profiles_error(
                spec, f"it is neither a kind nor a file name ending {' or '.join(_PROFILE_FILES)}", forms=True
            )
        if not os.path.isfile(path):
            raise _profiles_error(spec, f"there is no file {path}")
        try:
            profiles = SystemProfiles.load(path)
        except (OSError, ValueError) as exc:
            raise _profiles_error(spec, str(exc)) from exc
    else:
        raise _profiles_error(spec, f"a value of type {type(spec).__name__} is none of the forms it takes", forms=True)
    if profiles.n_clients != int(n_clients):
        raise _profiles_error(spec, f"it describes {profiles.n_clients} clients but the federation has {n_clients}")
    return profiles


def describe_profiles(spec: Any) -> Any:
    """``make_federation``'s ``profiles`` as plain JSON, for a run's metadata and settings (None: not set).

    A kind as its name, a path as a string, a mapping as a dict, a SystemProfiles object as
    ``"SystemProfiles"``; what identifies the content is its fingerprint, recorded beside it.
    """
    if spec is None or isinstance(spec, str):
        return spec
    if isinstance(spec, os.PathLike):
        return os.fspath(spec)
    if isinstance(spec, Mapping):
        return {
            str(k): (v if isinstance(v, bool | int | float | str) or v is None else repr(v)) for k, v in spec.items()
        }
    return type(spec).__name__


PROFILES_CONSTRAINTS: list[Any] = [
    None,
    InstanceOf(str, f"one of {PROFILE_KINDS} or a .npz / .json profiles file"),
    InstanceOf(os.PathLike, "a path"),
    InstanceOf(Mapping, "a mapping {'kind': ..., parameter: value}"),
    Predicate(_is_system_profiles, "a fedselect.profiles.SystemProfiles", examples=[1.5, object()]),
]
"""What ``make_federation``'s ``profiles`` may be, as :func:`fedselect._validation.validate_parameters` reads it."""
