"""Sphinx-Gallery's matplotlib scraper, saving each example's figures with a tight bounding box.

An example that sets a title wider than its figure, or puts a legend beside the axes, would
otherwise have it cut at the figure's edge in the gallery. docs/conf.py names
``fedselect_gallery.tight_matplotlib_scraper`` in ``sphinx_gallery_conf["image_scrapers"]``.
"""

from __future__ import annotations

from typing import Any

from sphinx_gallery.scrapers import matplotlib_scraper


def tight_matplotlib_scraper(block: Any, block_vars: Any, gallery_conf: Any, **kwargs: Any) -> str:
    """Sphinx-Gallery's matplotlib scraper with ``savefig(..., bbox_inches="tight")``."""
    kwargs.setdefault("bbox_inches", "tight")
    return matplotlib_scraper(block, block_vars, gallery_conf, **kwargs)
