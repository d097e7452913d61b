"""Sphinx configuration of the fedselect documentation.

Build (warnings are errors, as in CI)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Add ``-D plot_gallery=0`` to skip running the examples. Then look at the pages as a reader
does: ``python docs/check_rendered.py docs/_build/html`` opens each one in headless Chromium
and fails on theme error boxes, system messages, broken images, tracebacks, maths left
untypeset and any request for something off the machine (the built site reads offline).
Cross-links to Python, NumPy, scikit-learn and PyTorch need the network; they are off unless
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
# docs/_ext: the CLI-reference and parameter-table directives (fedselect_docs), the
# scripts drawing the build-time figures (scheme_figures, landing_figure) and the gallery's
# image scraper (fedselect_gallery).
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

exclude_patterns = [
    "_build",
    "Thumbs.db",
    ".DS_Store",
    "auto_examples/*.ipynb",
    "auto_examples/*.py",
    "auto_examples/*.zip",
    "auto_examples/*.md5",
]
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
    # matplotlib's scraper saving with a tight bounding box: a title or legend wider than its
    # figure is drawn whole, not cut at the edge (docs/_ext/fedselect_gallery.py)
    "image_scrapers": ("fedselect_gallery.tight_matplotlib_scraper",),
    "download_all_examples": False,
    "within_subsection_order": "FileNameSortKey",
    "remove_config_comments": True,
    "show_memory": False,
    # No computation-times pages: Sphinx-Gallery writes them with jQuery and DataTables from CDNs, and
    # the docs load nothing from off the machine (see "Maths without internet" below).
    "write_computation_times": False,
}
# Those pages from an earlier build would still be read (they are generated, never committed).
for _stale in [
    Path(__file__).resolve().parent / "sg_execution_times.rst",
    *(Path(__file__).resolve().parent / "auto_examples").rglob("sg_execution_times.rst"),
]:
    _stale.unlink(missing_ok=True)

# -- Figures drawn at build time (matplotlib's plot directive) ---------------------------
# Nothing here is a committed PNG: every figure is drawn while the docs build.
# * docs/selectors/*.rst: one figure per scheme, docs/_ext/scheme_figures.py, each scheme run
#   for 60 rounds on a 40-client SyntheticOracle (seconds; FedCor's GP fits are the slowest).
# * index.rst: the landing picture, docs/_ext/landing_figure.py, read from the recorded runs
#   in benchmarks/reproductions/fedcor/fedcor-fmnist-1spc/runs (gzipped JSON; a few seconds).
# The directive caches its PNGs in the build directory and redraws one when its page or
# script changes.
plot_formats = [("png", 100)]
plot_html_show_formats = False
plot_html_show_source_link = False
plot_include_source = False
plot_rcparams = {"savefig.bbox": "tight"}

# -- Reproductions: the recorded reports of benchmarks/reproductions, copied into the doc tree --
# The reports are Markdown written by the benchmark scripts next to their figures; copying
# each report with the PNGs beside it keeps their relative image links valid.
# Page name -> (its folder under benchmarks/reproductions, the report in it).
REPORTS = {
    "fedcor": ("fedcor", "REPORT.md"),
    "fedcor-diagnostics": ("fedcor/diagnostics", "DIAGNOSTICS.md"),
    "hcsfed": ("hcsfed", "REPORT.md"),
    "hcsfed-calibrated": ("hcsfed/calibrated", "REPORT.md"),
    "hcsfed-recalibrated": ("hcsfed/recalibrated", "REPORT.md"),
    "ldcs": ("ldcs", "REPORT.md"),
    "time": ("time", "REPORT.md"),
}
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_heading_anchors = 2


def _copy_reports() -> None:
    import shutil

    dest_root = Path(__file__).resolve().parent / "reproductions"
    for name, (folder, report) in REPORTS.items():
        src = ROOT / "benchmarks" / "reproductions" / folder
        dest = dest_root / name
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        if not (src / report).exists():
            missing = f"`benchmarks/reproductions/{folder}/{report}` is missing"
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
html_static_path = ["_static"]
html_css_files = ["fedselect.css"]  # wide tables wrap their code and scroll, figures fit the column

# -- Maths without internet ------------------------------------------------------------------
# The formulas are typeset in the reader's browser by MathJax 3.2.2 served from the built site
# itself (_static/mathjax), never from a CDN, so the docs read the same offline. MathJax comes
# from the pip package sphinx-mathjax-offline, pinned in the docs extra (MathJax is Apache-2.0;
# a NOTICE.txt saying so is written beside it). Rejected: sphinx.ext.imgmath (needs latex and
# dvipng, on neither a fresh machine nor CI), MathJax vendored into the repository (megabytes of
# minified JavaScript in git), MathML from latex2mathml (its look depends on the reader's math
# fonts). Only the CommonHTML component we load and what it loads on demand are copied: its web
# fonts, the TeX extensions it autoloads, the menu and the accessibility and speech modules
# (about 7 MB, not the package's 24 MB of alternative bundles). docs/check_rendered.py fails on
# any request a page makes off the machine and on formulas left untypeset or in error.
MATHJAX_DIST = "sphinx-mathjax-offline"
MATHJAX_VERSION = "0.0.2"  # ships MathJax 3.2.2
MATHJAX_FILES = ("tex-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions", "a11y", "sre", "ui")
mathjax_path = "mathjax/tex-chtml.js"  # relative: Sphinx serves it from _static


def _mathjax_source() -> Path:
    from importlib import metadata

    try:
        dist = metadata.distribution(MATHJAX_DIST)
    except metadata.PackageNotFoundError:
        raise RuntimeError(
            f"the docs typeset their maths with MathJax from the {MATHJAX_DIST} package, which is not "
            f'installed: pip install -e ".[docs]"'
        ) from None
    src = Path(str(dist.locate_file(f"{MATHJAX_DIST}/static/mathjax")))
    missing = [rel for rel in MATHJAX_FILES if not (src / rel).exists()]
    if dist.version != MATHJAX_VERSION or missing:
        raise RuntimeError(
            f"{MATHJAX_DIST} {dist.version} lacks {missing or 'nothing'}; docs/conf.py expects "
            f'{MATHJAX_VERSION}: pip install -e ".[docs]"'
        )
    return src


MATHJAX_SOURCE = _mathjax_source()  # fail at once, before a long build, when it is missing


def _copy_mathjax(app, exc) -> None:
    import shutil

    if exc is not None or app.builder.format != "html":
        return
    dest = Path(app.outdir) / "_static" / "mathjax"
    for rel in MATHJAX_FILES:
        src, target = MATHJAX_SOURCE / rel, dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
        else:
            shutil.copy2(src, target)
    (dest / "NOTICE.txt").write_text(
        "MathJax 3.2.2, copyright The MathJax Consortium, licensed under the Apache License, Version 2.0\n"
        "(https://www.apache.org/licenses/LICENSE-2.0). Copied from the Python package "
        f"{MATHJAX_DIST} {MATHJAX_VERSION}.\n"
    )


def _skip_member(app, what, name, obj, skip, options):
    # scikit-learn adds metadata-routing setters (``set_fit_request`` ...) to every
    # estimator subclass; they are not fedselect API and their docstrings cross-link
    # into scikit-learn's own glossary.
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("build-finished", _copy_mathjax)
