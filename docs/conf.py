"""Sphinx configuration of the fedselect documentation.

Build (warnings are errors, as in CI)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Add ``-D plot_gallery=0`` to skip running the examples. Then look at the pages as a reader
does: ``python docs/check_rendered.py docs/_build/html`` opens each one in headless Chromium
and fails on theme error boxes, system messages, broken images and tracebacks. Cross-links to Python, NumPy,
scikit-learn and PyTorch need the network; they are off unless
``FEDSELECT_DOCS_INTERSPHINX=1`` is set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Document the source tree even when fedselect is not installed; the DivFL plugin's page
# documents plugins/fedselect-divfl from its source tree too (it need not be installed).
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins" / "fedselect-divfl" / "src"))
# docs/_ext: the CLI-reference and parameter-table directives (fedselect_docs) and the
# scripts drawing the build-time figures (scheme_figures, landing_figure).
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

import fedselect

project = "fedselect"
author = "fedselect developers"
copyright = "2026, fedselect developers"
release = fedselect.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "myst_parser",
    "matplotlib.sphinxext.plot_directive",
    "fedselect_docs",
]

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "auto_examples/*.ipynb", "auto_examples/*.py",
                    "auto_examples/*.zip", "auto_examples/*.md5"]
templates_path: list[str] = []
default_role = "literal"

# -- autodoc / autosummary / numpydoc -------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "inherited-members": False, "show-inheritance": True}
autodoc_typehints = "none"  # numpydoc sections already give the types
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = False

# -- intersphinx (needs the network, so opt-in) ----------------------------------------
if os.environ.get("FEDSELECT_DOCS_INTERSPHINX") == "1":
    extensions.append("sphinx.ext.intersphinx")
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "numpy": ("https://numpy.org/doc/stable", None),
        "sklearn": ("https://scikit-learn.org/stable", None),
        "torch": ("https://docs.pytorch.org/docs/stable", None),
    }

# -- Sphinx-Gallery ----------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "image_scrapers": ("matplotlib",),
    "download_all_examples": False,
    "within_subsection_order": "FileNameSortKey",
    "remove_config_comments": True,
    "show_memory": False,
}

# -- Figures drawn at build time (matplotlib's plot directive) ---------------------------
# Nothing here is a committed PNG: every figure is drawn while the docs build.
# * docs/selectors/*.rst: one figure per scheme, docs/_ext/scheme_figures.py, each scheme run
#   for 60 rounds on a 40-client SyntheticOracle (seconds; FedCor's GP fits are the slowest).
# * index.rst: the landing picture, docs/_ext/landing_figure.py, read from the recorded runs
#   in benchmarks/results/fedcor-fmnist-1spc/runs (gzipped JSON; a few seconds).
# The directive caches its PNGs in the build directory and redraws one when its page or
# script changes.
plot_formats = [("png", 100)]
plot_html_show_formats = False
plot_html_show_source_link = False
plot_include_source = False
plot_rcparams = {"savefig.bbox": "tight"}

# -- Reproductions: the recorded reports of benchmarks/results, copied into the doc tree -----
# The reports are Markdown written by the benchmark scripts next to their figures; copying
# each report with the PNGs beside it keeps their relative image links valid.
REPORTS = {
    "fedcor": "REPORT.md",
    "fedcor-diagnostics": "DIAGNOSTICS.md",
    "hcsfed": "REPORT.md",
    "hcsfed-calibrated": "REPORT.md",
    "ldcs": "REPORT.md",
}
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_heading_anchors = 2


def _copy_reports() -> None:
    import shutil

    dest_root = Path(__file__).resolve().parent / "reproductions"
    for name, report in REPORTS.items():
        src = ROOT / "benchmarks" / "results" / name
        dest = dest_root / name
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        if not (src / report).exists():
            missing = f"`benchmarks/results/{name}/{report}` is missing"
            (dest / "REPORT.md").write_text(f"# {name}\n\nNot recorded yet: {missing}.\n")
            continue
        shutil.copy2(src / report, dest / "REPORT.md")
        for png in src.rglob("*.png"):
            if "runs" in png.relative_to(src).parts:
                continue
            target = dest / png.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(png, target)


_copy_reports()

# -- HTML ----------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"fedselect {release}"
html_static_path: list[str] = []


def _skip_member(app, what, name, obj, skip, options):
    # scikit-learn adds metadata-routing setters (``set_fit_request`` ...) to every
    # estimator subclass; they are not fedselect API and their docstrings cross-link
    # into scikit-learn's own glossary.
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
