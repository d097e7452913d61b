"""What a pickle stream would cost to load and walk, measured from its opcodes before anything is built.

A restricted unpickler (an allow-list of globals) decides what may be *called*; it does not bound what
loading costs. A pickle's memo lets one object be referenced many times, so a few hundred bytes describe a
DAG of lists or tuples whose tree (what ``str``, ``hash``, ``==``, ``repr`` or ``np.asarray`` walk) doubles
with every level: 40 levels are 2**40 nodes. :func:`scan_pickle` replays the stream's stack effects over
node ids (no object is built, no global resolved) and refuses a stream whose walked trees are too large or
too deep, or that calls a text-building callable on anything but atoms, or that patches an object built by
a sealed constructor (``BUILD`` after it), before the real unpickler runs.
"""

from __future__ import annotations

import pickle
import pickletools
from collections.abc import Collection
from typing import Any

__all__ = ["scan_pickle", "tree_budget"]

_MARK = -1
_MEMO_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_MEMO_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})
_MUTATE = frozenset({"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"})
_CALL = frozenset({"REDUCE", "NEWOBJ", "NEWOBJ_EX", "OBJ", "INST"})
# Opcodes that push a number, bytes, None or a bool: one shared node (no identity needed), to keep the scan small.
_ATOMS = frozenset(
    {
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "FLOAT",
        "BINFLOAT",
    }
)
_STRINGS = frozenset(
    {"UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"}
)
# Callables that build text from their argument recursively (``str([[...]])`` writes every element).
WALKERS = frozenset({"builtins.str", "builtins.repr", "builtins.ascii", "builtins.format"})
FLOOR = 1 << 20
FACTOR = 16
MAX_DEPTH = 200


def _global(arg: object) -> tuple[str, str]:
    module, _, name = str(arg).partition(" ")
    return module, name


def tree_budget(n_bytes: int) -> int:
    """The nodes a stream of ``n_bytes`` may make its readers walk: ``max(2**20, 16 * n_bytes)``."""
    return max(FLOOR, FACTOR * n_bytes)


def scan_pickle(
    data: bytes,
    *,
    what: str = "pickle",
    sealed: Collection[str] = (),
    max_nodes: int | None = None,
    max_depth: int = MAX_DEPTH,
) -> frozenset[tuple[str, str]]:
    """Refuse a pickle stream whose loading or walking would cost far more than its size.

    The stream's opcodes are replayed over node ids: each container, call result and atom is one
    node, a memo ``GET`` pushes the same node again (sharing), and mutations (``APPEND``,
    ``SETITEMS``, ``BUILD``, ...) add children to their target. The *walked size* is the sum, over
    every argument handed to code (the arguments of each call, the items added to each container,
    which are hashed or stored) and over the result, of its tree size with sharing expanded. A
    tree stream has walked size about depth x nodes; a DAG built from shared references has walked
    size exponential in its depth. Cost: one pass over the opcodes and one over the nodes, both
    linear in the stream.

    Parameters
    ----------
    data : bytes
        The pickle stream.
    what : str
        Names the stream in messages (e.g. the file and member).
    sealed : collection of str
        ``module.name`` of callables whose results must not be patched by a later ``BUILD``
        (constructors that validate everything they set).
    max_nodes : int, optional
        Largest walked size; default :func:`tree_budget` of ``len(data)``.
    max_depth : int
        Deepest nesting of containers (walks of deeper trees recurse past Python's limit).

    Returns
    -------
    frozenset of (str, str)
        ``(module, name)`` of every global the stream calls (``REDUCE``, ``NEWOBJ``, ...), for the
        caller's own rules on what may be called rather than only named.

    Raises
    ------
    pickle.UnpicklingError
        Naming ``what`` and the rule broken; also for a stream pickletools cannot parse.
    """
    limit = tree_budget(len(data)) if max_nodes is None else max_nodes
    kids: list[Any] = [()]  # node -> its children: a list, or the shared () for a node without any; 0: atoms
    names: dict[int, tuple[str, str]] = {}  # node -> (module, name) of a global
    texts: dict[int, str] = {}  # node -> value of a string atom (for STACK_GLOBAL)
    made_by: dict[int, str] = {}  # node -> global that built it
    stack: list[int] = []
    memo: dict[int, int] = {}
    walked: list[int] = []
    called: set[tuple[str, str]] = set()
    root = None

    def new(children: list[int]) -> int:
        kids.append(children if children else ())
        return len(kids) - 1

    def pop_mark() -> list[int]:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] == _MARK:
                items = stack[i + 1 :]
                del stack[i:]
                return items
        raise pickle.UnpicklingError(f"{what}: a pickle opcode without its mark")

    def pop(n: int) -> list[int]:
        items = stack[len(stack) - n :]
        if n > len(stack) or _MARK in items:
            raise pickle.UnpicklingError(f"{what}: a pickle opcode finds too few values on the stack")
        del stack[len(stack) - n :]
        return items

    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in ("PROTO", "FRAME"):
                continue
            if name == "MARK":
                stack.append(_MARK)
            elif name in _MEMO_PUT:
                memo[arg] = pop(1)[0]
                stack.append(memo[arg])
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1] if stack and stack[-1] != _MARK else pop(1)[0]
            elif name in _MEMO_GET:
                if arg not in memo:
                    raise pickle.UnpicklingError(f"{what}: memo entry {arg} read before it is written")
                stack.append(memo[arg])
            elif name == "POP":
                stack.pop() if stack else None
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(pop(1)[0])
                stack.append(stack[-1])
            elif name == "STOP":
                root = pop(1)[0]
                break
            elif name in _MUTATE:
                if name in ("APPENDS", "SETITEMS", "ADDITEMS"):
                    items = pop_mark()
                else:
                    items = pop(2 if name == "SETITEM" else 1)
                target = pop(1)[0]
                if target == 0:
                    raise pickle.UnpicklingError(f"{what}: {name} on a number, bytes or None")
                if name == "BUILD" and made_by.get(target) in sealed:
                    raise pickle.UnpicklingError(
                        f"{what}: sets attributes on a {made_by[target]} result after it is built (refused: that "
                        "constructor sets everything a value may hold)"
                    )
                if kids[target]:
                    kids[target].extend(items)
                else:
                    kids[target] = list(items)
                walked.extend(items)
                stack.append(target)
            elif name == "STACK_GLOBAL":
                module, qual = pop(2)
                node = new([])
                names[node] = (texts.get(module, "?"), texts.get(qual, "?"))
                stack.append(node)
            elif name == "GLOBAL":
                node = new([])
                names[node] = _global(arg)
                stack.append(node)
            elif name in _CALL:
                if name == "INST":
                    args, glob = pop_mark(), _global(arg)
                elif name == "OBJ":
                    items = pop_mark()
                    if not items:
                        raise pickle.UnpicklingError(f"{what}: OBJ without a class")
                    glob, args = names.get(items[0], ("?", "?")), items[1:]
                else:
                    items = pop(len(op.stack_before))
                    glob, args = names.get(items[0], ("?", "?")), items[1:]
                func = ".".join(glob)
                if func in WALKERS:
                    inner = [k for a in args for k in kids[a]] if name in ("REDUCE", "NEWOBJ") else args
                    if any(kids[k] for k in inner):
                        raise pickle.UnpicklingError(
                            f"{what}: calls {func} on a container (it would write every element's text; only "
                            "atoms are allowed)"
                        )
                node = new(list(args))
                made_by[node] = func
                called.add(glob)
                walked.extend(args)
                stack.append(node)
            elif name in _ATOMS:
                stack.append(0)
            else:
                before = op.stack_before
                if pickletools.markobject in before:
                    items = pop_mark()
                    items = pop(before.index(pickletools.markobject)) + items
                else:
                    items = pop(len(before))
                for _ in op.stack_after:
                    node = new(items)
                    if name in _STRINGS:
                        texts[node] = arg if isinstance(arg, str) else str(arg)
                    stack.append(node)
    except pickle.UnpicklingError:
        raise
    except Exception as exc:  # pickletools' own complaints: truncated stream, bad opcode, bad argument
        raise pickle.UnpicklingError(f"{what}: not a valid pickle stream ({exc})") from exc
    if root is None:
        raise pickle.UnpicklingError(f"{what}: a pickle stream without STOP")
    walked.append(root)
    sizes = _tree_sizes(kids, walked, limit, max_depth, what)
    total = 0
    for node in walked:
        total += sizes[node]
        if total > limit:
            raise pickle.UnpicklingError(
                f"{what}: its values would make readers walk more than {limit} nodes (shared references expand "
                f"to {'more than ' if sizes[node] > limit else ''}{sizes[node]} in one value; the stream is "
                f"{len(data)} bytes)"
            )
    return frozenset(called)


def _tree_sizes(kids: list[Any], starts: list[int], limit: int, max_depth: int, what: str) -> dict[int, int]:
    """Tree size (sharing expanded, saturated at ``limit + 1``) of each node reachable from ``starts``; refuses depth.

    Iterative post-order; a back edge (a cycle) counts one node, as walkers that track what they
    visit do.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    active: set[int] = set()
    for start in starts:
        if start in size:
            continue
        todo = [(start, False)]
        while todo:
            node, done = todo.pop()
            if done:
                active.discard(node)
                s, d = 1, 0
                for k in kids[node]:
                    s += size.get(k, 1)
                    d = max(d, depth.get(k, 0))
                size[node] = min(s, limit + 1)
                depth[node] = d + 1 if kids[node] else 0
                if depth[node] > max_depth:
                    raise pickle.UnpicklingError(f"{what}: values nested more than {max_depth} deep")
                continue
            if node in size or node in active:
                continue
            active.add(node)
            todo.append((node, True))
            todo.extend((k, False) for k in kids[node] if k not in size and k not in active)
    return size
