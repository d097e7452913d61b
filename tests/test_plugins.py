"""The plugin manager: built-ins and third-party selectors register through one hook."""

from __future__ import annotations

import inspect
import json
import types

import numpy as np
import pytest

from fedselect import _registry, hookspecs, plugins
from fedselect.hookspecs import hookimpl
from fedselect.plugins import PluginError, get_selector, get_selector_class, list_selectors, pm
from fedselect.selection import BaseSelector, Selection
from fedselect.selectors.afl import ActiveFLSelector
from fedselect.selectors.clustered import ClusteredSamplingSelector
from fedselect.selectors.data_size import DataSizeSelector
from fedselect.selectors.deadline_random import DeadlineRandomSelector
from fedselect.selectors.fedcor import FedCorSelector
from fedselect.selectors.hcsfed import HCSFedSelector
from fedselect.selectors.ldcs import LargestDistanceSelector
from fedselect.selectors.ocs import OptimalClientSamplingSelector
from fedselect.selectors.oort import OortSelector
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
    "oort": (OortSelector, ()),
    "deadline-random": (DeadlineRandomSelector, ()),
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
    monkeypatch.setattr(_registry, "_entry_points", lambda: [_BrokenEntryPoint()])
    monkeypatch.setattr(_registry, "_loaded", False)
    monkeypatch.delenv("FEDSELECT_PLUGINS", raising=False)
    with pytest.raises(PluginError, match=r"'broken' from distribution 'fedselect-broken' failed to load.*ImportError"):
        plugins.load_plugins()


def test_fedselect_plugins_env_narrows_entry_points(monkeypatch):
    monkeypatch.setattr(_registry, "_entry_points", lambda: [_BrokenEntryPoint()])
    monkeypatch.setattr(_registry, "_loaded", False)
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

    monkeypatch.setattr(_registry, "_entry_points", lambda: [_EntryPoint()])
    monkeypatch.setattr(_registry, "_loaded", False)
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

    assert pm.is_registered(random_module) or not _registry._loaded
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


# -- partitions and presets: the same hooks, the same rules ---------------------------------------


def _blocks(y, n_clients, *, width=1, random_state=None):
    """Client k gets the k-th contiguous block of the samples (a deterministic test scheme)."""
    return [p.astype(np.int64) for p in np.array_split(np.arange(len(y)), n_clients)]


def _setting_plugin(name, *, partitions=(), presets=()):
    module = types.ModuleType(name)
    if partitions:

        @hookimpl
        def register_partitions(register):
            for pname, func in partitions:
                register(func, name=pname)

        module.register_partitions = register_partitions
    if presets:

        @hookimpl
        def register_presets(register):
            for preset in presets:
                register(preset)

        module.register_presets = register_presets
    return module


def _preset(name="test-preset", **changes):
    from fedselect.presets import Preset

    fields = {
        "name": name,
        "description": "A test setting: digits in blocks.",
        "federation": {"dataset": "digits", "partition": "test-blocks", "n_clients": 6},
        "trainer": {"model": "logistic", "clients_per_round": 2, "rounds": 2, "local_steps": 1},
        "selectors": {"random": ("random", {})},
        "seeds": (0,),
        "target": 0.5,
    }
    return Preset(**{**fields, **changes})


def test_hook_register_partitions():
    from fedselect.data.partition import PARTITIONS, dirichlet_partition

    plugins.load_plugins()
    impls = {impl.plugin_name for impl in pm.hook.register_partitions.get_hookimpls()}
    assert "fedselect.data.partition" in impls  # the built-ins register through the hook
    assert plugins.list_partitions()[:4] == ["iid", "shards", "dirichlet", "dirichlet-qp"]
    assert list(PARTITIONS)[:4] == plugins.list_partitions()[:4]
    assert plugins.get_partition("dirichlet") is dirichlet_partition is PARTITIONS["dirichlet"]


def test_hook_register_presets():
    from fedselect.presets import PRESETS, get_preset, list_presets

    plugins.load_plugins()
    impls = {impl.plugin_name for impl in pm.hook.register_presets.get_hookimpls()}
    assert "fedselect.presets" in impls
    assert set(PRESETS) <= set(list_presets())
    for name, preset in PRESETS.items():  # the very objects: stored runs keep their keys
        assert get_preset(name) is preset
        assert plugins.registry("presets")[name].plugin == "fedselect.presets"


