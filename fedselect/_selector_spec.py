"""Selectors as users give them: a name, a ``(name, params)`` pair, a class or an instance.

:class:`SelectorSpec` is one such selector, normalised: it builds a new, unfitted selector,
labels a comparison's row, and writes what identifies the scheme in saved settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._registry import get_selector_class, registry
from .identity import canonical
from .selection import BaseSelector


def _json_safe(value: Any) -> Any:
    """``value`` as plain JSON: numbers, strings, lists, dicts; functions and classes as ``module:qualname``."""
    import numpy as np

    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
        return f"{getattr(value, '__module__', '?')}:{value.__qualname__}"
    return str(canonical(value))  # random states by their state, modules by their weights


@dataclass(frozen=True)
class SelectorSpec:
    """A selector as a user gave it: see :func:`resolve_selector`.

    Attributes
    ----------
    cls : type
        The selector class.
    params : dict
        The parameters given (for an instance: all of its ``get_params()``).
    name : str or None
        The registered name it was given by, or None for a class or an instance.
    instance : BaseSelector or None
        The instance it was given as (never used itself: :meth:`build` clones it).
    """

    cls: type
    params: dict[str, Any]
    name: str | None = None
    instance: Any = None

    def build(self) -> Any:
        """A new, unfitted selector: a clone of the instance, or ``cls(**params)``."""
        if self.instance is not None:
            from sklearn.base import clone

            return clone(self.instance)
        try:
            return self.cls(**self.params)
        except TypeError as exc:
            raise TypeError(
                f"selector {self.display!r} ({self.cls.__name__}) does not accept these parameters: {exc}"
            ) from exc

    @property
    def display(self) -> str:
        """The registered name when the class is registered, else the class name."""
        if self.name is not None:
            return self.name
        for entry in registry("selectors").values():
            if entry.obj is self.cls:
                return entry.name
        return self.cls.__name__

    @property
    def label(self) -> str:
        """A row label: ``display`` plus the parameters given (for an instance, those off their defaults)."""
        params = self.params
        if self.instance is not None:
            defaults = _param_defaults(self.cls)
            params = {k: v for k, v in params.items() if k not in defaults or not _same(defaults[k], v)}
        inner = ",".join(f"{k}={v!r}" if not isinstance(v, str) else f"{k}={v}" for k, v in params.items())
        return f"{self.display}({inner})" if inner else self.display

    def settings(self) -> dict[str, Any]:
        """What identifies this scheme in a comparison's saved settings.

        A name is recorded as given, with the parameters given (``{"selector": "fedcor",
        "params": {"rank": 5}}``), as comparisons always have; a class or an instance as
        ``module:qualname`` with the built selector's ``get_params()`` made JSON-safe (without the
        parameters added after runs were recorded, at their original default: see
        :meth:`fedselect.BaseSelector.identifying_params`).

        A default that changed after runs were recorded by name would otherwise give a spec
        that relies on it the key of runs that ran the old one. A selector class lists such
        parameters in ``_recorded_defaults`` (name -> the values the recorded runs ran when they
        left it out, e.g. HCSFed's ``{"cohesion": ("pairwise-sum", "paper"), "kmeans_n_init":
        (10,)}``); for a name, a parameter given at one of those values is left out (the
        recorded runs keep their keys) and one not given is written at its current default
        (a spec that relies on the new default gets a new key).
        """
        if self.name is not None:
            return {"selector": self.name, "params": _with_recorded_defaults(self.cls, self.params)}
        return {
            "selector": f"{self.cls.__module__}:{self.cls.__qualname__}",
            "params": _json_safe(self.build().identifying_params()),
        }


def _recorded_defaults(cls: type) -> dict[str, tuple[Any, ...]]:
    """``_recorded_defaults`` merged over the class hierarchy (subclasses win): see :meth:`SelectorSpec.settings`."""
    merged: dict[str, tuple[Any, ...]] = {}
    for klass in reversed(cls.__mro__):
        merged.update(klass.__dict__.get("_recorded_defaults", {}))
    return merged


def _with_recorded_defaults(cls: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as a named spec records them: see :meth:`SelectorSpec.settings`."""
    out = dict(params)
    recorded = _recorded_defaults(cls)
    if not recorded:
        return out
    defaults = _param_defaults(cls)
    for name, old in recorded.items():
        if name in out:
            value = _json_safe(out[name])
            if any(type(value) is type(v) and value == v for v in old):
                del out[name]
        elif name in defaults and not any(_same(defaults[name], v) for v in old):
            out[name] = defaults[name]
    return out


