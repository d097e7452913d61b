"""Client ids bound to authenticated node identities (``SelectorStrategy(node_binding=...)``).

Without a binding a client id belongs to the first node that claims it in its hello: a rogue
that says hello first keeps the id. With SuperNode authentication on, a Flower node id is an
authenticated identity: the SuperLink gives it when the operator registers a SuperNode's public
key (``flwr supernode register KEY.pub`` prints it), and only the holder of that key's private half
can act as that node. A binding maps each such node id to the one client id it may claim; the
strategy refuses every other node and every other claim before the node takes part in anything.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from numbers import Integral
from pathlib import Path
from typing import Any

#: the largest Flower node id (an unsigned 64-bit integer)
_MAX_NODE_ID = 2**64 - 1
#: a binding file is a few bytes per node: anything larger is not one
_MAX_FILE_BYTES = 16 * 2**20


def _is_id(value: Any, maximum: int) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and 0 <= int(value) <= maximum


def is_node_binding(value: Any) -> bool:
    """A non-empty mapping of distinct node ids (ints in [0, 2**64 - 1]) to distinct client ids (ints >= 0)."""
    if not isinstance(value, Mapping) or not value:
        return False
    if not all(_is_id(n, _MAX_NODE_ID) and _is_id(k, _MAX_NODE_ID) for n, k in value.items()):
        return False
    return len({int(k) for k in value.values()}) == len(value)


def read_node_binding(path: str | os.PathLike[str]) -> dict[int, int]:
    """Read a node binding from a JSON file.

    The file is one JSON object, ``{"<node id>": <client id>, ...}`` (JSON keys are strings),
    written by the operator from what ``flwr supernode register`` printed for each SuperNode's
    key (``examples/flower-fedcor/deploy/run_local.sh`` writes ``node-binding.json`` so).

    Parameters
    ----------
    path : str or os.PathLike
        The file. Only a path: an int (a file descriptor) is refused.

    Returns
    -------
    dict of int to int
        Node id -> the client id that node may claim.

    Raises
    ------
    TypeError
        ``path`` is not a str or path.
    ValueError
        The file is larger than 16 MiB, is not a JSON object, or does not map distinct node
        ids to distinct client ids (both non-negative integers); the message names the file.
    OSError
        The file cannot be read.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"read_node_binding: path must be a str or path, got {path!r}")
    p = Path(path)
    if p.stat().st_size > _MAX_FILE_BYTES:
        raise ValueError(f"read_node_binding: {p} is larger than {_MAX_FILE_BYTES} bytes: not a node binding")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError(f"a node id is listed twice in {keys!r}")
        return dict(items)

    try:
        raw = json.loads(p.read_text(encoding="utf-8"), object_pairs_hook=pairs)
    except ValueError as exc:
        raise ValueError(f"read_node_binding: {p} is not a JSON binding: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"read_node_binding: {p} must hold one JSON object {{node id: client id}}")
    binding: dict[int, int] = {}
    for node, k in raw.items():
        if not (isinstance(node, str) and node.isdigit()) or not _is_id(k, _MAX_NODE_ID):
            raise ValueError(
                f"read_node_binding: {p}: entry {node!r}: {k!r} is not a node id (digits) mapped to a client id "
                "(int >= 0)"
            )
        binding[int(node)] = int(k)
    if not is_node_binding(binding):
        raise ValueError(f"read_node_binding: {p} must bind distinct node ids to distinct client ids, got {raw!r}")
    return binding
