import subprocess
import sys


def test_importing_fedselect_does_not_import_flower():
    code = (
        "import sys, fedselect, fedselect.simulation, fedselect.testing, fedselect.ledger, fedselect.cli; "
        "fedselect.list_selectors(); assert 'flwr' not in sys.modules, 'flwr imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ci_runs_every_test_that_needs_an_optional_package():
    """The first CI stage has no flwr, flwr-datasets or ray; the Flower stage installs them and runs the paths on its
    pytest line. A test elsewhere that skips without one of them would never run: name its file on that line."""
    import re
    from pathlib import Path

    here = Path(__file__).resolve().parent
    line = next(ln for ln in (here.parent / ".ci" / "run").read_text().splitlines()
                if ln.startswith("python -m pytest -q tests/flower"))
    covered = [here.parent / p for p in line.split()[4:]]
    needs = re.compile(r"importorskip\(\s*['\"](flwr|flwr_datasets|ray)['\"]")
    missed = [
        str(p.relative_to(here.parent))
        for p in here.rglob("*.py")
        if needs.search(p.read_text()) and not any(p == c or c in p.parents for c in covered)
    ]
    assert missed == [], f"add these files to the Flower stage's pytest line in .ci/run: {missed}"
