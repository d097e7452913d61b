"""The README's "Writing a selector plugin" recipe, built verbatim from the README.

Every code block of that section carries an HTML comment ``<!-- plugin-recipe: NAME -->`` on the
line before it: NAME is the file the block is (``pyproject.toml``, ``fedselect_mine/__init__.py``,
...) or ``commands`` for the shell block. This test writes the files into a temporary folder,
installs the package the way the README says (``pip install -e .``, here with
``--no-build-isolation --no-deps`` so no network is needed) into a throwaway virtual environment
that sees this environment's packages, and runs the README's commands there: ``fedselect list``
must list the new selector, a small ``fedselect compare`` must run it, and the README's conformance
test must pass. The environment running the tests is never modified (the throwaway environment
lives in ``tmp_path``), so other tests never see the plugin.
"""

from __future__ import annotations

import os
import re
import shlex
import site
import subprocess
import venv
from pathlib import Path

import pytest

import fedselect

ROOT = Path(fedselect.__file__).resolve().parents[1]  # the fedselect under test, put first on PYTHONPATH
README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Writing a selector plugin"
MARKER = re.compile(r"<!-- plugin-recipe: (\S+) -->\n```[a-z]*\n(.*?)\n```", re.S)


def recipe_blocks(text: str) -> dict[str, str]:
    """NAME -> the code block under ``<!-- plugin-recipe: NAME -->`` in the README's plugin section."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end >= 0 else None]
    blocks: dict[str, str] = {}
    for name, body in MARKER.findall(section):
        assert name not in blocks, f"README: two blocks marked plugin-recipe: {name}"
        blocks[name] = body + "\n"
    # Each marked block must be the code that follows its marker (no marker left dangling before prose).
    assert section.count("<!-- plugin-recipe:") == len(blocks), "README: a plugin-recipe marker without a code block"
    return blocks


def _throwaway_env(where: Path) -> Path:
    """A venv without pip whose interpreter also sees this interpreter's site-packages; its python."""
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(where)
    python = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    # addsitedir (not a bare path) so the outer .pth files (editable installs) are processed too.
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in outer)
    (Path(purelib) / "_outer_site.pth").write_text(lines)
    return python


def _argv(line: str, python: Path) -> list[str]:
    """A README command as run here: ``pip`` offline into the throwaway env, ``fedselect`` as a module."""
    words = shlex.split(line, comments=True)
    if words[:3] == ["pip", "install", "-e"]:
        return [str(python), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                *words[2:]]
    if words[0] == "fedselect":
        return [str(python), "-m", "fedselect.cli", *words[1:]]
    if words[0] == "python":
        return [str(python), *words[1:]]
    raise AssertionError(f"README plugin recipe: no rule to run {line!r} in this test; add one")


def test_the_readme_plugin_recipe_works_as_written(tmp_path):
    pytest.importorskip("setuptools", reason="the recipe's build backend (in fedselect's test extra)")
    blocks = recipe_blocks(README.read_text())
    assert {"pyproject.toml", "commands", "tests/test_conformance.py"} <= set(blocks), sorted(blocks)
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = None
    if tomllib is not None:  # a whole pyproject: what pip needs to build it
        meta = tomllib.loads(blocks["pyproject.toml"])
        assert meta["build-system"]["build-backend"]
        assert {"name", "version"} <= set(meta["project"])
        assert meta["project"]["entry-points"]["fedselect"]

    pkg = tmp_path / "fedselect-mine"
    for name, body in blocks.items():
        if name != "commands":
            (pkg / name).parent.mkdir(parents=True, exist_ok=True)
            (pkg / name).write_text(body)
    python = _throwaway_env(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("FEDSELECT_PLUGINS", "PYTHONPATH", "PIP_INDEX_URL")}
    env.update(PYTHONPATH=str(ROOT), MPLBACKEND="Agg", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONWARNINGS="ignore")

    outputs = []
    for line in blocks["commands"].splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        done = subprocess.run(_argv(line, python), cwd=pkg, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"README command {line!r} failed:\n{done.stdout}\n{done.stderr}"
        outputs.append((shlex.split(line)[:2], done.stdout))

    listed = next(out for words, out in outputs if words == ["fedselect", "list"])
    assert re.search(r"^  largest-loss +Train the n clients.*\n +plugin: largest-loss \(fedselect-mine\)$", listed,
                     re.M), listed
    table = next(out for words, out in outputs if words == ["fedselect", "compare"])
    assert re.search(r"^\| largest-loss \|", table, re.M), table
    runs = sorted(p.name for p in (pkg / "fedselect-results").glob("*/runs/largest-loss__seed*.json"))
    assert runs == ["largest-loss__seed0.json", "largest-loss__seed1.json"]
    tested = next(out for words, out in outputs if words[0] == "python")
    assert re.search(r"\b1 passed\b", tested), tested