def test_a_plugin_partition_and_preset_appear_everywhere(tmp_path, capsys):
    from fedselect.cli import main
    from fedselect.data import make_federation
    from fedselect.data.partition import PARTITIONS
    from fedselect.presets import get_preset, list_presets

    plugin = _setting_plugin("p_setting", partitions=[("test-blocks", _blocks)], presets=[_preset()])
    plugins.register_plugin(plugin, name="setting-plugin")
    try:
        assert "test-blocks" in PARTITIONS and "test-preset" in list_presets()
        assert get_preset("test-preset").federation["partition"] == "test-blocks"
        fed = make_federation("digits", partition="test-blocks", n_clients=6, random_state=0)
        assert [len(ix) for ix in fed.client_indices] == [len(p) for p in _blocks(np.zeros(len(fed.y)), 6)]
        assert main(["list"]) == 0
        listed = capsys.readouterr().out
        assert "partitions: iid, shards, dirichlet, dirichlet-qp, test-blocks\n" in listed
        assert "test-blocks" in listed and "(plugin: setting-plugin)" in listed
        assert "--width" in " ".join(a for a in _compare_flags())  # the scheme's parameter became an option
        out = tmp_path / "out"
        assert main(["reproduce", "test-preset", "--out", str(out), "--no-progress", "--width", "2"]) == 0
        saved = json.loads((out / "runs" / "random__seed0.json").read_text())
        assert saved["settings"]["federation"] == {
            "dataset": "digits",
            "partition": "test-blocks",
            "n_clients": 6,
            "width": 2,
        }
        # run keys: a run on a partition from a registered plugin records that plugin's code, as for a selector
        used = plugins.user_plugins_used(federation=saved["settings"]["federation"])
        assert used == [{"module": "p_setting"}]
        assert plugins.user_plugins_used(partition="test-blocks") == used
        assert plugins.user_plugins_used(federation={"partition": "shards"}) == []
        assert saved["settings"]["plugins"] == used  # ... and the run's key covers it
    finally:
        pm.unregister(name="setting-plugin")
        plugins._user_plugins.pop("setting-plugin", None)
    assert "test-blocks" not in PARTITIONS and "test-preset" not in list_presets()


def _compare_flags():
    from fedselect.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices["compare"]
    return [flag for action in sub._actions for flag in action.option_strings]


def test_two_plugins_claiming_one_preset_or_partition_name_both():
    first = _setting_plugin("p_a", partitions=[("test-blocks", _blocks)], presets=[_preset()])
    second = _setting_plugin(
        "p_b",
        partitions=[("test-blocks", lambda y, n, random_state=None: [])],
        presets=[_preset(description="another")],
    )
    pm.register(first, name="plugin-a")
    pm.register(second, name="plugin-b")
    try:
        for kind, name in (("partitions", "test-blocks"), ("presets", "test-preset")):
            with pytest.raises(PluginError, match=rf"'{name}' is registered twice") as info:
                plugins.registry(kind)
            assert "'plugin-a'" in str(info.value) and "'plugin-b'" in str(info.value)
    finally:
        pm.unregister(name="plugin-a")
        pm.unregister(name="plugin-b")


def test_a_plugin_cannot_take_a_built_in_preset_or_partition():
    plugin = _setting_plugin("p_taken", partitions=[("shards", _blocks)], presets=[_preset(name="digits-skew")])
    with pytest.raises(
        PluginError,
        match=r"'shards' is registered twice, by plugin 'fedselect.data.partition' "
        r"and by plugin 'taking-plugin'",
    ):
        plugins.register_plugin(plugin, name="taking-plugin")
    assert pm.get_plugin("taking-plugin") is None  # refused and unregistered again