def _param_defaults(cls: type) -> dict[str, Any]:
    import inspect

    sig = inspect.signature(cls.__init__)
    return {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:  # arrays and other objects without a truth value of ==
        return False


_SELECTOR_FORMS_HELP = (
    "a registered name (e.g. 'random'), a (name, params) pair, a BaseSelector instance, "
    "a BaseSelector subclass or a (class, params) pair"
)


def _check_param_names(cls: type, params: Mapping[str, Any], shown: str) -> None:
    allowed = cls._get_param_names()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(
            f"selector {shown!r} ({cls.__name__}) has no parameter {', '.join(map(repr, unknown))}; its parameters: "
            f"{', '.join(allowed) or '(none)'}"
        )


def as_selector_spec(spec: Any) -> SelectorSpec:
    """Normalise a selector given in any accepted form into a :class:`SelectorSpec` (see :func:`resolve_selector`)."""
    if isinstance(spec, SelectorSpec):
        return spec
    if isinstance(spec, str):
        return SelectorSpec(get_selector_class(spec), {}, name=spec)
    if isinstance(spec, BaseSelector):
        return SelectorSpec(type(spec), spec.get_params(deep=False), instance=spec)
    if isinstance(spec, type) and issubclass(spec, BaseSelector):
        return SelectorSpec(spec, {})
    if isinstance(spec, tuple | list) and len(spec) == 2 and isinstance(spec[1], Mapping):
        what, params = spec[0], dict(spec[1])
        if not all(isinstance(k, str) for k in params):
            raise TypeError(f"selector {spec!r}: parameter names must be strings")
        if isinstance(what, str):
            cls = get_selector_class(what)
            _check_param_names(cls, params, what)
            return SelectorSpec(cls, params, name=what)
        if isinstance(what, type) and issubclass(what, BaseSelector):
            _check_param_names(what, params, what.__name__)
            return SelectorSpec(what, params)
    raise TypeError(f"selector {spec!r:.80} ({type(spec).__name__}) is not a selector; expected {_SELECTOR_FORMS_HELP}")


def is_selector_spec_shape(value: Any) -> bool:
    """Whether ``value`` has the shape of a selector spec (no registry lookup; names are checked later)."""

    def what_ok(w: Any) -> bool:
        return isinstance(w, str) or (isinstance(w, type) and issubclass(w, BaseSelector))

    if what_ok(value) or isinstance(value, BaseSelector):
        return True
    return isinstance(value, tuple | list) and len(value) == 2 and what_ok(value[0]) and isinstance(value[1], Mapping)


def resolve_selector(spec: Any) -> Any:
    """A new, unfitted selector from any of the forms fedselect accepts.

    Parameters
    ----------
    spec : str, tuple, BaseSelector or type
        A registered name (``"power-of-choice"``), a ``(name, params)`` pair
        (``("power-of-choice", {"d": 10})``), a :class:`~fedselect.BaseSelector` instance
        (cloned with :func:`sklearn.base.clone`: the given object is never trained, and
        learned state is not copied), a BaseSelector subclass (built with its defaults) or a
        ``(class, params)`` pair.

    Returns
    -------
    BaseSelector

    Raises
    ------
    KeyError
        An unknown name; the message lists the registered ones.
    ValueError
        A parameter the selector does not have; the message lists those it has.
    TypeError
        Anything else.

    Examples
    --------
    >>> from fedselect.plugins import resolve_selector
    >>> resolve_selector(("power-of-choice", {"d": 10}))
    PowerOfChoiceSelector(d=10)
    """
    return as_selector_spec(spec).build()


def selector_label(spec: Any) -> str:
    """The default row label of a selector spec: its registered name (else class name) and the parameters given.

    Examples
    --------
    >>> from fedselect.plugins import selector_label
    >>> selector_label(("power-of-choice", {"d": 10}))
    'power-of-choice(d=10)'
    """
    return as_selector_spec(spec).label
