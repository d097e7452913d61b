"""The plugin registry: the plugin manager, its registries, user plugins and selector specs.

Built-in schemes, datasets, models, partitions and presets register through the very same
hooks as third-party plugins. Entry points of the group ``fedselect`` are loaded lazily, once,
the first time a registry is read. The environment variable ``FEDSELECT_PLUGINS``
narrows which entry points load: a comma-separated list of entry-point names, or
an empty string for none (built-ins always load).

This module is the registry's public face; its three parts live in private modules:

* :mod:`fedselect._registry`: the plugin manager :data:`pm`, loading the built-ins and the
  entry points (:func:`load_plugins`), the tables (:func:`registry`) and the lookups by name;
* :mod:`fedselect._user_plugins`: plugins without packaging (:func:`load_plugin`,
  :func:`register_plugin`) and the record of the user code a run used (:func:`user_plugins_used`);
* :mod:`fedselect._selector_spec`: selectors as users give them (:class:`SelectorSpec`,
  :func:`resolve_selector`, :func:`selector_label`).
"""

from __future__ import annotations

# ``name as name``: importable from here as before the split, though not in __all__.
from ._registry import (
    DEFAULT_PLUGINS,
    PluginError,
    get_partition,
    get_selector,
    get_selector_class,
    list_datasets,
    list_models,
    list_partitions,
    list_presets,
    list_selectors,
    load_plugins,
    pm,
    registry,
)
from ._registry import OPTIONAL_DEFAULT_PLUGINS as OPTIONAL_DEFAULT_PLUGINS
from ._registry import Entry as Entry
from ._registry import _lookup as _lookup
from ._registry import get_dataset_loader as get_dataset_loader
from ._registry import get_model_builder as get_model_builder
from ._selector_spec import SelectorSpec as SelectorSpec
from ._selector_spec import _recorded_defaults as _recorded_defaults
from ._selector_spec import as_selector_spec as as_selector_spec
from ._selector_spec import is_selector_spec_shape as is_selector_spec_shape
from ._selector_spec import resolve_selector, selector_label
from ._user_plugins import _file_sha256 as _file_sha256
from ._user_plugins import _user_plugins as _user_plugins
from ._user_plugins import load_plugin, register_plugin
from ._user_plugins import user_plugins_used as user_plugins_used

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
