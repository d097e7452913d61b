"""The README's Python code runs as written.

Every ``python`` block of README.md is either part of the plugin recipe (marked
``<!-- plugin-recipe: NAME -->``, built and run by tests/test_readme_plugin.py) or one of
the blocks this file runs: the Quickstart and the Flower ``ServerApp``. A new block that is
neither fails :func:`test_every_python_block_is_run_by_a_test`, so none goes unchecked.

Every block must compile and use no name it does not define (the Flower snippet once passed
an undefined ``initial_arrays``). The runs shorten what would take minutes (the Quickstart's
30 rounds, the ServerApp's 200) to two rounds and change nothing else: every line executes,
so a renamed parameter, a missing import or an object of the wrong kind fails here.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import os
import re
import tempfile
from pathlib import Path

import pytest

import fedselect

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)\n```$", re.S | re.M)
RUN_HERE = {"## Quickstart", "## Deploying with Flower"}  # sections whose python blocks this file runs
SHORT = 2  # rounds


def python_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(section heading, plugin-recipe name or None, code) of every ``python`` block, in order."""
    out = []
    for match in BLOCK.finditer(text):
        before = text[: match.start()]
        headings = re.findall(r"^(## .+)$", before, flags=re.M)
        marker = re.search(r"<!-- plugin-recipe: (\S+) -->\n$", before)
        out.append((headings[-1] if headings else "", marker.group(1) if marker else None, match.group(1) + "\n"))
    return out


def undefined_names(code: str) -> set[str]:
    """Names the code reads but neither defines (assignment, import, def, parameter, loop) nor gets from builtins.

    Scopes are not told apart: a README snippet is short, and a name it defines anywhere counts as defined.
    """
    tree = ast.parse(code)
    defined = set(dir(builtins))
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    return used - defined


def _block(heading: str) -> str:
    (code,) = [code for h, marker, code in python_blocks(README.read_text()) if h == heading and marker is None]
    return code


def test_every_python_block_is_run_by_a_test():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3
    unchecked = [h for h, marker, _ in blocks if marker is None and h not in RUN_HERE]
    assert not unchecked, f"README python blocks no test runs (add them to RUN_HERE and run them): {unchecked}"
    for heading in RUN_HERE:
        assert [h for h, marker, _ in blocks if h == heading and marker is None], f"README has no block under {heading}"


@pytest.mark.parametrize("index", range(len(python_blocks(README.read_text()))))
def test_every_python_block_compiles_and_defines_what_it_uses(index):
    heading, _, code = python_blocks(README.read_text())[index]
    compile(code, f"README.md, block {index} under {heading!r}", "exec")
    assert not undefined_names(code), f"README block under {heading!r} uses undefined {sorted(undefined_names(code))}"


def test_the_undefined_name_check_catches_the_old_flower_snippet():
    old = (
        "from flwr.serverapp import ServerApp\nimport fedselect\nfrom fedselect.flower import SelectorStrategy\n\n"
        "app = ServerApp()\n\n@app.main()\ndef main(grid, context):\n"
        "    strategy = SelectorStrategy(fedselect.get_selector('fedcor'), clients_per_round=5)\n"
        "    strategy.start(grid, initial_arrays, num_rounds=200)\n"
    )
    assert undefined_names(old) == {"initial_arrays"}


def test_the_quickstart_runs(monkeypatch):
    real = fedselect.FederatedTrainer

    def short(**params):  # the README's trainers, two rounds each
        return real(**{**params, "rounds": SHORT})

    monkeypatch.setattr(fedselect, "FederatedTrainer", short)
    out = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(_block("## Quickstart"), "README.md (Quickstart)", "exec"), namespace)
    text = out.getvalue()
    assert "random rounds to 80%:" in text and "power-of-choice rounds to 80%:" in text and "Costs(" in text
    assert "power-of-choice" in text.splitlines()[-1]  # list_selectors()
    assert namespace["selector"].d == 10 and isinstance(namespace["trainer"].selector, namespace["FedCorSelector"])
    assert len(namespace["history"]) == SHORT


def test_the_flower_server_app_runs_against_an_in_process_grid(monkeypatch, tmp_path):
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="fedselect-flwr-home-"))
    pytest.importorskip("flwr")
    import torch
    from flwr.app import Context, RecordDict

    from fedselect.flower import FederationClients, LocalGrid, SelectorStrategy

    code = _block("## Deploying with Flower")
    namespace: dict = {}
    exec(compile(code, "README.md (Flower ServerApp)", "exec"), namespace)
    assert namespace["app"]._main is namespace["main"]  # registered as the app's main

    started = []
    real_start = SelectorStrategy.start

    def start(self, grid, arrays, *, num_rounds, **kw):  # the README's 200 rounds, two here
        started.append((self, num_rounds, kw))
        return real_start(self, grid, arrays, num_rounds=SHORT, **kw)

    monkeypatch.setattr(SelectorStrategy, "start", start)
    monkeypatch.chdir(tmp_path)  # records_path="rounds.jsonl" is written here
    n = 20
    fed = fedselect.make_federation("digits", partition="shards", n_clients=n, random_state=0)
    # clients training the README's model (Flatten + Linear(64, 10)): the arrays it sends them fit it
    clients = FederationClients(
        fed, model=torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)), local_steps=1, random_state=0
    )
    grid = LocalGrid(clients.client_app(), n, seed=0)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={"num-clients": n})
    namespace["main"](grid, context)

    (strategy, rounds, kw) = started[0]
    assert rounds == 200 and kw["records_path"] == "rounds.jsonl"
    assert type(strategy.selector).__name__ == "FedCorSelector" and strategy.n_clients == n
    assert len(strategy.rounds_) == SHORT and all(len(r.reported) == 5 for r in strategy.rounds_)
    assert len((tmp_path / "rounds.jsonl").read_text().splitlines()) == SHORT
