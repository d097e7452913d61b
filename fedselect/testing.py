"""Conformance checks for client selectors, built-in or third-party.

Every selector that ships with fedselect runs these checks, and so should yours. A
plugin author writes one test::

    from fedselect.testing import check_selector

    def test_my_selector_conforms():
        check_selector(MySelector())

or, to see each check as its own pytest item::

    import pytest
    from fedselect.testing import yield_checks

    @pytest.mark.parametrize("name, check", list(yield_checks(MySelector())))
    def test_conformance(name, check):
        check()

The checks (modelled on river's ``checks.yield_checks`` and the fit-free part of
scikit-learn's ``check_estimator``) drive the selector through many rounds of a real,
small federated problem, :class:`SyntheticOracle`, so selectors that ask the oracle
questions (losses, trial rounds, local updates) are exercised for real and their
questions are recorded and costed. They check the estimator conventions (keyword-only
``__init__`` storing parameters verbatim, ``clone``, ``repr``, ``NotFittedError``),
that selections are valid for several federations and several ``n``, reproducibility
under a fixed ``random_state``, that ``fit`` starts over, that neither ``select``
nor ``update`` mutates its inputs, that a selector reading ``RoundFeedback.losses`` declares
``"losses"`` in ``needs`` (``check_declared_losses``), and that clients that do not answer (NaN answers,
partial or empty feedback: ``check_missing_answers``) never break the selector.

The checks judge only what the selector contract promises (the public ``fit``,
``select`` and ``update`` of a :class:`~fedselect.BaseSelector` subclass and the
conventions of the user guide's *The selector contract*). They do not assume
BaseSelector's ``_fit``/``_select``/``_update`` template: a selector that overrides
``fit``, ``select`` and ``update`` themselves is judged exactly like one that fills in
the template. What the template adds on its own (``select`` refusing ``n`` outside
``1..N``, ``fit`` validating the declared parameters) is BaseSelector's promise,
tested with BaseSelector, not a duty of every selector: runtimes validate ``n``
before they ask and every selection after it is returned.

:func:`parametrize_with_checks` turns the suite into one pytest item per check.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils import check_random_state

from ._synthetic import SyntheticOracle
from .round import Aggregate
from .selection import BaseSelector, ClientPool, RoundFeedback, Selection

__all__ = ["SyntheticOracle", "check_selector", "make_pools", "parametrize_with_checks", "yield_checks"]

KNOWN_NEEDS = frozenset({"losses", "updates", "global", "durations", "sample_losses"})


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------
def make_pools(random_state: Any = 0, sizes: Sequence[int] = (7, 20, 53)) -> list[ClientPool]:
    """Client pools of the given sizes with heterogeneous (log-normal) sample counts."""
    rng = check_random_state(random_state)
    return [ClientPool(np.maximum(1, np.round(rng.lognormal(4.0, 1.0, size=n))).astype(np.int64)) for n in sizes]


def _name(selector: BaseSelector) -> str:
    try:
        return repr(selector)
    except Exception:  # the repr check reports this properly
        return type(selector).__name__


def _ns(n_clients: int) -> list[int]:
    """n = 1, a small n and n = N."""
    return sorted({1, min(n_clients, max(2, n_clients // 5)), n_clients})


def _some_n(n_clients: int, divisor: int) -> int:
    return min(n_clients, max(2, n_clients // divisor))


def _has_rs(selector: BaseSelector) -> bool:
    return "random_state" in selector.get_params(deep=False)


def _seeded(selector: BaseSelector, seed: int) -> BaseSelector:
    est = clone(selector)
    if _has_rs(est):
        est.set_params(random_state=seed)
    return est


def _variable_size(selector: BaseSelector) -> bool:
    return bool(getattr(selector, "variable_size", False))


def _run(
    selector: BaseSelector,
    pool: ClientPool,
    n: int,
    n_rounds: int,
    seed: int,
    *,
    fit: bool = True,
    on_round: Callable[[int, Selection, RoundFeedback], None] | None = None,
    client_dropout: float = 0.0,
    offline: float = 0.0,
) -> list[tuple[list[int], list[float] | None]]:
    """Play ``n_rounds`` rounds on a fresh SyntheticOracle through :func:`fedselect.round.play_round`; return the
    validated selections. With ``offline``, each round asks for at most the available clients (as the trainer
    does) and checks the selection lies among them."""
    if fit:
        selector.fit(pool)
    oracle = SyntheticOracle(
        pool.n_clients, n_samples=pool.n_samples, random_state=seed, client_dropout=client_dropout, offline=offline
    )
    out = []
    for t in range(n_rounds):
        online = oracle.available()

        def check(agg: Aggregate, t: int = t, online: np.ndarray | None = online) -> None:
            sel = agg.selection
            if online is not None:
                outside = np.setdiff1d(sel.clients, online)
                assert not outside.size, f"round {t}: chose client(s) {outside.tolist()} not in oracle.available()"
            if sel.weights is not None:
                assert np.all(np.isfinite(sel.weights)), f"round {t}: non-finite weights {sel.weights}"
                assert np.all(sel.weights >= 0), f"round {t}: negative weights {sel.weights}"
            if on_round is not None:
                on_round(t, sel, agg.feedback)

        agg = oracle.play(selector, n if online is None else min(n, int(online.size)), after_aggregate=check)
        raw = agg.chosen  # as the selector returned it: duplicates and order kept
        assert raw is not None
        out.append((raw.clients.tolist(), None if raw.weights is None else raw.weights.tolist()))
    return out


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, np.random.RandomState) and isinstance(b, np.random.RandomState):
        sa, sb = a.get_state(), b.get_state()
        return sa[0] == sb[0] and np.array_equal(sa[1], sb[1]) and sa[2:] == sb[2:]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    try:
        return bool(a == b)
    except Exception:
        return False


def _dummy_feedback() -> RoundFeedback:
    return RoundFeedback(
        round=0,
        clients=np.array([0]),
        weights=np.array([1.0]),
        losses=np.array([1.0]),
        n_samples=np.array([10]),
        updates=np.zeros((1, 4), dtype=np.float32),
        global_before=np.zeros(4, dtype=np.float32),
        global_after=np.zeros(4, dtype=np.float32),
    )


# ---------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------
def check_class_attributes(selector: BaseSelector) -> None:
    """``needs`` is a frozenset of known keys and ``variable_size`` a bool, on the instance."""
    assert isinstance(selector, BaseSelector), f"{type(selector).__name__} does not subclass BaseSelector"
    needs = selector.needs
    assert isinstance(needs, frozenset), f"needs must be a frozenset, got {type(needs).__name__}"
    unknown = set(needs) - KNOWN_NEEDS
    assert not unknown, f"needs has unknown keys {sorted(unknown)}; known: {sorted(KNOWN_NEEDS)}"
    vs = getattr(clone(selector), "variable_size", False)
    assert isinstance(vs, (bool, np.bool_)), f"variable_size must be a bool on the instance, got {vs!r}"


def check_init_stores_params(selector: BaseSelector) -> None:
    """Keyword-only ``__init__`` that stores its parameters verbatim and sets nothing else."""
    cls = type(selector)
    sig = inspect.signature(cls.__init__)
    positional = [
        p.name
        for p in sig.parameters.values()
        if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    assert not positional, f"__init__ parameters {positional} must be keyword-only (def __init__(self, *, ...))"
    params = selector.get_params(deep=False)
    fresh = cls(**params)
    for key, value in params.items():
        assert getattr(fresh, key) is value, f"__init__ does not store parameter {key!r} verbatim"
    extra = sorted(set(vars(fresh)) - set(params))
    assert not extra, f"__init__ sets attributes {extra} besides its parameters; learned state belongs in fit"
    unfitted = clone(selector)
    fitted_like = [a for a in vars(unfitted) if a.endswith("_") and not a.startswith("__")]
    assert not fitted_like, f"an unfitted selector has fitted attributes {fitted_like}"


def check_clone_and_params(selector: BaseSelector) -> None:
    """``clone`` works, ``get_params``/``set_params`` round-trip, ``repr`` works, and ``fit`` returns self."""
    params = selector.get_params(deep=False)
    twin = clone(selector)
    assert type(twin) is type(selector), "clone changed the class"
    twin_params = twin.get_params(deep=False)
    assert set(twin_params) == set(params), f"clone changed the parameter names: {sorted(twin_params)}"
    for key in params:
        assert _same(twin_params[key], params[key]), f"clone changed parameter {key!r}"
    other = clone(selector)
    assert other.set_params(**params) is other, "set_params must return self"
    for key, value in params.items():
        assert other.get_params(deep=False)[key] is value, f"set_params/get_params do not round-trip {key!r}"
    text = repr(selector)
    assert isinstance(text, str) and type(selector).__name__ in text, f"repr {text!r} does not name the class"
    assert twin.fit(make_pools(0, (7,))[0]) is twin, "fit must return the selector itself"
    repr(twin)


def check_not_fitted(selector: BaseSelector) -> None:
    """``select`` and ``update`` before ``fit`` raise NotFittedError."""
    est = clone(selector)
    oracle = SyntheticOracle(7, random_state=0)
    for what, call in (
        ("select", lambda: est.select(1, round=0, oracle=oracle)),
        ("update", lambda: est.update(_dummy_feedback())),
    ):
        try:
            call()
        except NotFittedError:
            continue
        except Exception as exc:
            raise AssertionError(f"{what} before fit raised {type(exc).__name__} instead of NotFittedError") from exc
        raise AssertionError(f"{what} before fit did not raise NotFittedError")
    assert not oracle.calls, f"select before fit queried the oracle: {oracle.calls}"


def check_valid_selections(
    selector: BaseSelector, *, n_rounds: int = 30, pools: Sequence[ClientPool] | None = None, seed: int = 0
) -> None:
    """Valid selections over many rounds, for several federations and several ``n``."""
    pools = make_pools(seed) if pools is None else pools
    for pool in pools:
        for n in _ns(pool.n_clients):
            est = _seeded(selector, seed)
            sizes: list[int] = []

            def record(t: int, sel: Selection, fb: RoundFeedback, sizes: list[int] = sizes) -> None:
                sizes.append(len(sel))

            try:
                _run(est, pool, n, n_rounds, seed, on_round=record)
            except AssertionError as exc:
                raise AssertionError(f"N={pool.n_clients}, n={n}: {exc}") from exc
            except Exception as exc:
                raise AssertionError(f"N={pool.n_clients}, n={n}: {type(exc).__name__}: {exc}") from exc
            if _variable_size(est):
                mean = float(np.mean(sizes))
                lo, hi = n / 4.0, min(4.0 * n, pool.n_clients)
                assert lo <= mean <= hi, (
                    f"N={pool.n_clients}, n={n}: mean selection size {mean:.2f} over {n_rounds} rounds is outside "
                    f"[{lo:.2f}, {hi:.2f}]"
                )


def check_reproducible(
    selector: BaseSelector,
    *,
    n_rounds: int = 30,
    seeds: Sequence[int] = (0, 1),
    pools: Sequence[ClientPool] | None = None,
) -> None:
    """The same ``random_state`` gives identical selections over a run."""
    pool = (make_pools(0, (20,)) if pools is None else pools)[0]
    n = _some_n(pool.n_clients, 4)
    for seed in seeds:
        first = _run(_seeded(selector, seed), pool, n, n_rounds, seed)
        second = _run(_seeded(selector, seed), pool, n, n_rounds, seed)
        for t, (a, b) in enumerate(zip(first, second)):
            assert a == b, f"random_state={seed}: round {t} differs between two runs: {a} vs {b}"


def check_no_mutation(selector: BaseSelector, *, n_rounds: int = 10, pools: Sequence[ClientPool] | None = None) -> None:
    """Neither ``select`` nor ``update`` mutates its inputs; ``update`` returns self."""
    pool = (make_pools(0, (20,)) if pools is None else pools)[0]
    n_before = pool.n_samples.copy()
    est = _seeded(selector, 0)
    est.fit(pool)
    oracle = SyntheticOracle(pool.n_clients, n_samples=pool.n_samples, random_state=0)
    n = _some_n(pool.n_clients, 4)
    for t in range(n_rounds):
        w_before = oracle.w.copy()
        round_before = oracle.round
        sel = est.select(n, round=t, oracle=oracle)
        assert np.array_equal(oracle.w, w_before), f"round {t}: select changed the oracle's global model"
        assert oracle.round == round_before, f"round {t}: select advanced the oracle's round"
        sel = sel.validated(pool.n_clients, n, variable_size=_variable_size(est), source=type(est).__name__)
        feedback = oracle.run_round(sel, needs=est.needs)
        snapshot = {
            name: None if getattr(feedback, name) is None else getattr(feedback, name).copy()
            for name in ("clients", "weights", "losses", "n_samples", "updates", "global_before", "global_after")
        }
        assert est.update(feedback) is est, f"round {t}: update must return the selector itself"
        for name, value in snapshot.items():
            now = getattr(feedback, name)
            same = now is None if value is None else np.array_equal(now, value, equal_nan=now.dtype.kind == "f")
            assert same, f"round {t}: update changed feedback.{name}"
        assert feedback.round == t, f"round {t}: update changed feedback.round"
    assert np.array_equal(pool.n_samples, n_before), "the selector changed the ClientPool's n_samples"


def check_refit_starts_over(
    selector: BaseSelector, *, n_rounds: int = 30, pools: Sequence[ClientPool] | None = None
) -> None:
    """``fit`` again forgets everything: with one random_state two fits give one sequence.

    A refit on a federation of another size must work too.
    """
    all_pools = make_pools(0) if pools is None else list(pools)
    pool = all_pools[0]
    n = _some_n(pool.n_clients, 3)
    est = _seeded(selector, 0)
    first = _run(est, pool, n, n_rounds, 0)
    if len(all_pools) > 1:
        other = all_pools[-1]
        _run(est, other, max(1, other.n_clients // 4), min(n_rounds, 5), 0)
    second = _run(est, pool, n, n_rounds, 0)
    for t, (a, b) in enumerate(zip(first, second)):
        assert a == b, f"round {t} differs after fit() again: {a} vs {b}"


def check_missing_answers(
    selector: BaseSelector, *, n_rounds: int = 30, pools: Sequence[ClientPool] | None = None, seed: int = 0
) -> None:
    """Clients that do not answer (NaN answers, partial or empty feedback) never break the selector.

    Runs the selector against oracles where each client fails a round with probability
    0.3 and 0.9 (so some rounds have no reporter at all, and whole oracle answers are
    NaN): every selection must stay valid with finite, non-negative weights.
    """
    _run_with_failures(selector, "client_dropout", (0.3, 0.9), n_rounds=n_rounds, pools=pools, seed=seed)


def _run_with_failures(
    selector: BaseSelector, kind: str, levels: Sequence[float], *, n_rounds: int,
    pools: Sequence[ClientPool] | None, seed: int,
) -> None:
    """Run ``selector`` on oracles with ``kind`` (``client_dropout`` or ``offline``) at each level; any failure an
    AssertionError naming the level, the pool and n."""
    pools = make_pools(seed, (7, 20)) if pools is None else pools
    for level in levels:
        for pool in pools:
            n = _some_n(pool.n_clients, 3)
            est = _seeded(selector, seed)
            where = f"{kind}={level}, N={pool.n_clients}, n={n}"
            try:
                _run(est, pool, n, n_rounds, seed, **{kind: level})
            except AssertionError as exc:
                raise AssertionError(f"{where}: {exc}") from exc
            except Exception as exc:
                raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc


def check_available_clients(
    selector: BaseSelector, *, n_rounds: int = 20, pools: Sequence[ClientPool] | None = None, seed: int = 0
) -> None:
    """Every selection lies among the clients online at the round's start (:meth:`ClientOracle.available`).

    Runs the selector against oracles where each client is offline at a round's start with
    probability 0.5 and 0.9 (the server knows: ``available()`` lists the others), asking for
    at most the available clients as the trainer does; a selector that does not choose
    within them itself is restricted by :meth:`BaseSelector.select`.
    """
    _run_with_failures(selector, "offline", (0.5, 0.9), n_rounds=n_rounds, pools=pools, seed=seed)


class _WatchedFeedback(RoundFeedback):
    """A :class:`RoundFeedback` without losses (None, as a runtime sends it to a selector that does not declare
    ``"losses"``) that records every read of ``losses``."""

    def __getattribute__(self, name: str) -> Any:
        if name == "losses":
            try:
                object.__getattribute__(self, "_reads").append(name)
            except AttributeError:  # RoundFeedback's own checks, while it is built
                pass
        return object.__getattribute__(self, name)


def _watched(feedback: RoundFeedback) -> _WatchedFeedback:
    fields = {f: getattr(feedback, f) for f in RoundFeedback.__dataclass_fields__}
    out = _WatchedFeedback(**{**fields, "losses": None})
    object.__setattr__(out, "_reads", [])
    return out


def check_declared_losses(
    selector: BaseSelector, *, n_rounds: int = 10, pools: Sequence[ClientPool] | None = None
) -> None:
    """A selector that reads ``RoundFeedback.losses`` declares ``"losses"`` in ``needs``.

    Runtimes compute the reporters' losses before training only for selectors that declare
    it (``RoundFeedback.losses`` is None otherwise). A selector without ``"losses"`` gets
    feedback whose ``losses`` is None and records its reads; reading it in ``update`` or in the
    next ``select`` fails the check.
    """
    if "losses" in selector.needs:
        return
    pool = (make_pools(0, (20,)) if pools is None else pools)[0]
    est = _seeded(selector, 0)
    est.fit(pool)
    oracle = SyntheticOracle(pool.n_clients, n_samples=pool.n_samples, random_state=0)
    n = _some_n(pool.n_clients, 4)
    seen: list[_WatchedFeedback] = []
    for t in range(n_rounds):
        sel = est.select(n, round=t, oracle=oracle)
        if any(fb._reads for fb in seen):
            break
        sel = sel.validated(pool.n_clients, n, variable_size=_variable_size(est), source=type(est).__name__)
        seen.append(_watched(oracle.run_round(sel, needs=est.needs)))
        est.update(seen[-1])
    read = [t for t, fb in enumerate(seen) if fb._reads]
    assert not read, (
        f"round {read[0]}: {type(est).__name__} read RoundFeedback.losses but its needs "
        f"{sorted(est.needs)} lack 'losses'; runtimes compute the losses (and leave them not None) only for a "
        "selector that declares needs={'losses', ...}"
    )


def yield_checks(
    selector: BaseSelector,
    *,
    n_rounds: int = 30,
    seeds: Sequence[int] = (0, 1),
    pools: Sequence[ClientPool] | None = None,
) -> Iterator[tuple[str, Callable[[], None]]]:
    """Yield ``(name, check)`` pairs; each ``check()`` takes no argument and raises on failure.

    Every check works on clones, so ``selector`` itself is left untouched.

    Parameters
    ----------
    selector : BaseSelector
        The selector instance to check (its parameters are kept; ``random_state`` is
        set per run where the selector has one).
    n_rounds : int, default=30
        Rounds per simulated run.
    seeds : sequence of int, default=(0, 1)
        The seeds of the reproducibility runs.
    pools : sequence of ClientPool, optional
        The federations to run on; by default pools of 7, 20 and 53 clients with
        heterogeneous sample counts.

    Yields
    ------
    name : str
        The check's name, e.g. ``"check_valid_selections"``.
    check : callable
        A function of no arguments.

    Examples
    --------
    >>> from fedselect.selectors.random import RandomSelector
    >>> [name for name, _ in yield_checks(RandomSelector())][:3]
    ['check_class_attributes', 'check_init_stores_params', 'check_clone_and_params']
    """
    p = functools.partial
    checks: list[tuple[str, Callable[[], None]]] = [
        ("check_class_attributes", p(check_class_attributes, selector)),
        ("check_init_stores_params", p(check_init_stores_params, selector)),
        ("check_clone_and_params", p(check_clone_and_params, selector)),
        ("check_not_fitted", p(check_not_fitted, selector)),
        ("check_valid_selections", p(check_valid_selections, selector, n_rounds=n_rounds, pools=pools)),
        ("check_reproducible", p(check_reproducible, selector, n_rounds=n_rounds, seeds=seeds, pools=pools)),
        ("check_no_mutation", p(check_no_mutation, selector, n_rounds=min(n_rounds, 10), pools=pools)),
        ("check_declared_losses", p(check_declared_losses, selector, n_rounds=min(n_rounds, 10), pools=pools)),
        ("check_missing_answers", p(check_missing_answers, selector, n_rounds=n_rounds, pools=pools)),
        ("check_refit_starts_over", p(check_refit_starts_over, selector, n_rounds=n_rounds, pools=pools)),
        ("check_available_clients", p(check_available_clients, selector, n_rounds=min(n_rounds, 20), pools=pools)),
    ]
    yield from checks


def check_selector(
    selector: BaseSelector,
    *,
    n_rounds: int = 30,
    seeds: Sequence[int] = (0, 1),
    pools: Sequence[ClientPool] | None = None,
) -> None:
    """Run every conformance check on ``selector``.

    Parameters
    ----------
    selector : BaseSelector
        The selector instance to check (left untouched: the checks work on clones).
    n_rounds : int, default=30
        Rounds per simulated run (lower it for slow selectors).
    seeds : sequence of int, default=(0, 1)
        The seeds of the reproducibility runs.
    pools : sequence of ClientPool, optional
        The federations to run on; by default 7, 20 and 53 clients.

    Raises
    ------
    AssertionError
        The first failing check, its message naming the check and the selector.

    Examples
    --------
    >>> from fedselect.selectors.random import RandomSelector
    >>> check_selector(RandomSelector(), n_rounds=5)
    """
    for name, check in yield_checks(selector, n_rounds=n_rounds, seeds=seeds, pools=pools):
        try:
            check()
        except Exception as exc:
            detail = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
            raise AssertionError(f"{name} failed for {_name(selector)}: {detail}") from exc


def parametrize_with_checks(selectors: Sequence[BaseSelector], **kwargs: Any) -> Any:
    """A ``pytest.mark.parametrize`` over every (selector, check) pair, one test item each.

    The pytest counterpart of :func:`check_selector` (after scikit-learn's
    ``parametrize_with_checks``): each check shows as its own item, named
    ``<selector repr>-<check name>``, so a failure says at once which property of which
    selector broke. The test receives the selector and a callable of no arguments.

    Parameters
    ----------
    selectors : sequence of BaseSelector
        The selector instances to check.
    **kwargs
        Passed to :func:`yield_checks` (``n_rounds``, ``seeds``, ``pools``).

    Examples
    --------
    ::

        from fedselect.testing import parametrize_with_checks

        @parametrize_with_checks([MySelector(), MySelector(k=3)])
        def test_conformance(selector, check):
            check()
    """
    import pytest

    params = [
        pytest.param(selector, check, id=f"{_name(selector)}-{name}")
        for selector in selectors
        for name, check in yield_checks(selector, **kwargs)
    ]
    return pytest.mark.parametrize("selector, check", params)
