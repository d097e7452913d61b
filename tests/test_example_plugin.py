"""The example plugin ``plugins/fedselect-divfl`` is found through real entry-point metadata.

The main CI runs only this directory, so this test exercises what ``pip install fedselect-divfl``
would: it writes the distribution's ``.dist-info`` (METADATA and ``entry_points.txt``) into a
temporary directory on ``sys.path`` and lets ``fedselect.plugins.load_plugins`` discover it with
``importlib.metadata``. Everything is undone afterwards (``sys.path``, ``sys.modules``, the plugin's
registration and the loaded flag), so the other tests see the normal registry.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import fedselect
from fedselect import _registry, plugins

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "plugins" / "fedselect-divfl" / "src"
PLUGIN_NAME = "divfl (fedselect-divfl)"  # fedselect names an entry-point plugin "<ep name> (<dist name>)"


@pytest.fixture
def divfl_on_path(tmp_path, monkeypatch):
    """The plugin's source and its installed-style metadata on sys.path, and entry points loaded afresh."""
    if not (PLUGIN_SRC / "fedselect_divfl" / "__init__.py").is_file():
        pytest.skip(f"the example plugin is not in this checkout ({PLUGIN_SRC})")
    installed = plugins.pm.get_plugin(PLUGIN_NAME) is not None
    if not installed:
        monkeypatch.setattr(_registry, "_loaded", False)
        assert "divfl" not in fedselect.list_selectors()  # nothing to find before the metadata exists
    info = tmp_path / "fedselect_divfl-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedselect-divfl\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedselect]\ndivfl = fedselect_divfl\n")
    imported = "fedselect_divfl" in sys.modules
    monkeypatch.syspath_prepend(str(PLUGIN_SRC))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.delenv("FEDSELECT_PLUGINS", raising=False)
    monkeypatch.setattr(_registry, "_loaded", False)  # restored by monkeypatch at teardown
    try:
        yield
    finally:
        if not installed and plugins.pm.get_plugin(PLUGIN_NAME) is not None:
            plugins.pm.unregister(name=PLUGIN_NAME)
        if not imported:
            sys.modules.pop("fedselect_divfl", None)


def test_the_example_plugin_is_discovered_through_its_entry_point(divfl_on_path):
    assert "divfl" in fedselect.list_selectors()
    entry = plugins.registry("selectors")["divfl"]
    assert entry.plugin == PLUGIN_NAME
    assert entry.obj.__module__ == "fedselect_divfl"
    selector = fedselect.get_selector("divfl", source="probe", random_state=0)
    assert type(selector) is entry.obj and selector.source == "probe"

    fed = fedselect.make_federation("digits", partition="shards", n_clients=10, random_state=0)
    trainer = fedselect.FederatedTrainer(
        selector="divfl", model="logistic", clients_per_round=3, rounds=3, local_steps=2, random_state=0
    ).fit(fed)
    rounds = trainer.history_.rounds
    assert [len(r.clients) for r in rounds] == [3, 3, 3]
    assert np.isfinite(rounds[-1].test_accuracy)
    assert trainer.selector_.seen_.sum() == 9  # the stale source learned from every update it received


def test_the_example_plugin_ships_its_papers_setting(divfl_on_path, tmp_path, capsys):
    # A plugin scheme ships its paper's setting: a partition and presets, through the same entry point.
    import json

    from fedselect.cli import main
    from fedselect.data.partition import PARTITIONS
    from fedselect.presets import get_preset, list_presets

    assert {"divfl-synthetic", "divfl-mnist"} <= set(list_presets())
    assert plugins.registry("presets")["divfl-mnist"].plugin == PLUGIN_NAME
    assert plugins.registry("partitions")["power-law"].plugin == PLUGIN_NAME
    assert "power-law" in PARTITIONS and get_preset("divfl-mnist").federation["partition"] == "power-law"

    # a federation built by the plugin's partition name: two consecutive digits per client
    fed = fedselect.make_federation("digits", partition="power-law", n_clients=20, sigma=1.0, random_state=0)
    held = fed.label_histogram() > 0
    assert held.sum(axis=1).max() == 2 and held.any(axis=0).all()

    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "power-law" in listed.split("partitions: ", 1)[1].splitlines()[0]
    assert re.search(r"^  divfl-mnist +DivFL \(ICLR 2022\) on MNIST", listed, re.M)
    assert f"(plugin: {PLUGIN_NAME})" in listed

    # reproduce a plugin preset (its MNIST swapped for digits, kept short), the partition's parameter as an option
    out = tmp_path / "divfl-mnist"
    small = [
        "--dataset",
        "digits",
        "--n-clients",
        "20",
        "--clients-per-round",
        "3",
        "--rounds",
        "2",
        "--local-steps",
        "1",
        "--seeds",
        "0",
        "--selectors",
        "random",
        "divfl",
        "--out",
        str(out),
        "--no-progress",
        "--sigma",
        "1",
    ]
    assert main(["reproduce", "divfl-mnist", *small]) == 0, capsys.readouterr().err
    saved = json.loads((out / "runs" / "divfl__seed0.json").read_text())
    assert saved["settings"]["federation"] == {
        "dataset": "digits",
        "n_clients": 20,
        "partition": "power-law",
        "sigma": 1.0,
    }
    assert saved["settings"]["trainer"]["lr"] == 0.1 and saved["settings"]["trainer"]["batch_size"] == 10


def test_the_registry_is_back_to_normal_afterwards():
    # Runs after the tests above (file order): the example plugin left no trace.
    from fedselect.data.partition import PARTITIONS
    from fedselect.presets import list_presets

    if plugins.pm.get_plugin(PLUGIN_NAME) is None:
        assert "divfl" not in fedselect.list_selectors()
        assert "power-law" not in PARTITIONS and "divfl-mnist" not in list_presets()
    assert "random" in fedselect.list_selectors()
