"""The documentation's generators and its rendered-page check (docs/_ext, docs/check_rendered.py)."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"

pytest.importorskip("sphinx")
pytest.importorskip("numpydoc")
sys.path.insert(0, str(DOCS / "_ext"))
fedselect_docs = pytest.importorskip("fedselect_docs")


def _load_check_rendered():
    spec = importlib.util.spec_from_file_location("check_rendered", DOCS / "check_rendered.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_lists_every_option_of_every_subcommand_with_its_default():
    from fedselect.cli import build_parser

    text = "\n".join(fedselect_docs.cli_rst())
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) >= {"list", "run", "compare", "reproduce"}
    for cmd, sub in subparsers.choices.items():
        start = text.index(f"\nfedselect {cmd}\n")
        end = min(
            (
                text.index(f"\nfedselect {other}\n")
                for other in subparsers.choices
                if text.index(f"\nfedselect {other}\n") > start
            ),
            default=len(text),
        )
        section = text[start:end]
        for action in sub._actions:
            if action.help == argparse.SUPPRESS:  # the former names of renamed options are hidden
                assert not any(f"``{flag}" in section for flag in action.option_strings), action.option_strings
                continue
            for flag in action.option_strings:
                assert f"``{flag}" in section, f"fedselect {cmd}: {flag} missing from the CLI reference"
            if action.option_strings and action.nargs != 0 and action.default not in (None, argparse.SUPPRESS):
                shown = repr(action.default) if isinstance(action.default, str) else str(action.default)
                assert f"``{shown}``" in section, f"fedselect {cmd}: default of {action.dest} not shown"


def test_parameter_table_has_every_constructor_parameter_and_refuses_an_undocumented_one():
    from fedselect.selectors.power_of_choice import PowerOfChoiceSelector

    text = "\n".join(fedselect_docs.params_rst(PowerOfChoiceSelector))
    assert "``d``" in text and "``random_state``" in text and "``None``" in text

    class Undocumented(PowerOfChoiceSelector):
        """A selector whose docstring forgets a parameter.

        Parameters
        ----------
        d : int
            Candidates.
        """

        def __init__(self, *, d=None, extra=1):
            self.d = d
            self.extra = extra

    with pytest.raises(ValueError, match="'extra'"):
        fedselect_docs.params_rst(Undocumented)


def test_every_installed_builtin_selector_has_a_scheme_page():
    import re

    import fedselect

    documented = set()
    for page in (DOCS / "selectors").glob("*.rst"):
        documented |= set(re.findall(r"^\.\. fedselect-params:: (\S+)$", page.read_text(), flags=re.M))
    for name in fedselect.list_selectors():
        cls = type(fedselect.get_selector(name))
        if cls.__module__.startswith("fedselect."):
            assert f"{cls.__module__}.{cls.__qualname__}" in documented, f"{name}: no page in docs/selectors"


@pytest.mark.skipif(
    not any(shutil.which(b) for b in ("chromium", "chromium-browser")),
    reason="needs chromium (apt-get install chromium)",
)
def test_check_rendered_reports_each_kind_of_problem_and_passes_a_clean_page(tmp_path):
    check = _load_check_rendered()
    browser = check.find_browser(None)
    (tmp_path / "index.html").write_text("<html><body><p>fine</p></body></html>")
    (tmp_path / "bad.html").write_text(
        "<html><head><style>.contents::before{content:'ERROR: a theme says no'}</style></head><body>"
        "<div class='contents'>toc</div><img src='missing.png'>"
        "<div class='system-message'>System Message: ERROR/3 Unknown directive</div>"
        "<div class='sphx-glr-script-out'><pre>Traceback (most recent call last):\nValueError</pre></div>"
        "</body></html>"
    )
    n_pages, found = check.check_site(tmp_path, browser)
    assert n_pages == 2
    kinds = {(page, kind) for page, kind, _ in found}
    assert kinds == {
        ("bad.html", "theme error box"),
        ("bad.html", "broken image"),
        ("bad.html", "docutils system message"),
        ("bad.html", "traceback in executed output"),
    }
    assert check.main([str(tmp_path), "--browser", browser]) == 1
    (tmp_path / "bad.html").unlink()
    assert check.main([str(tmp_path), "--browser", browser]) == 0


def test_remote_references_finds_scripts_and_stylesheets_off_the_machine_without_a_browser(tmp_path):
    check = _load_check_rendered()
    (tmp_path / "index.html").write_text(
        "<html><head><script src='_static/local.js'></script><link rel='stylesheet' href='_static/a.css'>"
        "<link rel='canonical' href='https://docs.example.org/'></head>"
        "<body><a href='https://example.org/'>a link is not loaded</a></body></html>"
    )
    assert check.remote_references(tmp_path) == []
    assert check.main([str(tmp_path), "--browser", str(tmp_path / "no-such-browser")]) == 2
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "page.html").write_text(
        "<html><head><script defer src='https://cdn.example.org/mathjax/tex-chtml.js'></script>"
        "<link rel='stylesheet' href='//cdn.example.org/theme.css'></head><body></body></html>"
    )
    assert check.remote_references(tmp_path) == [
        ("sub/page.html", "remote script", "<script> https://cdn.example.org/mathjax/tex-chtml.js"),
        ("sub/page.html", "remote script", "<link> //cdn.example.org/theme.css"),
    ]
    assert check.main([str(tmp_path), "--browser", str(tmp_path / "no-such-browser")]) == 1


def _local_mathjax(dest):
    """The docs' MathJax (from the docs extra) copied to ``dest/mathjax``; skips when it is not installed."""
    from importlib import metadata

    try:
        dist = metadata.distribution("sphinx-mathjax-offline")
    except metadata.PackageNotFoundError:
        pytest.skip("needs the docs extra's sphinx-mathjax-offline")
    src = Path(str(dist.locate_file("sphinx-mathjax-offline/static/mathjax")))
    shutil.copy2(src / "tex-chtml.js", dest / "tex-chtml.js")
    for sub in ("output/chtml/fonts/woff-v2", "input/tex/extensions"):
        shutil.copytree(src / sub, dest / sub)


