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
        end = min((text.index(f"\nfedselect {other}\n") for other in subparsers.choices
                   if text.index(f"\nfedselect {other}\n") > start), default=len(text))
        section = text[start:end]
        for action in sub._actions:
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


@pytest.mark.skipif(not any(shutil.which(b) for b in ("chromium", "chromium-browser")),
                    reason="needs chromium (apt-get install chromium)")
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
    assert kinds == {("bad.html", "theme error box"), ("bad.html", "broken image"),
                     ("bad.html", "docutils system message"), ("bad.html", "traceback in executed output")}
    assert check.main([str(tmp_path), "--browser", browser]) == 1
    (tmp_path / "bad.html").unlink()
    assert check.main([str(tmp_path), "--browser", browser]) == 0
