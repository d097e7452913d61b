"""Result files are parsed within a memory bound that is a small multiple of the file (issue 36, item 4).

The attack: a result file whose history is millions of ``{}`` objects (3 bytes of text, 64 bytes of dict each),
gzipped about 1000x: 24 KiB on disk cost 599 MiB when loaded, and it was used.
"""

from __future__ import annotations

import gzip
import re
import tracemalloc
import warnings
from pathlib import Path

import pytest

from fedselect.compare import load_comparison, read_text
from fedselect.experiments.results import parse_result
from fedselect.simulation import CorruptFileWarning

_HEAD = '{"key": "k", "label": "random", "seed": 0, "status": "finished", "history": {"rounds": ['
_TAIL = '], "model_size": 10, "config": {"n_clients": 4}}}'


def _empty_objects(n: int) -> str:
    return _HEAD + ",".join(["{}"] * n) + _TAIL


def _peak(fn) -> tuple[object, int, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracemalloc.start()
        try:
            result = fn()
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    return result, peak, [str(w.message) for w in caught if issubclass(w.category, CorruptFileWarning)]


def test_a_gzipped_file_of_empty_objects_is_refused_by_its_compression_ratio(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    path = runs / "random__seed0.json.gz"
    path.write_bytes(gzip.compress(_empty_objects(2_000_000).encode(), compresslevel=9))
    assert path.stat().st_size < 16 * 2**10
    (comp, cells), peak, warned = _peak(lambda: load_comparison(tmp_path, 0.5))
    assert peak < 8 * 2**20, f"{peak / 2**20:.0f} MiB to read a {path.stat().st_size}-byte file"
    assert len(warned) == 1 and re.search(r"random__seed0\.json\.gz is unreadable .*at most 64x", warned[0])
    assert comp.histories == {} and cells == []


def test_a_plain_file_of_empty_objects_is_refused_before_parsing(tmp_path):
    text = _empty_objects(600_000)  # 1.8 MB: under every size limit
    (result, reason), peak, _ = _peak(lambda: parse_result(text))
    assert result is None and "JSON objects and arrays in" in reason
    assert peak < 2**20, f"{peak / 2**20:.0f} MiB to judge {len(text)} bytes"


def test_the_gzip_ratio_has_a_floor_and_the_text_an_absolute_cap(tmp_path):
    small = tmp_path / "a.json.gz"
    small.write_bytes(gzip.compress(b" " * (3 * 2**20) + b"{}", compresslevel=9))  # 3 KB -> 3 MiB: under the floor
    assert len(read_text(small)) == 3 * 2**20 + 2
    big = tmp_path / "b.json.gz"
    big.write_bytes(gzip.compress(b" " * (5 * 2**20), compresslevel=9))
    with pytest.raises(ValueError, match=r"b\.json\.gz: more than 4194304 bytes once decompressed"):
        read_text(big)
    plain = tmp_path / "c.json"
    with plain.open("wb") as fh:
        fh.truncate(64 * 2**20 + 1)
    with pytest.raises(ValueError, match=r"c\.json: more than 67108864 bytes"):
        read_text(plain)


def test_every_stored_result_file_passes_the_bounds():
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    files = sorted(root.glob("**/runs/*.json*"))
    assert len(files) > 100
    for path in files:
        _, reason = parse_result(read_text(path))
        assert reason is None or "JSON objects" not in reason, (path, reason)
