"""A grid worker compares a plugin file's hash with its parent's before importing it (issue 36, item 4)."""

from __future__ import annotations

import pytest

from fedselect import _grid, plugins
from fedselect.plugins import PluginError, load_plugin

from .test_plugin_file import unload  # noqa: F401  (fixture)

_PLUGIN = "MARK = {marker!r}\nopen(MARK, 'w').close()\n"


def test_a_plugin_file_edited_after_the_parent_hashed_it_is_never_imported(tmp_path, unload):  # noqa: F811
    path = tmp_path / "edited_plugin_xyz.py"
    path.write_text("# the reviewed version\n")
    parent_hash = plugins._file_sha256(path)
    marker = tmp_path / "RAN"
    path.write_text(_PLUGIN.format(marker=str(marker)))
    with pytest.raises(PluginError, match=r"changed on disk after the comparison started .*not imported"):
        _grid._load_plugin_sources([("file", str(path), parent_hash)])
    assert not marker.exists(), "the edited plugin file ran in the worker"


def test_a_plugin_file_with_the_parent_s_hash_is_imported(tmp_path, unload):  # noqa: F811
    path = tmp_path / "hashed_plugin_xyz.py"
    marker = tmp_path / "RAN"
    path.write_text(_PLUGIN.format(marker=str(marker)))
    with pytest.raises(PluginError, match="holds no fedselect hook implementation"):  # it ran, then was checked
        load_plugin(path, sha256=plugins._file_sha256(path))
    assert marker.exists()
