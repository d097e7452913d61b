"""Parameter constraints declared as data, and the one function that checks them.

An estimator (a selector, the trainer) declares what each ``__init__`` parameter may be::

    _parameter_constraints = {
        "d": [None, Interval(Integral, 1, None, closed="left")],
        "mode": [StrOptions({"textbook", "flsim"})],
        "random_state": ["random_state"],
    }

Each parameter maps to a list of alternatives; a value is valid when it satisfies any of
them. An alternative is a :class:`Constraint` or a shorthand: ``None`` (the value None),
``"random_state"``, ``"array-like"``, ``"boolean"``, ``"no_validation"`` (anything),
``callable`` (any callable) or a type (an instance of it). :func:`validate_parameters`
checks every declared parameter and writes every message the same way::

    PowerOfChoiceSelector: parameter d=0 is invalid; expected None or an int in [1, inf).

The idea is scikit-learn's (``sklearn/utils/_param_validation.py``); this is a smaller
version of our own, with two differences: real intervals reject NaN and infinities
(no parameter here means anything by them), and every constraint can list values that
violate it (:meth:`Constraint.invalid_examples`) so tests generate bad input for every
declared parameter by themselves (:func:`invalid_values`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

__all__ = [
    "Anything",
    "Boolean",
    "Callables",
    "Constraint",
    "InstanceOf",
    "Interval",
    "InvalidParameterError",
    "NoneConstraint",
    "Options",
    "Predicate",
    "RandomStates",
    "StrOptions",
    "describe",
    "invalid_values",
    "make_constraint",
    "parameter_message",
    "validate_parameters",
]

_SEED_MAX = 2**32 - 1  # numpy's RandomState and SeedSequence-derived seeds take [0, 2**32 - 1]


class InvalidParameterError(ValueError, TypeError):
    """A parameter value an estimator does not accept.

    A subclass of both ValueError and TypeError, so callers catching either (a value out
    of range, a value of the wrong type) see it.
    """


# --------------------------------------------------------------------------- constraints


class Constraint:
    """One alternative of a parameter's constraint list."""

    def is_satisfied_by(self, value: Any) -> bool:
        raise NotImplementedError

    def __str__(self) -> str:
        raise NotImplementedError

    def invalid_examples(self) -> list[Any]:
        """Values near this constraint that may violate it (filtered against all alternatives later)."""
        return []


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool | np.bool_)


class NoneConstraint(Constraint):
    """The value None."""

    def is_satisfied_by(self, value: Any) -> bool:
        return value is None

    def __str__(self) -> str:
        return "None"

    def invalid_examples(self) -> list[Any]:
        return ["none"]


class Boolean(Constraint):
    """True or False (Python or NumPy bools; not 0 or 1)."""

    def is_satisfied_by(self, value: Any) -> bool:
        return _is_bool(value)

    def __str__(self) -> str:
        return "True or False"

    def invalid_examples(self) -> list[Any]:
        return [1, 0, "yes", None]


class Callables(Constraint):
    """Any callable."""

    def is_satisfied_by(self, value: Any) -> bool:
        return callable(value)

    def __str__(self) -> str:
        return "a callable"

    def invalid_examples(self) -> list[Any]:
        return [1, object()]


class InstanceOf(Constraint):
    """An instance of ``type_`` (bools are not numbers here)."""

    def __init__(self, type_: type, description: str | None = None) -> None:
        self.type = type_
        self.description = description

    def is_satisfied_by(self, value: Any) -> bool:
        if _is_bool(value) and self.type not in (bool, object):
            return False  # True is an int to Python, never to a parameter
        return isinstance(value, self.type)

    def __str__(self) -> str:
        return self.description or f"an instance of {self.type.__qualname__}"

    def invalid_examples(self) -> list[Any]:
        return [object(), 1.5, "x"]


class Options(Constraint):
    """One of a fixed set of values (compared with ``==``, after a type check)."""

    def __init__(self, type_: type, options: Iterable[Any]) -> None:
        self.type = type_
        self.options = tuple(options)

    def is_satisfied_by(self, value: Any) -> bool:
        if not isinstance(value, self.type) or (_is_bool(value) and self.type is not bool):
            return False
        return any(value == o for o in self.options)

    def __str__(self) -> str:
        return f"one of {self.options!r}"

    def invalid_examples(self) -> list[Any]:
        return [object()]


class StrOptions(Options):
    """One of a fixed set of strings; the order given is the order messages list them in."""

    def __init__(self, options: Iterable[str]) -> None:
        super().__init__(str, options)

    def invalid_examples(self) -> list[Any]:
        return ["no-such-option", self.options[0].upper() + "!" if self.options else "x", 1, None]