@pytest.mark.parametrize(
    "preset, message",
    [
        ("not a preset", r"presets must be fedselect.presets.Preset instances"),
        (
            _preset(trainer={"rounds": 2, "learning_rate": 0.1}),
            r"trainer sets 'learning_rate', which FederatedTrainer "
            r"does not take",
        ),
        (_preset(trainer={"selector": "random"}), r"trainer sets 'selector'"),
        (_preset(federation={"random_state": 0}), r"federation sets random_state"),
        (_preset(selectors={}), r"selectors is empty"),
        (_preset(selectors={"r": "random"}), r"selectors\['r'\] must be \(registered name, parameters\)"),
        (_preset(seeds=(0, 0)), r"seeds must be distinct integers >= 0"),
        (_preset(target=1.5), r"target must be a test accuracy in \(0, 1\]"),
        (_preset(name="none"), r"'none' is reserved"),
        (_preset(name=" spaced"), r"name must be a non-empty string without surrounding spaces"),
    ],
)
def test_an_invalid_preset_is_an_error_naming_the_plugin(preset, message):
    module = types.ModuleType("p_bad_preset")

    @hookimpl
    def register_presets(register):
        register(preset, name=getattr(preset, "name", "test-preset"))

    module.register_presets = register_presets
    with pytest.raises(PluginError, match=r"plugin 'bad-preset-plugin' .*" + message):
        plugins.register_plugin(module, name="bad-preset-plugin")
    assert pm.get_plugin("bad-preset-plugin") is None


def test_a_preset_is_registered_under_its_own_name():
    module = types.ModuleType("p_renamed")

    @hookimpl
    def register_presets(register):
        register(_preset(), name="another-name")

    module.register_presets = register_presets
    with pytest.raises(
        PluginError,
        match=r"'renaming-plugin' registered preset 'test-preset' under the name "
        r"'another-name'",
    ):
        plugins.register_plugin(module, name="renaming-plugin")


@pytest.mark.parametrize("func", [42, lambda y: [], lambda y, n: []])
def test_an_invalid_partition_is_an_error_naming_the_plugin(func):
    plugin = _setting_plugin("p_bad_partition", partitions=[("bad-partition", func)])
    with pytest.raises(PluginError, match=r"plugin 'bad-partition-plugin' registered .* as .*'bad-partition'"):
        plugins.register_plugin(plugin, name="bad-partition-plugin")
    assert pm.get_plugin("bad-partition-plugin") is None


def test_a_preset_hook_that_raises_names_the_plugin():
    module = types.ModuleType("p_raising_presets")

    @hookimpl
    def register_presets(register):
        raise RuntimeError("no such file: paper.yaml")

    module.register_presets = register_presets
    pm.register(module, name="raising-presets")
    try:
        with pytest.raises(PluginError, match=r"'raising-presets' failed in register_presets: RuntimeError"):
            plugins.list_presets()
    finally:
        pm.unregister(name="raising-presets")


def test_the_presets_module_checks_presets_through_register_checks():
    """The registry checks a preset with the check fedselect.presets registers, and imports no presets itself."""
    entry = plugins.registry("checks")["presets"]
    assert entry.plugin == "fedselect.presets"
    assert entry.obj("not a preset", "x").endswith("presets must be fedselect.presets.Preset instances")


def test_a_plugin_can_check_its_kind_and_a_second_check_of_a_kind_is_refused():
    checking = types.ModuleType("p_checking")

    @hookimpl
    def register_checks(register):
        register(lambda obj, name: "registered a badly named dataset" if name == "not-ok" else None, name="datasets")

    @hookimpl
    def register_datasets(register):
        register(lambda **kw: None, name="not-ok")

    checking.register_checks, checking.register_datasets = register_checks, register_datasets
    with pytest.raises(PluginError, match=r"plugin 'checking-plugin' registered a badly named dataset"):
        plugins.register_plugin(checking, name="checking-plugin")
    assert pm.get_plugin("checking-plugin") is None and "digits" in plugins.list_datasets()

    second = types.ModuleType("p_second_check")

    @hookimpl
    def register_checks(register):
        register(lambda obj, name: None, name="presets")

    second.register_checks = register_checks
    with pytest.raises(PluginError, match=r"'presets' is registered twice, by plugin 'fedselect.presets'"):
        plugins.register_plugin(second, name="second-check")
    assert pm.get_plugin("second-check") is None
