"""The plugin manager: built-ins and third-party selectors register through one hook."""

from __future__ import annotations

import inspect
import types

import pytest

from fedselect import hookspecs, plugins
from fedselect.hookspecs import hookimpl
from fedselect.plugins import PluginError, get_selector, get_selector_class, list_selectors, pm
from fedselect.selection import BaseSelector, Selection
from fedselect.selectors.afl import ActiveFLSelector
from fedselect.selectors.clustered import ClusteredSamplingSelector
from fedselect.selectors.data_size import DataSizeSelector
from fedselect.selectors.fedcor import FedCorSelector
from fedselect.selectors.hcsfed import HCSFedSelector
from fedselect.selectors.ldcs import LargestDistanceSelector
from fedselect.selectors.ocs import OptimalClientSamplingSelector
from fedselect.selectors.power_of_choice import PowerOfChoiceSelector
from fedselect.selectors.random import RandomSelector
from fedselect.selectors.round_robin import RoundRobinSelector

BUILT_INS = {
    "random": (RandomSelector, ("uniform",)),
    "round-robin": (RoundRobinSelector, ("rr",)),
    "data-size": (DataSizeSelector, ("importance-size",)),
    "power-of-choice": (PowerOfChoiceSelector, ("pow-d", "powd")),
    "afl": (ActiveFLSelector, ("active-fl",)),
    "fedcor": (FedCorSelector, ()),
    "hcsfed": (HCSFedSelector, ("hcs-fed",)),
    "ldcs": (LargestDistanceSelector, ("fedldcs", "largest-distance")),
    "clustered": (ClusteredSamplingSelector, ("clustered-sampling", "fraboni")),
    "ocs": (OptimalClientSamplingSelector, ("optimal-client-sampling",)),
}


def test_the_table_lists_every_built_in():
    from fedselect.plugins import registry

    built_in = {e.name for e in registry("selectors").values() if e.plugin.startswith("fedselect.")}
    assert built_in == set(BUILT_INS)


class _MySelector(BaseSelector):
    def __init__(self, *, k=1):
        self.k = k

    def _fit(self, pool):
        pass

    def _select(self, n, *, round, oracle):
        return Selection(list(range(n)))


def _plugin(name, obj, *, sel_name="my-test-selector", aliases=()):
    module = types.ModuleType(name)

    @hookimpl
    def register_selectors(register):
        register(obj, name=sel_name, aliases=aliases)

    module.register_selectors = register_selectors
    return module


@pytest.mark.parametrize("name", sorted(BUILT_INS))
def test_every_built_in_name_and_alias(name):
    cls, aliases = BUILT_INS[name]
    for key in (name, *aliases):
        assert get_selector_class(key) is cls
        selector = get_selector(key)
        assert type(selector) is cls
    assert name in list_selectors()
    for alias in aliases:
        assert alias not in list_selectors()  # canonical names only


def test_get_selector_passes_parameters():
    selector = get_selector("power-of-choice", d=10)
    assert selector.d == 10 and repr(selector) == "PowerOfChoiceSelector(d=10)"
    with pytest.raises(TypeError, match=r"selector 'afl' \(ActiveFLSelector\) does not accept"):
        get_selector("afl", beta=1)


def test_list_selectors_is_sorted_and_has_the_built_ins():
    names = list_selectors()
    assert names == sorted(names)
    assert set(BUILT_INS) <= set(names)


def test_unknown_name_lists_known_names():
    with pytest.raises(KeyError, match=r"unknown selector 'nope'; registered selectors: .*afl.*power-of-choice"):
        get_selector("nope")


def test_a_registered_plugin_appears_and_builds():
    plugin = _plugin("fedselect_mine", _MySelector, aliases=("mine",))
    pm.register(plugin, name="fedselect-mine")
    try:
        assert "my-test-selector" in list_selectors()
        built = get_selector("mine", k=3)
        assert isinstance(built, _MySelector) and built.k == 3
        entry = plugins.registry("selectors")["my-test-selector"]
        assert entry.plugin == "fedselect-mine" and entry.aliases == ("mine",)
    finally:
        pm.unregister(name="fedselect-mine")
    assert "my-test-selector" not in list_selectors()


def test_two_plugins_claiming_one_name_name_both():
    class _Other(_MySelector):
        pass

    first, second = _plugin("p_one", _MySelector), _plugin("p_two", _Other)
    pm.register(first, name="plugin-one")
    pm.register(second, name="plugin-two")
    try:
        with pytest.raises(PluginError, match=r"'my-test-selector' is registered twice") as info:
            list_selectors()
        assert "'plugin-one'" in str(info.value) and "'plugin-two'" in str(info.value)
    finally:
        pm.unregister(name="plugin-one")
        pm.unregister(name="plugin-two")