class Interval(Constraint):
    """Numbers of one kind between two bounds.

    Parameters
    ----------
    kind : numbers.Integral or numbers.Real
        ``Integral``: Python or NumPy integers (not bools, not whole floats).
        ``Real``: any finite real number (ints included; not bools, NaN or infinities).
    left, right : number or None
        The bounds; None means unbounded on that side.
    closed : {"left", "right", "both", "neither"}
        Which bounds belong to the interval.
    """

    def __init__(self, kind: type, left: float | None, right: float | None, *, closed: str) -> None:
        if kind not in (numbers.Integral, numbers.Real):
            raise ValueError(f"Interval: kind must be numbers.Integral or numbers.Real, got {kind!r}")
        if closed not in ("left", "right", "both", "neither"):
            raise ValueError(f"Interval: closed must be 'left', 'right', 'both' or 'neither', got {closed!r}")
        if left is not None and right is not None and left > right:
            raise ValueError(f"Interval: left={left} is above right={right}")
        self.kind = kind
        self.left = left
        self.right = right
        self.closed = closed

    def _in_range(self, value: Any) -> bool:
        if self.left is not None:
            if value < self.left or (value == self.left and self.closed in ("right", "neither")):
                return False
        if self.right is not None:
            if value > self.right or (value == self.right and self.closed in ("left", "neither")):
                return False
        return True

    def is_satisfied_by(self, value: Any) -> bool:
        if _is_bool(value) or not isinstance(value, self.kind):
            return False
        if self.kind is numbers.Real and not math.isfinite(float(value)):
            return False
        return self._in_range(value)

    def __str__(self) -> str:
        kind = "an int" if self.kind is numbers.Integral else "a finite number"
        lo = "(-inf" if self.left is None else ("[" if self.closed in ("left", "both") else "(") + _num(self.left)
        hi = "inf)" if self.right is None else _num(self.right) + ("]" if self.closed in ("right", "both") else ")")
        return f"{kind} in {lo}, {hi}"

    def invalid_examples(self) -> list[Any]:
        out: list[Any] = [float("nan"), float("inf"), -float("inf"), "1", [1]]
        step = 1 if self.kind is numbers.Integral else 1e-3
        for bound, sign in ((self.left, -1), (self.right, 1)):
            if bound is None:
                continue
            out.append(bound)  # rejected when the bound is open
            out.append(bound + sign * step)
            out.append(bound + sign * 1000)
        if self.kind is numbers.Integral:
            mid = self._some_member()
            out += [True, False, float(mid), mid + 0.5, np.float64(mid)]
        return out

    def _some_member(self) -> int:
        lo = -5 if self.left is None else int(self.left) + (0 if self.closed in ("left", "both") else 1)
        return lo


def _num(x: float) -> str:
    return "2**32 - 1" if x == _SEED_MAX else repr(x)


class RandomStates(Constraint):
    """None, a seed in [0, 2**32 - 1] or a ``numpy.random.RandomState`` (what ``check_random_state`` takes)."""

    def is_satisfied_by(self, value: Any) -> bool:
        if value is None or isinstance(value, np.random.RandomState):
            return True
        return isinstance(value, numbers.Integral) and not _is_bool(value) and 0 <= value <= _SEED_MAX

    def __str__(self) -> str:
        return "None, an int in [0, 2**32 - 1] or a numpy RandomState"

    def invalid_examples(self) -> list[Any]:
        return [-1, _SEED_MAX + 1, 1.5, "0", True, float("nan"), np.random.default_rng(0)]


class ArrayLike(Constraint):
    """Anything numpy turns into a numeric array (lists, tuples, arrays); not a string or a scalar."""

    def is_satisfied_by(self, value: Any) -> bool:
        if isinstance(value, str | bytes) or value is None:
            return False
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError):
            return False
        return arr.ndim >= 1 and arr.dtype.kind in "biuf"

    def __str__(self) -> str:
        return "an array-like of numbers"

    def invalid_examples(self) -> list[Any]:
        return ["abc", 3, None]


class Predicate(Constraint):
    """A custom test with its description, for rules the other constraints cannot express."""

    def __init__(self, test: Callable[[Any], bool], description: str, examples: Iterable[Any] = ()) -> None:
        self.test = test
        self.description = description
        self.examples = list(examples)

    def is_satisfied_by(self, value: Any) -> bool:
        try:
            return bool(self.test(value))
        except Exception:  # a test that cannot even look at the value rejects it
            return False

    def __str__(self) -> str:
        return self.description

    def invalid_examples(self) -> list[Any]:
        return list(self.examples)


class Anything(Constraint):
    """Any value: a parameter declared on purpose as not validated (shorthand ``"no_validation"``)."""

    def is_satisfied_by(self, value: Any) -> bool:
        return True

    def __str__(self) -> str:
        return "anything"


