"""User plugins without packaging: a file or module registered by hand, and the record of the code a run used.

:func:`load_plugin` (``--plugin FILE_OR_MODULE``) and :func:`register_plugin` register hooks
exactly as an installed entry point's would (through :data:`fedselect.plugins.pm`), check at
once what they register, and remember each plugin with the hash of its file, so that
:func:`user_plugins_used` can name the user code a comparison's runs ran.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from . import hookspecs
from ._registry import HOOKS, PluginError, load_plugins, pm, registry

# Plugins registered by load_plugin / register_plugin: their pluggy name -> {"path", "sha256"} (files) or
# {"module"} (modules and objects), so a comparison can record which user code its runs used.
_user_plugins: dict[str, dict[str, str]] = {}


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
    kinds = {hook: kind for kind, (hook, _) in HOOKS.items()}
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