@pytest.mark.skipif(
    not any(shutil.which(b) for b in ("chromium", "chromium-browser")),
    reason="needs chromium (apt-get install chromium)",
)
def test_check_rendered_reports_remote_requests_and_maths_that_did_not_render(tmp_path):
    check = _load_check_rendered()
    browser = check.find_browser(None)
    (tmp_path / "mathjax").mkdir()
    _local_mathjax(tmp_path / "mathjax")
    # MathJax typesets a second after the load event here, so the check must wait for it
    late = (
        "<script>window.MathJax = {startup: {pageReady: () => new Promise((r) => setTimeout(r, 1000))"
        ".then(() => MathJax.startup.defaultPageReady())}};</script>"
    )
    head = f"<html><head>{late}<script defer src='mathjax/tex-chtml.js'></script></head><body>"
    (tmp_path / "index.html").write_text(
        head + "<span class='math'>\\(\\sum_k p_k \\lVert w - o_k \\rVert^2\\)</span>"
        "<div class='math'>\\[\\boldsymbol{w}^{t+1} = \\frac{1}{n}\\]</div></body></html>"
    )
    n_pages, found = check.check_site(tmp_path, browser)
    assert (n_pages, found) == (1, [])  # typeset by the local MathJax, nothing fetched from elsewhere
    (tmp_path / "broken.html").write_text(head + "<span class='math'>\\(x^1^2\\)</span></body></html>")
    (tmp_path / "nomathjax.html").write_text("<html><body><span class='math'>\\(x^2\\)</span></body></html>")
    (tmp_path / "remote.html").write_text(
        "<html><body><img src='https://cdn.example.org/badge.png'>"
        "<script>document.head.appendChild(Object.assign(document.createElement('script'),"
        " {src: 'https://cdn.example.org/late.js'}))</script></body></html>"
    )
    _, found = check.check_site(tmp_path, browser)
    kinds = {(page, kind) for page, kind, _ in found}
    assert kinds == {
        ("broken.html", "maths error"),
        ("nomathjax.html", "unrendered maths"),
        ("remote.html", "request off the machine"),
        ("remote.html", "broken image"),
    }
    remote = sorted(m for page, kind, m in found if kind == "request off the machine")
    assert remote == ["Image: https://cdn.example.org/badge.png", "Script: https://cdn.example.org/late.js"]