_SHORTHANDS: dict[Any, Callable[[], Constraint]] = {
    "no_validation": Anything,
    "random_state": RandomStates,
    "array-like": ArrayLike,
    "boolean": Boolean,
}


def make_constraint(spec: Any) -> Constraint:
    """Turn one declared alternative (a Constraint or a shorthand) into a :class:`Constraint`."""
    if isinstance(spec, Constraint):
        return spec
    if spec is None:
        return NoneConstraint()
    if spec is callable:
        return Callables()
    if isinstance(spec, str) and spec in _SHORTHANDS:
        return _SHORTHANDS[spec]()
    if isinstance(spec, type):
        return InstanceOf(spec, f"a {spec.__name__}")
    raise TypeError(
        f"unknown parameter constraint {spec!r}; use a Constraint, None, callable, a type or one of "
        f"{sorted(_SHORTHANDS)}"
    )


# --------------------------------------------------------------------------- checking


def describe(constraints: Iterable[Any]) -> str:
    """The allowed values in words: ``"None or an int in [1, inf)"``."""
    parts = [str(make_constraint(c)) for c in constraints]
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " or " + parts[-1]


def parameter_message(owner: object | str, name: str, value: Any, allowed: str) -> str:
    """The one shape of every parameter message: class, parameter, value, what is allowed."""
    cls = owner if isinstance(owner, str) else type(owner).__name__
    return f"{cls}: parameter {name}={value!r} is invalid; expected {allowed}."


def validate_parameters(
    owner: object | str,
    params: Mapping[str, Any],
    constraints: Mapping[str, Iterable[Any]],
) -> None:
    """Check each value in ``params`` that has a declared constraint.

    Parameters
    ----------
    owner : object or str
        The estimator (or its class name) the messages name.
    params : mapping
        Parameter name -> value (e.g. ``estimator.get_params(deep=False)``).
    constraints : mapping
        Parameter name -> list of alternatives. Parameters without an entry are not
        checked (a test asserts that every built-in declares all of its parameters);
        ``["no_validation"]`` declares one that is deliberately not checked.

    Raises
    ------
    InvalidParameterError
        For the first invalid value, in the order of ``params``.
    """
    for name, value in params.items():
        spec = constraints.get(name)
        if spec is None:
            continue
        alternatives = [make_constraint(c) for c in spec]
        if not any(c.is_satisfied_by(value) for c in alternatives):
            raise InvalidParameterError(parameter_message(owner, name, value, describe(alternatives)))


def invalid_values(constraints: Iterable[Any]) -> list[Any]:
    """Values that violate every alternative of one parameter's constraint list.

    Collects each alternative's :meth:`Constraint.invalid_examples` (values below and
    above an interval, NaN, infinities, bools and floats where ints are wanted,
    unknown string options, wrong types) and keeps those no alternative accepts.
    Used by tests to feed every declared parameter bad input without hand-written lists.
    """
    alternatives = [make_constraint(c) for c in constraints]
    out: list[Any] = []
    seen: set[str] = set()
    for c in alternatives:
        for value in [*c.invalid_examples(), object()]:
            key = "object" if type(value) is object else f"{type(value).__name__}:{value!r}"
            if key in seen or any(a.is_satisfied_by(value) for a in alternatives):
                continue
            seen.add(key)
            out.append(value)
    return out


def outside_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the innermost frame outside fedselect (the user's call),
    counted from the function that calls this one: a script sees the warning, fedselect's own calls do not."""
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


_NO_DEFAULT = object()


def renamed(owner: str, old: str, old_value: Any, new: str, new_value: Any, default: Any = _NO_DEFAULT) -> Any:
    """The value of a keyword that was renamed: ``new_value``, or ``old_value`` (with a ``DeprecationWarning``
    naming both, attributed to the caller outside fedselect) when the old name was given (not None). With
    ``default`` (the new keyword's default), both given is an error naming both. One name per concept across
    the trainer, the engine, Flower and the command line (ARCHITECTURE.md); the old names keep working for a
    deprecation period."""
    if old_value is None:
        return new_value
    if default is not _NO_DEFAULT and not _same(new_value, default):
        raise InvalidParameterError(
            f"{owner}: {new}={new_value!r} and its deprecated name {old}={old_value!r} are both set; "
            f"give it once, as {new}="
        )
    import warnings

    warnings.warn(
        f"{owner}: {old}= is deprecated and will be removed in fedselect 1.0; use {new}={old_value!r}",
        DeprecationWarning,
        stacklevel=outside_stacklevel(),
    )
    return old_value


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an array-like compared elementwise: not the default
        return a is b
