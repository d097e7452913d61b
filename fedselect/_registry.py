"""The plugin manager and the registries built from it; :mod:`fedselect.plugins` is their public face.

Built-in schemes, datasets, models, partitions and presets register through the very same
hooks as third-party plugins. Entry points of the group ``fedselect`` are loaded lazily, once,
the first time a registry is read. The environment variable ``FEDSELECT_PLUGINS``
narrows which entry points load: a comma-separated list of entry-point names, or
an empty string for none (built-ins always load).
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .selection import BaseSelector

DEFAULT_PLUGINS: tuple[str, ...] = (
    "fedselect.selectors.random",
    "fedselect.selectors.round_robin",
    "fedselect.selectors.data_size",
    "fedselect.selectors.power_of_choice",
    "fedselect.selectors.afl",
    "fedselect.selectors.oort",
    "fedselect.selectors.deadline_random",
    "fedselect.data.datasets",
    "fedselect.data.partition",
    "fedselect._builtin_models",
    "fedselect.presets",
)
OPTIONAL_DEFAULT_PLUGINS: tuple[str, ...] = (
    "fedselect.selectors.fedcor",
    "fedselect.selectors.hcsfed",
    "fedselect.selectors.ldcs",
    "fedselect.selectors.clustered",
    "fedselect.selectors.ocs",
)

pm = pluggy.PluginManager("fedselect")
pm.add_hookspecs(hookspecs)

_loaded = False


class PluginError(RuntimeError):
    """A plugin could not be loaded or registered something invalid."""


def _entry_points() -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group="fedselect"))


def load_plugins() -> None:
    """Load built-in plugins and the ``fedselect`` entry points, once.

    Raises
    ------
    PluginError
        An entry point fails to import; the message names the entry point, its
        distribution and the original error.
    """
    global _loaded
    if _loaded:
        return
    for module_name in DEFAULT_PLUGINS:
        try:
            mod = importlib.import_module(module_name)
        except Exception as exc:
            raise PluginError(f"built-in plugin {module_name!r} failed to load: {type(exc).__name__}: {exc}") from exc
        if not pm.is_registered(mod):
            pm.register(mod, name=module_name)
    for module_name in OPTIONAL_DEFAULT_PLUGINS:
        try:
            mod = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # scheme not shipped in this version
                continue
            raise
        if not pm.is_registered(mod):
            pm.register(mod, name=module_name)
    wanted = os.environ.get("FEDSELECT_PLUGINS")
    allowed = None if wanted is None else {w.strip() for w in wanted.split(",") if w.strip()}
    for ep in _entry_points():
        if allowed is not None and ep.name not in allowed:
            continue
        dist = getattr(ep, "dist", None)
        dist_name = dist.name if dist is not None else "unknown distribution"
        plugin_name = f"{ep.name} ({dist_name})"
        if pm.get_plugin(plugin_name) is not None:
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # report any import failure with the culprit's name
            raise PluginError(
                f"fedselect plugin {ep.name!r} from distribution {dist_name!r} failed to load "
                f"({ep.value}): {type(exc).__name__}: {exc}"
            ) from exc
        try:
            pm.register(plugin, name=plugin_name)
        except Exception as exc:
            raise PluginError(f"fedselect plugin {plugin_name} could not be registered: {exc}") from exc
    _loaded = True


@dataclass(frozen=True)
class Entry:
    """One registered object: what it is, its canonical name, its aliases and who registered it."""

    obj: Any
    name: str
    aliases: tuple[str, ...]
    plugin: str


def _collect(hook_name: str, check: Callable[[Any, str, str], None]) -> dict[str, Entry]:
    load_plugins()
    table: dict[str, Entry] = {}
    hook = getattr(pm.hook, hook_name)
    for impl in hook.get_hookimpls():  # registration order
        plugin_name = impl.plugin_name

        def register(
            obj: Any, name: str | None = None, aliases: tuple[str, ...] | list[str] = (), _plugin: str = plugin_name
        ) -> None:
            name = name or getattr(obj, "name", None) or getattr(obj, "__name__", None)
            if not isinstance(name, str) or not name:
                raise PluginError(f"plugin {_plugin!r} registered {obj!r} without a name")
            check(obj, name, _plugin)
            entry = Entry(obj, name, tuple(aliases), _plugin)
            for key in (name, *entry.aliases):
                if key in table and (table[key].plugin, table[key].obj) != (_plugin, obj):
                    raise PluginError(
                        f"{hook_name}: the name {key!r} is registered twice, by plugin {table[key].plugin!r} "
                        f"and by plugin {_plugin!r}"
                    )
                table[key] = entry

        try:
            impl.function(register=register)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(f"plugin {plugin_name!r} failed in {hook_name}: {type(exc).__name__}: {exc}") from exc
    return table


def _check_selector(obj: Any, name: str, plugin: str) -> None:
    if not (isinstance(obj, type) and issubclass(obj, BaseSelector)):
        raise PluginError(
            f"plugin {plugin!r} registered {obj!r} as selector {name!r}, but selectors must be classes "
            "subclassing fedselect.BaseSelector (register the class, not an instance)"
        )


def _check_callable(obj: Any, name: str, plugin: str) -> None:
    if not callable(obj):
        raise PluginError(f"plugin {plugin!r} registered {obj!r} as {name!r}, which is not callable")


def _check_partition(obj: Any, name: str, plugin: str) -> None:
    import inspect

    _check_callable(obj, name, plugin)
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    positional = [
        p
        for p in params.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    takes_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values())
    if (len(positional) < 2 and not takes_args) or not ("random_state" in params or takes_kwargs):
        raise PluginError(
            f"plugin {plugin!r} registered {obj!r} as partition {name!r}, but a partition must be callable as "
            "func(y, n_clients, *, random_state=None, **params)"
        )


def _check_nothing(obj: Any, name: str, plugin: str) -> None:
    """What a preset is, the registry does not know: :mod:`fedselect.presets` checks it (``register_checks``)."""


# Registry kind -> (the hook that fills it, the check of what a plugin registers there).
HOOKS: dict[str, tuple[str, Callable[[Any, str, str], None]]] = {
    "selectors": ("register_selectors", _check_selector),
    "datasets": ("register_datasets", _check_callable),
    "models": ("register_models", _check_callable),
    "partitions": ("register_partitions", _check_partition),
    "presets": ("register_presets", _check_nothing),
    "checks": ("register_checks", _check_callable),
}


def _checked(kind: str, check: Callable[[Any, str, str], None]) -> Callable[[Any, str, str], None]:
    """``check``, then the check registered for ``kind`` by the module that defines its objects, if any."""
    owner = registry("checks").get(kind)

    def both(obj: Any, name: str, plugin: str) -> None:
        check(obj, name, plugin)
        problem = None if owner is None else owner.obj(obj, name)
        if problem is not None:
            raise PluginError(f"plugin {plugin!r} {problem}")

    return both


def registry(kind: str) -> dict[str, Entry]:
    """The table of ``kind``: ``"selectors"``, ``"datasets"``, ``"models"``, ``"partitions"`` or ``"presets"``.

    Every name and alias maps to its :class:`Entry`, in registration order (built-ins first). The
    table ``"checks"`` holds the check of each kind registered by the module that defines it
    (:func:`fedselect.hookspecs.register_checks`).
    """
    if kind not in HOOKS:
        raise ValueError(f"unknown registry {kind!r}; expected one of {sorted(HOOKS)}")
    hook_name, check = HOOKS[kind]
    return _collect(hook_name, check if kind == "checks" else _checked(kind, check))


def _canonical(table: dict[str, Entry]) -> dict[str, Entry]:
    return {e.name: e for e in table.values()}


def _lookup(kind: str, name: str) -> Entry:
    table = registry(kind)
    if name not in table:
        known = ", ".join(sorted(_canonical(table)))
        close = difflib.get_close_matches(str(name), list(table), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown {kind[:-1]} {name!r}{hint}; registered {kind}: {known}")
    return table[name]


def list_selectors() -> list[str]:
    """Canonical names of every registered selector, sorted."""
    return sorted(_canonical(registry("selectors")))


def list_datasets() -> list[str]:
    """Names of every registered dataset, sorted."""
    return sorted(_canonical(registry("datasets")))


def list_models() -> list[str]:
    """Names of every registered model, sorted."""
    return sorted(_canonical(registry("models")))


def list_partitions() -> list[str]:
    """Names of every registered partition scheme, in registration order (the built-ins first)."""
    return list(_canonical(registry("partitions")))


def list_presets() -> list[str]:
    """Names of every registered preset, sorted."""
    return sorted(_canonical(registry("presets")))


def get_partition(name: str) -> Callable[..., Any]:
    """The partition function registered as ``name`` (or one of its aliases)."""
    return _lookup("partitions", name).obj


def get_selector_class(name: str) -> type:
    """The selector class registered under ``name`` (or one of its aliases)."""
    return _lookup("selectors", name).obj


def get_selector(name: str, **params: Any) -> Any:
    """Build the selector registered as ``name`` with ``params``.

    Examples
    --------
    >>> import fedselect
    >>> fedselect.get_selector("power-of-choice", d=10)
    PowerOfChoiceSelector(d=10)
    """
    cls = get_selector_class(name)
    accepted = _init_params(cls)
    unknown = [p for p in params if accepted is not None and p not in accepted]
    if unknown and accepted is not None:
        hints = []
        for p in unknown:
            close = difflib.get_close_matches(p, accepted, n=1) or [q for q in accepted if q.lower() == p.lower()]
            hints.append(f"{p!r} (did you mean {close[0]!r}?)" if close else repr(p))
        raise TypeError(
            f"selector {name!r} ({cls.__name__}) does not accept parameter {', '.join(hints)}; its "
            f"parameters: {', '.join(accepted)}"
        )
    try:
        return cls(**params)
    except TypeError as exc:
        raise TypeError(f"selector {name!r} ({cls.__name__}) does not accept these parameters: {exc}") from exc


def get_dataset_loader(name: str) -> Callable[..., Any]:
    """The loader registered as dataset ``name``."""
    return _lookup("datasets", name).obj


def get_model_builder(name: str) -> Callable[..., Any]:
    """The builder registered as model ``name``."""
    return _lookup("models", name).obj


def _init_params(cls: type) -> list[str] | None:
    """The keyword parameters ``cls.__init__`` takes, sorted; None when it takes ``**kwargs`` (anything goes)."""
    import inspect

    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return sorted(
        p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )
