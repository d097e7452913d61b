"""The package's import graph: no cycle, and every import points down the layers (DESIGN.md, "Layers").

The graph is read from the source with :mod:`ast`: every ``import`` and ``from ... import`` inside
``fedselect/``, at module level and inside functions (a function-level import is a dependency all
the same, only a later one), except those under ``if TYPE_CHECKING:``. Importing a module of a
subpackage runs the subpackage's ``__init__`` first, so that counts as imported too (except by its
own modules, which Python imports after it); the top-level ``fedselect`` counts only where a module
names it (``from .. import x``), since every module's import runs it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedselect"

# The floors, lowest first: a module may import its own floor and the floors below it. A name ending in
# ".*" stands for the package and every module in it; the longest matching name files a module.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # Leaves: what everything may use; they import no other fedselect module than leaves.
    (
        "leaves",
        (
            "fedselect._console",
            "fedselect._npy",
            "fedselect._pickle_scan",
            "fedselect._validation",
            "fedselect._version",
            "fedselect.devices",
            "fedselect.hookspecs",
            "fedselect.identity",
            "fedselect.optim",
            "fedselect.storage",
        ),
    ),
    # The contracts: the selector contract, the cost ledger, aggregation rules, device profiles and the clock.
    (
        "contracts",
        ("fedselect.aggregation", "fedselect.clock", "fedselect.ledger", "fedselect.profiles.*", "fedselect.selection"),
    ),
    # The plugin registry: it imports the contracts and leaves only; built-ins register through its hooks.
    # fedselect.plugins is its public face over the plugin manager and tables, user plugins, and selector specs.
    ("registry", ("fedselect._registry", "fedselect._selector_spec", "fedselect._user_plugins", "fedselect.plugins")),
    ("selectors", ("fedselect.selectors.*",)),
    # The round and the oracle's questions (a module or, once split, a package).
    ("round", ("fedselect.round", "fedselect.round.*")),
    # What a transport trains on: data sets, partitions, federations.
    ("data", ("fedselect.data.*",)),
    # The transports: the simulator (with the models it builds by name), Flower and the synthetic test world.
    (
        "transports",
        (
            "fedselect.simulation.*",
            "fedselect._builtin_models",
            "fedselect.flower.*",
            "fedselect.testing",
            "fedselect.testing.*",
            "fedselect._synthetic",
        ),
    ),
    # Comparisons over seeds: plans, runs, results, pictures, the settings of presets.
    (
        "experiments",
        ("fedselect.experiments.*", "fedselect.compare", "fedselect._grid", "fedselect.plotting", "fedselect.presets"),
    ),
    # The command line and the public facade, which imports from every floor.
    ("cli", ("fedselect.cli.*", "fedselect")),
]

# Upward arrows allowed, each with its reason. An allowed arrow is a function-level import, unless its reason
# starts with "module level" (a debt, named so that it is paid: the test fails once the import is gone).
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    # empty: every import points down (FedCor's device helpers moved to the fedselect.devices leaf)
}


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _runtime_imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs inside a function, except those under ``if TYPE_CHECKING:``."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, in_function))
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def import_edges() -> dict[str, dict[str, bool]]:
    """Module -> {fedselect module it imports: whether every such import is inside a function} (a new copy)."""
    return {name: dict(edges) for name, edges in _read_edges().items()}


@functools.cache
def _read_edges() -> dict[str, dict[str, bool]]:
    modules = _modules()
    graph: dict[str, dict[str, bool]] = {}
    for name, (path, is_package) in modules.items():
        edges: dict[str, bool] = {}
        for node, lazy in _runtime_imports(ast.parse(path.read_text())):
            targets: set[str] = set()
            if isinstance(node, ast.Import):
                targets = {a.name for a in node.names if a.name.split(".")[0] == "fedselect"}
            else:
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                if target.split(".")[0] == "fedselect":
                    subs = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules}
                    targets = subs if subs and len(subs) == len(node.names) else {target} | subs
            for target in targets:
                parts = target.split(".")
                first = 1 if target == "fedselect" else 2  # the top level only where named
                for i in range(first, len(parts) + 1):
                    mod = ".".join(parts[:i])
                    own = name == mod or (mod != "fedselect" and name.startswith(mod + "."))
                    if mod in modules and not own:
                        edges[mod] = edges.get(mod, True) and lazy
        graph[name] = edges
    return graph


def import_graph() -> dict[str, set[str]]:
    """Module -> the fedselect modules it imports (module- and function-level)."""
    return {name: set(edges) for name, edges in import_edges().items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The components of mutually reachable modules with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def floor(module: str) -> int:
    """The index in :data:`LAYERS` of the floor ``module`` is filed on (KeyError for a module on none)."""
    best, where = -1, None
    for i, (_, names) in enumerate(LAYERS):
        for pattern in names:
            prefix = pattern[:-2] if pattern.endswith(".*") else pattern
            if module == prefix or (pattern.endswith(".*") and module.startswith(prefix + ".")):
                if len(prefix) > best:
                    best, where = len(prefix), i
    if where is None:
        raise KeyError(f"{module} is on no floor of LAYERS: file it in tests/test_import_graph.py")
    return where


def upward_arrows(edges: dict[str, dict[str, bool]]) -> dict[tuple[str, str], bool]:
    """(importer, imported) -> whether it is function-level only, for each import that points up a floor."""
    return {(a, b): lazy for a, targets in edges.items() for b, lazy in targets.items() if floor(b) > floor(a)}


def _arrow(a: str, b: str, lazy: bool) -> str:
    return f"{a} ({LAYERS[floor(a)][0]}) -> {b} ({LAYERS[floor(b)][0]}){' [in a function]' if lazy else ''}"


# -- the tests ------------------------------------------------------------------------------------------------------


def test_the_graph_sees_module_and_function_level_imports():
    edges = import_edges()
    assert "fedselect.experiments.run" in edges["fedselect.compare"]
    assert edges["fedselect.cli.commands"]["fedselect.compare"] is True  # inside the commands only
    assert edges["fedselect.simulation.trainer"]["fedselect.simulation.engine"] is False
    assert (
        "fedselect.data" in edges["fedselect.data.sources"]
        or "fedselect.data.partition" in edges["fedselect.data.sources"]
    )


def test_every_module_is_filed_on_one_floor():
    unfiled = []
    for name in sorted(_modules()):
        try:
            floor(name)
        except KeyError:
            unfiled.append(name)
    assert not unfiled, f"modules on no floor of LAYERS: {unfiled}"


def test_no_import_cycle():
    cycles = [sorted(c) for c in strongly_connected(import_graph())]
    assert not cycles, "import cycles (module- and function-level imports):\n" + "\n".join(map(str, cycles))


def test_every_import_points_down_the_floors():
    up = upward_arrows(import_edges())
    unlisted = sorted(_arrow(a, b, lazy) for (a, b), lazy in up.items() if (a, b) not in ALLOWED_UPWARD)
    assert not unlisted, f"{len(unlisted)} imports point up the floors of LAYERS:\n" + "\n".join(unlisted)


def test_an_allowed_upward_arrow_is_real_and_imported_in_functions_only():
    up = upward_arrows(import_edges())
    stale = sorted(f"{a} -> {b}" for a, b in ALLOWED_UPWARD if (a, b) not in up)
    at_module_level = sorted(
        f"{a} -> {b}"
        for (a, b), why in ALLOWED_UPWARD.items()
        if up.get((a, b)) is False and not why.startswith("module level")
    )
    assert not stale, f"ALLOWED_UPWARD lists arrows the code no longer has (remove them): {stale}"
    assert not at_module_level, f"allowed upward arrows imported at module level: {at_module_level}"


def test_the_checks_find_a_cycle_and_an_upward_arrow_through_a_function_level_import():
    graph = import_graph()
    graph["fedselect.hookspecs"] = graph["fedselect.hookspecs"] | {"fedselect.plugins"}
    assert any({"fedselect.hookspecs", "fedselect.plugins"} <= c for c in strongly_connected(graph))
    edges = import_edges()
    edges["fedselect.selection"] = {**edges["fedselect.selection"], "fedselect.simulation.trainer": True}
    assert ("fedselect.selection", "fedselect.simulation.trainer") in upward_arrows(edges)
