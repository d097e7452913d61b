"""``python -m fedselect.cli``: the ``fedselect`` command."""

import sys

from . import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
