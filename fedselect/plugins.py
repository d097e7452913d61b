"""The plugin manager and the registries built from it.

Built-in schemes, datasets, models, partitions and presets register through the very same
hooks as third-party plugins. Entry points of the group ``fedselect`` are loaded lazily, once,
the first time a registry is read. The environment variable ``FEDSELECT_PLUGINS``
narrows which entry points load: a comma-separated list of entry-point names, or
an empty string for none (built-ins always load).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from . import hookspecs
from .identity import canonical
from .selection import BaseSelector

__all__ = [
    "DEFAULT_PLUGINS",
    "PluginError",
    "get_selector",
    "get_partition",
    "get_selector_class",
    "list_datasets",
    "list_models",
    "list_partitions",
    "list_presets",
    "list_selectors",
    "load_plugin",
    "load_plugins",
    "pm",
    "register_plugin",
    "registry",
    "resolve_selector",
    "selector_label",
]

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
# Plugins registered by load_plugin / register_plugin: their pluggy name -> {"path", "sha256"} (files) or
# {"module"} (modules and objects), so a comparison can record which user code its runs used.
_user_plugins: dict[str, dict[str, str]] = {}


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


_HOOKS: dict[str, tuple[str, Callable[[Any, str, str], None]]] = {
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
    if kind not in _HOOKS:
        raise ValueError(f"unknown registry {kind!r}; expected one of {sorted(_HOOKS)}")
    hook_name, check = _HOOKS[kind]
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


# -- user plugins without packaging ---------------------------------------------------------------


def _file_sha256(path: str | os.PathLike[str] | None) -> str | None:
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def _changed_since_import(module: ModuleType, path: Path) -> list[str]:
    """Functions and methods of ``module`` whose code differs from what ``path`` compiles to now.

    An already-imported module ran the file as it was then; if the file was edited since, the
    classes a run would use are not the code whose hash it would record. Compares every function
    and method defined in the module (by qualified name) with the code objects of the file as
    it is now; edits that touch only module-level values are not seen.
    """
    try:
        fresh = compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        return ["<the file no longer compiles>"]
    now: dict[str, Any] = {}
    todo = [fresh]
    while todo:
        code = todo.pop()
        for c in code.co_consts:
            if hasattr(c, "co_code"):
                now[c.co_qualname] = c
                todo.append(c)
    changed = []
    seen: set[int] = set()
    todo_objs: list[Any] = list(vars(module).values())
    while todo_objs:
        obj = todo_objs.pop()
        if id(obj) in seen or getattr(obj, "__module__", None) != module.__name__:
            continue
        seen.add(id(obj))
        if isinstance(obj, type):
            todo_objs.extend(vars(obj).values())
            continue
        func = getattr(obj, "__func__", obj)  # classmethod / staticmethod
        code = getattr(func, "__code__", None)
        if code is None or Path(code.co_filename).resolve() != path:  # e.g. a wrapper from another file
            continue
        if now.get(code.co_qualname) != code:
            changed.append(code.co_qualname)
    return sorted(changed)


def _hookimpl_names(obj: Any) -> list[str]:
    """Names of the attributes of ``obj`` marked with :data:`fedselect.hookimpl`."""
    marker = f"{hookspecs.hookimpl.project_name}_impl"
    return sorted(name for name in dir(obj) if hasattr(getattr(obj, name, None), marker))


def register_plugin(plugin: ModuleType | object, *, name: str | None = None) -> ModuleType | object:
    """Register a module (or any object) holding ``@fedselect.hookimpl`` functions, as an entry point would.

    What it registers is checked at once: the registries it adds to are rebuilt, so a
    name registered twice, a selector that is not a :class:`~fedselect.BaseSelector`
    subclass or a hook that raises is reported here, naming the plugin, and the plugin
    is then unregistered again. Registering the same object twice does nothing.

    Parameters
    ----------
    plugin : module or object
        Has one or more of the hooks ``register_selectors``, ``register_datasets``,
        ``register_models``, ``register_partitions`` and ``register_presets`` (see
        :mod:`fedselect.hookspecs`), decorated with
        :data:`fedselect.hookimpl`.
    name : str, optional
        The plugin's name in error messages and in :func:`registry` entries; default
        ``"module <module name>"``.

    Returns
    -------
    module or object
        ``plugin``.

    Raises
    ------
    PluginError
        ``plugin`` has no hook implementation (a hook function without the decorator is
        named), implements a hook that does not exist, or registers something invalid.
    """
    load_plugins()
    label = name or f"module {getattr(plugin, '__name__', type(plugin).__name__)}"
    if pm.is_registered(plugin):
        return plugin
    impls = _hookimpl_names(plugin)
    known = sorted(n for n in dir(hookspecs) if n.startswith("register_"))
    if not impls:
        undecorated = [n for n in known if callable(getattr(plugin, n, None))]
        hint = (
            f"; {', '.join(undecorated)} must be decorated with @fedselect.hookimpl"
            if undecorated
            else f"; define one of {', '.join(n for n in known if n != 'register_checks')} decorated with "
            "@fedselect.hookimpl"
        )
        raise PluginError(f"{label} holds no fedselect hook implementation{hint}")
    unknown = [n for n in impls if n not in known]
    if unknown:
        raise PluginError(
            f"{label} implements unknown hook(s) {', '.join(unknown)}; fedselect's hooks are {', '.join(known)}"
        )
    taken = pm.get_plugin(label)
    if taken is not None:
        raise PluginError(
            f"another plugin is already registered as {label!r} ({taken!r}); pass register_plugin(..., "
            "name=...) a name of its own, or unregister the first one (fedselect.plugins.pm.unregister)"
        )
    pm.register(plugin, name=label)
    kinds = {hook: kind for kind, (hook, _) in _HOOKS.items()}
    try:
        for hook in impls:
            registry(kinds[hook])
    except Exception:
        pm.unregister(plugin)
        raise
    record = {"module": getattr(plugin, "__name__", type(plugin).__qualname__)}
    sha = _file_sha256(getattr(plugin, "__file__", None))
    if sha is not None:
        record["sha256"] = sha
    _user_plugins[label] = record
    return plugin


def load_plugin(path_or_module: str | os.PathLike[str], *, sha256: str | None = None) -> ModuleType:
    """Import a plugin from a Python file or an importable module and register its hooks.

    This is what ``fedselect ... --plugin FILE_OR_MODULE`` does: the file needs no package,
    no ``pyproject.toml`` and no installation; its ``@fedselect.hookimpl`` functions
    (``register_selectors``, ``register_presets``, ...) register exactly as
    an installed entry-point plugin's would. A file is imported as a module named after it
    (``my_selector.py`` -> ``my_selector``, so its classes pickle and their settings read
    ``my_selector:MySelector``); its directory is not added to ``sys.path``. Loading the
    same file again does nothing unless its content changed (then it is imported afresh); a
    file the program has already imported under that name is registered as it is.

    Parameters
    ----------
    path_or_module : str or os.PathLike
        A path ending in ``.py`` (or naming an existing file), else a dotted module name.
    sha256 : str, optional
        For a file: the (16-hex-digit) hash its content must have. The file is read once, its
        hash compared, and those very bytes are compiled and run, so a file edited after the
        hash was taken (a grid worker loading what its parent loaded) is refused before any of
        it runs.

    Returns
    -------
    module
        The imported module.

    Raises
    ------
    FileNotFoundError
        The file does not exist.
    PluginError
        The file or module fails to import (the message carries the original error), a
        module of the same name from another file is already imported, the program imported
        this file before and it was edited since, the file's hash is not ``sha256``, or it
        defines no valid hook implementation (see :func:`register_plugin`).

    Examples
    --------
    >>> import fedselect.plugins
    >>> fedselect.plugins.load_plugin("my_selector.py")  # doctest: +SKIP
    <module 'my_selector' from '/home/me/my_selector.py'>
    """
    text = os.fspath(path_or_module)
    is_file = text.endswith(".py") or os.sep in text or Path(text).is_file()
    if not is_file:
        try:
            module = importlib.import_module(text)
        except Exception as exc:
            raise PluginError(f"plugin module {text!r} failed to import: {type(exc).__name__}: {exc}") from exc
        return register_plugin(module, name=f"module {text}")  # type: ignore[return-value]
    path = Path(text).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"plugin file {text} does not exist" if not path.exists() else f"plugin file {text} is not a file"
        )
    resolved = path.resolve()
    label = f"file {resolved}"
    source = resolved.read_bytes()  # hashed, then compiled: what runs is what was hashed
    digest = hashlib.sha256(source).hexdigest()[:16]
    if sha256 is not None and digest != sha256:
        raise PluginError(
            f"plugin file {text} changed on disk after the comparison started (sha256 {sha256[:12]}... then, "
            f"{digest[:12]}... now); not imported. Restore it or start the comparison again"
        )
    existing = pm.get_plugin(label)
    if existing is not None:
        if _user_plugins.get(label, {}).get("sha256") == digest:
            return existing
        pm.unregister(existing)  # the file changed since: load it afresh
        sys.modules.pop(getattr(existing, "__name__", ""), None)
        _user_plugins.pop(label, None)
    mod_name = path.stem
    if not mod_name.isidentifier():
        raise PluginError(
            f"plugin file {text}: {mod_name!r} is not a valid module name; rename the file "
            "(letters, digits and underscores, e.g. my_selector.py)"
        )
    other = sys.modules.get(mod_name)
    if other is not None:
        other_file = getattr(other, "__file__", None)
        if other_file is not None and Path(other_file).resolve() == resolved:
            # the user imported this very file already (``import my_selector``): register that module,
            # unless the file was edited since (the record would then name code that did not run)
            changed = _changed_since_import(other, resolved)
            if changed:
                raise PluginError(
                    f"plugin file {text} was changed after the program imported it as module {mod_name!r} "
                    f"({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''} differ): the registered "
                    f"classes would not be the code in the file; run importlib.reload({mod_name}) (or restart) "
                    "and call load_plugin again"
                )
            try:
                register_plugin(other, name=label)
            except PluginError as exc:
                raise PluginError(str(exc).replace(label, f"plugin file {text}", 1)) from exc
            _user_plugins[label] = {"file": Path(resolved).name, "sha256": _file_sha256(resolved) or ""}
            return other
        raise PluginError(
            f"plugin file {text}: a module named {mod_name!r} is already imported"
            f"{f' from {other_file}' if other_file else ''}; rename the file"
        )
    spec = importlib.util.spec_from_file_location(mod_name, resolved)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin file {text} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        exec(compile(source, str(resolved), "exec"), module.__dict__)  # the hashed bytes, not a second read
    except BaseException as exc:
        del sys.modules[mod_name]
        if not isinstance(exc, Exception):
            raise
        raise PluginError(f"plugin file {text} failed to import: {type(exc).__name__}: {exc}") from exc
    try:
        register_plugin(module, name=label)
    except PluginError as exc:
        del sys.modules[mod_name]
        raise PluginError(str(exc).replace(label, f"plugin file {text}", 1)) from exc
    # Keyed by file name and content, not by the path as typed: the same file given as ./x.py or /abs/x.py resumes.
    _user_plugins[label] = {"file": Path(resolved).name, "sha256": digest}
    return module


def user_plugins_used(
    *,
    selector: Any = None,
    dataset: Any = None,
    model: Any = None,
    partition: Any = None,
    federation: Any = None,
    objects: tuple[Any, ...] = (),
) -> list[dict[str, str]]:
    """The plugins loaded by :func:`load_plugin` / :func:`register_plugin` that provide what a run uses.

    ``selector``, ``dataset``, ``model`` and ``partition`` are registered names (others are
    ignored); ``federation``, a :func:`~fedselect.data.make_federation` mapping, gives its
    ``dataset`` and ``partition`` names the same way; ``objects`` are classes, instances or
    functions, matched by their module. Each record is ``{"file", "sha256"}`` for a file and
    ``{"module", "sha256"}`` for a module, so a run that used a plugin records which code it
    ran and one that did not records nothing. A preset is not code: a run records the
    settings it took from one, and the plugins that provide what those settings name.
    """
    if not _user_plugins:
        return []
    if isinstance(federation, Mapping):
        dataset = federation.get("dataset", dataset)
        partition = federation.get("partition", partition)
    names: set[str] = set()
    for kind, key in (("selectors", selector), ("datasets", dataset), ("models", model), ("partitions", partition)):
        if isinstance(key, str):
            entry = registry(kind).get(key)
            if entry is not None:
                names.add(entry.plugin)
    modules = set()
    for obj in objects:
        mod = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None)
        if mod:
            modules.add(mod)
    for label in _user_plugins:
        plugin = pm.get_plugin(label)
        if plugin is not None and getattr(plugin, "__name__", None) in modules:
            names.add(label)
    return [dict(_user_plugins[n]) for n in sorted(names) if n in _user_plugins]


# -- selectors as users give them -----------------------------------------------------------------


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


def _init_params(cls: type) -> list[str] | None:
    """The keyword parameters ``cls.__init__`` takes, sorted; None when it takes ``**kwargs`` (anything goes)."""
    import inspect

    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return sorted(
        p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


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
