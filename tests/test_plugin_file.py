"""Your own scheme without packaging: ``--plugin FILE_OR_MODULE`` and ``fedselect.plugins.load_plugin``."""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pytest

from fedselect import plugins
from fedselect.cli import main
from fedselect.plugins import PluginError, load_plugin, register_plugin

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--seeds", "0", "--rounds", "3", "--no-progress", "--checkpoint-every", "0"]


def _readme_plugin() -> str:
    """The README's plugin module, verbatim: the first python block of 'Writing a selector plugin'."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Writing a selector plugin", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def unload():
    """Forget the plugins a test loaded: pluggy registration, sys.modules entry and the provenance record."""
    before = set(plugins._user_plugins)
    yield
    for label in set(plugins._user_plugins) - before:
        plugin = plugins.pm.get_plugin(label)
        if plugin is not None:
            plugins.pm.unregister(plugin)
            sys.modules.pop(getattr(plugin, "__name__", ""), None)
        del plugins._user_plugins[label]


def _result(out: Path, name: str) -> dict:
    path = out / "runs" / name
    return json.loads(path.read_text() if path.exists() else gzip.decompress(Path(f"{path}.gz").read_bytes()))


def test_the_readme_plugin_works_as_a_plain_file(tmp_path, unload, capsys):
    plugin = tmp_path / "my_selector.py"
    plugin.write_text(_readme_plugin())
    assert main(["list", "--plugin", str(plugin)]) == 0
    listed = capsys.readouterr().out
    assert re.search(r"largest-loss +Train the n clients whose loss [^\n]*\n +plugin: file\s+\S*my_selector\.py\n",
                     listed)
    from fedselect.data.partition import PARTITIONS

    assert "partitions: " + ", ".join(PARTITIONS) + "\n" in listed  # from the registry of partition schemes
    out = tmp_path / "out"
    code = main(["compare", "--plugin", str(plugin), "--selectors", "random", "largest-loss", "--out", str(out), *FAST])
    assert code == 0, capsys.readouterr().err
    mine, theirs = _result(out, "largest-loss__seed0.json"), _result(out, "random__seed0.json")
    assert mine["settings"]["plugins"] == [{"file": plugin.name, "sha256": plugins._file_sha256(plugin)}]
    assert "plugins" not in theirs["settings"]  # a run that does not use the plugin keeps its usual key
    assert mine["history"]["rounds"][0]["costs"]["scalars_up"] > 0  # it asked the oracle for losses
    # Editing the plugin is a settings change of its runs only.
    plugin.write_text(_readme_plugin().replace("every=1", "every=2"))
    assert main(["compare", "--plugin", str(plugin), "--selectors", "random", "largest-loss", "--out", str(out),
                 *FAST]) == 2
    err = capsys.readouterr().err
    assert "largest-loss__seed0.json holds a run" in err and "plugins" in err and "random__seed0" not in err


def test_run_and_trainer_use_a_plugin_selector_by_name(tmp_path, unload, capsys):
    plugin = tmp_path / "ll_plugin.py"
    plugin.write_text(_readme_plugin())
    assert main(["run", "--plugin", str(plugin), "--selector", "largest-loss:every=2", "--rounds", "2",
                 "--no-progress"]) == 0
    assert "largest-loss(every=2): 2 rounds" in capsys.readouterr().out
    from fedselect import FederatedTrainer

    tr = FederatedTrainer(selector="largest-loss").set_params(selector__every=3)
    assert tr.selector == ("largest-loss", {"every": 3})


@pytest.mark.parametrize(
    ("source", "error", "message"),
    [
        ("missing.py", FileNotFoundError, r"plugin file .*missing\.py does not exist"),
        ("import nope_not_a_module\n", PluginError,
         r"plugin file .*broken\.py failed to import: ModuleNotFoundError: No module named 'nope_not_a_module'"),
        ("def register_selectors(register):\n    pass\n", PluginError,
         r"plugin file .*broken\.py holds no fedselect hook implementation; register_selectors must be decorated "
         r"with @fedselect.hookimpl"),
        ("x = 1\n", PluginError, r"holds no fedselect hook implementation; define one of register_datasets, "
         r"register_models, register_partitions, register_presets, register_selectors"),
        ("from fedselect import hookimpl\n@hookimpl\ndef register_selector(register):\n    pass\n", PluginError,
         r"unknown hook\(s\) register_selector; fedselect's hooks are"),
        ("from fedselect import hookimpl\nfrom fedselect.selectors.random import RandomSelector\n@hookimpl\n"
         "def register_selectors(register):\n    register(RandomSelector, name='random')\n", PluginError,
         r"the name 'random' is registered twice, by plugin 'fedselect.selectors.random' and by plugin "
         r"'plugin file .*broken\.py'"),
    ],
)
def test_a_bad_plugin_file_is_an_error_naming_it(tmp_path, unload, capsys, source, error, message):
    path = tmp_path / "missing.py" if source == "missing.py" else tmp_path / "broken.py"
    if source != "missing.py":
        path.write_text(source)
    with pytest.raises(error, match=message):
        load_plugin(str(path))
    assert "broken" not in sys.modules
    assert "random" in plugins.list_selectors()  # the registry still works: a rejected plugin is unregistered
    assert main(["list", "--plugin", str(path)]) == 2
    assert str(path) in capsys.readouterr().err


def test_a_module_plugin_and_an_object(tmp_path, unload, monkeypatch):
    with pytest.raises(PluginError, match=r"plugin module 'no_such_mod_xyz' failed to import: ModuleNotFoundError"):
        load_plugin("no_such_mod_xyz")
    (tmp_path / "pkg_plugin_xyz.py").write_text(_readme_plugin())
    monkeypatch.syspath_prepend(str(tmp_path))
    module = load_plugin("pkg_plugin_xyz")
    assert plugins.get_selector_class("largest-loss") is module.LargestLossSelector
    assert load_plugin("pkg_plugin_xyz") is module  # once
    used = plugins.user_plugins_used(selector="largest-loss")
    assert used == [{"module": "pkg_plugin_xyz", "sha256": plugins._file_sha256(tmp_path / "pkg_plugin_xyz.py")}]
    assert plugins.user_plugins_used(selector="random") == []
    with pytest.raises(PluginError, match=r"module object holds no fedselect hook implementation"):
        register_plugin(object())


def test_a_file_whose_module_name_is_taken_is_refused(tmp_path, unload):
    path = tmp_path / "json.py"
    path.write_text(_readme_plugin())
    with pytest.raises(PluginError, match=r"a module named 'json' is already imported from .*; rename the file"):
        load_plugin(str(path))


def test_a_file_the_program_already_imported_is_registered_as_it_is(tmp_path, unload, monkeypatch):
    import importlib

    path = tmp_path / "imported_plugin_xyz.py"
    path.write_text(_readme_plugin())
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("imported_plugin_xyz")  # the user's script did `import imported_plugin_xyz`
    assert load_plugin(str(path)) is module
    assert plugins.get_selector_class("largest-loss") is module.LargestLossSelector  # its classes, not a copy
    assert load_plugin(str(path)) is module  # once
    assert plugins.user_plugins_used(selector="largest-loss") == [
        {"file": "imported_plugin_xyz.py", "sha256": plugins._file_sha256(path)}
    ]


def test_a_file_edited_after_its_import_is_refused_until_reloaded(tmp_path, unload, monkeypatch):
    """The record must name the code that runs: an edit after ``import`` is caught, a reload clears it."""
    import importlib

    path = tmp_path / "edited_plugin_xyz.py"
    path.write_text(_readme_plugin())
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_plugin_xyz")
    text = path.read_text()
    assert "return" in text
    path.write_text(text.replace("return", "return  # edited\n        return", 1))  # same names, other code
    with pytest.raises(PluginError, match=r"was changed after the program imported it as module 'edited_plugin_xyz'"
                                          r".*importlib.reload\(edited_plugin_xyz\)"):
        load_plugin(str(path))
    assert "largest-loss" not in plugins.list_selectors()
    importlib.reload(module)
    assert load_plugin(str(path)) is module
    assert plugins.user_plugins_used(selector="largest-loss")[0]["sha256"] == plugins._file_sha256(path)


def test_a_changed_option_gets_its_own_default_folder(tmp_path, monkeypatch):
    from fedselect.cli import _apply_overrides, _default_out, build_parser
    from fedselect.presets import get_preset

    def folder(*argv):
        args = build_parser().parse_args(["compare", *argv])
        preset = get_preset(args.preset)
        fed, tr = dict(preset.federation), dict(preset.trainer)
        _apply_overrides(args, fed, tr)
        return _default_out(args, preset, fed, tr)

    assert folder() == folder("--selectors", "random", "--seeds", "7") == Path("fedselect-results/digits-skew")
    assert re.fullmatch(r"digits-skew-[0-9a-f]{8}", folder("--lr", "0.2").name)
    assert len({folder("--lr", "0.2"), folder("--lr", "0.3"), folder("--n-clients", "40"), folder()}) == 4
    args = build_parser().parse_args(["reproduce", "digits-quick"])
    preset = get_preset("digits-quick")
    assert _default_out(args, preset, dict(preset.federation), dict(preset.trainer)).name.startswith("digits-quick")