def test_a_plugin_cannot_take_a_built_in_name():
    pm.register(_plugin("p_clash", _MySelector, sel_name="random"), name="clashing-plugin")
    try:
        with pytest.raises(PluginError, match=r"'random' is registered twice") as info:
            get_selector("random")
        assert "'fedselect.selectors.random'" in str(info.value) and "'clashing-plugin'" in str(info.value)
    finally:
        pm.unregister(name="clashing-plugin")


def test_registering_an_instance_is_an_error():
    pm.register(_plugin("p_inst", _MySelector()), name="instance-plugin")
    try:
        with pytest.raises(PluginError, match=r"instance-plugin.*register the class, not an instance"):
            list_selectors()
    finally:
        pm.unregister(name="instance-plugin")


def test_a_hook_that_raises_names_the_plugin():
    module = types.ModuleType("p_raises")

    @hookimpl
    def register_selectors(register):
        raise RuntimeError("oops")

    module.register_selectors = register_selectors
    pm.register(module, name="raising-plugin")
    try:
        with pytest.raises(PluginError, match=r"'raising-plugin' failed in register_selectors: RuntimeError: oops"):
            list_selectors()
    finally:
        pm.unregister(name="raising-plugin")


class _BrokenEntryPoint:
    name = "broken"
    value = "fedselect_broken:plugin"
    dist = types.SimpleNamespace(name="fedselect-broken")

    def load(self):
        raise ImportError("No module named 'fedselect_broken'")


def test_a_broken_entry_point_names_the_plugin(monkeypatch):
    monkeypatch.setattr(plugins, "_entry_points", lambda: [_BrokenEntryPoint()])
    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.delenv("FEDSELECT_PLUGINS", raising=False)
    with pytest.raises(PluginError, match=r"'broken' from distribution 'fedselect-broken' failed to load.*ImportError"):
        plugins.load_plugins()


def test_fedselect_plugins_env_narrows_entry_points(monkeypatch):
    monkeypatch.setattr(plugins, "_entry_points", lambda: [_BrokenEntryPoint()])
    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.setenv("FEDSELECT_PLUGINS", "")
    plugins.load_plugins()  # the broken plugin is not loaded; the built-ins still are
    assert set(BUILT_INS) <= set(list_selectors())


def test_an_entry_point_plugin_is_registered(monkeypatch):
    plugin = _plugin("fedselect_ep", _MySelector, sel_name="ep-selector")

    class _EntryPoint:
        name = "ep"
        value = "fedselect_ep"
        dist = types.SimpleNamespace(name="fedselect-ep")

        def load(self):
            return plugin

    monkeypatch.setattr(plugins, "_entry_points", lambda: [_EntryPoint()])
    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.delenv("FEDSELECT_PLUGINS", raising=False)
    try:
        assert "ep-selector" in list_selectors()
        assert plugins.registry("selectors")["ep-selector"].plugin == "ep (fedselect-ep)"
    finally:
        pm.unregister(name="ep (fedselect-ep)")


def test_load_plugins_is_idempotent():
    plugins.load_plugins()
    before = len(pm.get_plugins())
    plugins.load_plugins()
    assert len(pm.get_plugins()) == before


def _hookspecs():
    return [(name, fn) for name, fn in vars(hookspecs).items() if callable(fn) and hasattr(fn, "fedselect_spec")]


def test_every_hookspec_is_documented_with_its_signature():
    specs = _hookspecs()
    assert {name for name, _ in specs} >= {"register_selectors", "register_datasets", "register_models"}
    for name, fn in specs:
        doc = inspect.getdoc(fn)
        assert doc and len(doc) > 40, f"hookspec {name} has no docstring"
        assert "register(" in doc, f"hookspec {name}'s docstring does not show how to call register"
        assert list(inspect.signature(fn).parameters) == ["register"], f"hookspec {name} must take `register`"


def test_hook_register_selectors():
    plugins.load_plugins()
    impls = {impl.plugin_name for impl in pm.hook.register_selectors.get_hookimpls()}
    for module in plugins.DEFAULT_PLUGINS:
        if module.startswith("fedselect.selectors."):
            assert module in impls


def test_built_in_modules_register_through_the_public_marker():
    import fedselect.selectors.random as random_module

    assert pm.is_registered(random_module) or not plugins._loaded
    assert hasattr(random_module.register_selectors, "fedselect_impl")


def test_a_second_plugin_under_a_taken_name_is_refused_clearly():
    class _Other(_MySelector):
        pass

    first = _plugin("p_first", _MySelector)
    second = _plugin("p_second", _Other, sel_name="other-test-selector")
    plugins.register_plugin(first, name="my-plugin")
    try:
        with pytest.raises(PluginError, match=r"already registered as 'my-plugin'.*name=\.\.\."):
            plugins.register_plugin(second, name="my-plugin")
        assert pm.get_plugin("my-plugin") is first and "other-test-selector" not in list_selectors()
        assert plugins.register_plugin(first, name="my-plugin") is first  # the same object again: nothing happens
    finally:
        pm.unregister(name="my-plugin")
        plugins._user_plugins.pop("my-plugin", None)
