"""``python -m fedselect.profiles convert-fedscale SRC DST``: see :func:`fedselect.profiles.fedscale.main`."""

from .fedscale import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
