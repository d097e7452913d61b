import subprocess
import sys


def test_importing_fedselect_does_not_import_flower():
    code = (
        "import sys, fedselect, fedselect.simulation, fedselect.testing, fedselect.ledger, fedselect.cli; "
        "fedselect.list_selectors(); assert 'flwr' not in sys.modules, 'flwr imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_test_that_needs_flower_lives_under_tests_flower():
    """CI installs Flower only for ``pytest tests/flower``: a test elsewhere that skips without flwr never runs."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    outside = [
        str(p.relative_to(here))
        for p in here.rglob("*.py")
        if "flower" not in p.relative_to(here).parts and p.name != Path(__file__).name
        and ('importorskip("flwr")' in p.read_text() or "importorskip('flwr')" in p.read_text())
    ]
    assert outside == [], f"move these Flower tests under tests/flower: {outside}"
