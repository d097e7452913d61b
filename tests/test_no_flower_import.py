import subprocess
import sys


def test_importing_fedselect_does_not_import_flower():
    code = (
        "import sys, fedselect, fedselect.simulation, fedselect.testing, fedselect.ledger, fedselect.cli; "
        "fedselect.list_selectors(); assert 'flwr' not in sys.modules, 'flwr imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
