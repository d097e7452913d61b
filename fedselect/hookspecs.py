"""pluggy markers and the hooks a fedselect plugin may implement.

A plugin is a module (or object) with functions decorated by :data:`hookimpl`::

    from fedselect import hookimpl

    @hookimpl
    def register_selectors(register):
        register(MySelector, name="mine", aliases=("my-selector",))

and an entry point in the ``fedselect`` group of its distribution::

    [project.entry-points.fedselect]
    mine = "fedselect_mine"

The hooks: :func:`register_selectors`, :func:`register_datasets`, :func:`register_models`,
:func:`register_partitions`, :func:`register_presets`, and :func:`register_checks`, by which the
module that defines a kind of registered object (:mod:`fedselect.presets` for presets) checks what
plugins register, so that the registry imports none of the modules above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pluggy import HookimplMarker, HookspecMarker

__all__ = ["hookimpl", "hookspec"]

hookspec = HookspecMarker("fedselect")
hookimpl = HookimplMarker("fedselect")


@hookspec
def register_selectors(register: Callable[..., Any]) -> None:
    """Register selector classes.

    Call ``register(cls, name="...", aliases=(...))`` once per class. ``cls`` must
    subclass :class:`fedselect.selection.BaseSelector`; ``name`` is what users type
    (``fedselect.get_selector(name)``, ``fedselect compare --selectors name``).
    """


@hookspec
def register_datasets(register: Callable[..., Any]) -> None:
    """Register dataset loaders.

    Call ``register(loader, name="...")`` where ``loader(data_dir=None, download=False)``
    returns ``(X_train, y_train, X_test, y_test)`` as float32 / int64 arrays.
    """


@hookspec
def register_models(register: Callable[..., Any]) -> None:
    """Register model builders.

    Call ``register(builder, name="...")`` where ``builder(input_shape, n_classes, **params)``
    returns a :class:`torch.nn.Module`.
    """


@hookspec
def register_partitions(register: Callable[..., Any]) -> None:
    """Register partition schemes: how a labelled training set is split across clients.

    Call ``register(func, name="...", aliases=(...))`` where
    ``func(y, n_clients, *, random_state=None, **params)`` returns one sorted ``int64`` index
    array per client (see :mod:`fedselect.data.partition`). ``name`` is what users type:
    ``make_federation(partition=name, **params)``, ``fedselect compare --partition name``; the
    keyword-only ``params`` of ``func`` (with their defaults) become command-line options.
    """


@hookspec
def register_presets(register: Callable[..., Any]) -> None:
    """Register presets: named experiments (a paper's setting), run by ``fedselect reproduce NAME``.

    Call ``register(preset)`` once per :class:`fedselect.presets.Preset`; its ``name`` is what
    users type (``fedselect reproduce NAME``, ``fedselect compare --preset NAME``). Its
    ``federation`` and ``trainer`` mappings are keyword arguments of
    :func:`fedselect.data.make_federation` and :class:`fedselect.FederatedTrainer`: what they
    leave out runs at those functions' defaults, on the command line as in Python.
    """


@hookspec
def register_checks(register: Callable[..., Any]) -> None:
    """Register the check of one kind of registered object: what the module that defines that kind knows.

    Call ``register(check, name=kind)`` where ``kind`` is ``"selectors"``, ``"datasets"``,
    ``"models"``, ``"partitions"`` or ``"presets"``, and ``check(obj, name)`` returns None for a
    valid object registered under ``name``, else the problem, worded to follow "plugin 'P' "
    (``"registered an invalid preset 'x': ..."``); the registry raises it as a
    :class:`~fedselect.plugins.PluginError`. :mod:`fedselect.presets` registers the check of
    presets, so the registry (:mod:`fedselect.plugins`) checks them without importing the trainer
    their settings are checked against. One check per kind.
    """
