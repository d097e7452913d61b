"""Sphinx directives of the fedselect documentation, generated from the code at build time.

``.. fedselect-cli::``
    The reference of the ``fedselect`` command: every subcommand's usage, description and
    options (flags, metavar, help text and default), read from the argument parser that
    :func:`fedselect.cli.build_parser` builds, so the page cannot drift from ``--help``.

``.. fedselect-params:: dotted.path.ToClass``
    A table of a class's constructor parameters: the name, the default from the signature,
    and the type and description from the numpydoc ``Parameters`` section of its docstring.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _cell(text: str, indent: str) -> list[str]:
    """A list-table cell: the first line after ``- ``, the others indented under it."""
    lines = text.strip().splitlines() or [""]
    return [f"{indent}- {lines[0]}"] + [f"{indent}  {line}" if line.strip() else "" for line in lines[1:]]


def _literal(text: str) -> str:
    return f"``{text}``" if text else ""


# --------------------------------------------------------------------------- the CLI


def _option_strings(action: argparse.Action) -> str:
    if not action.option_strings:
        return _literal(action.metavar or action.dest)
    if action.nargs == 0:
        return ", ".join(_literal(s) for s in action.option_strings)
    metavar = action.metavar
    if metavar is None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
    if action.nargs in ("+", "*"):
        metavar = f"{metavar} [{metavar} ...]"
    return ", ".join(_literal(f"{s} {metavar}") for s in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or not action.option_strings:  # flags and positionals
        return ""
    if action.default is None or action.default is argparse.SUPPRESS:
        return ""
    return _literal(repr(action.default) if isinstance(action.default, str) else str(action.default))


def _rst_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("|", "\\|").replace("_", "\\_")


# In a help text, `quoted` spans and --options become literals (so "--out" is not typeset as a dash).
_CODE = re.compile(r"`([^`]+)`|(?<![\w-])(--?[A-Za-z][\w-]*)")


def _plain_to_rst(text: str) -> str:
    """A terminal help text as RST: its words kept, RST's meaning dropped, options and `code` as literals."""
    out, pos = [], 0
    for m in _CODE.finditer(text):
        out.append(_rst_escape(text[pos:m.start()]))
        code = m.group(1) or m.group(2)
        out.append(f"``{code}``" if m.start() == 0 or text[m.start() - 1] in " (/[" else f"\\ ``{code}``")
        pos = m.end()
    out.append(_rst_escape(text[pos:]))
    return "".join(out)


def _help_text(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {"default": action.default, "prog": "fedselect", "choices": action.choices}
    choices = ""
    if action.choices and action.option_strings:
        choices = (" " if text else "") + "One of: " + ", ".join(_literal(str(c)) for c in action.choices) + "."
    return (_plain_to_rst(text) + choices) if text or choices else "(no help text)"


def _actions_table(title: str, actions: list[argparse.Action]) -> list[str]:
    rows = [a for a in actions if a.help is not argparse.SUPPRESS]
    if not rows:
        return []
    out = [f".. list-table:: {title}", "   :header-rows: 1", "   :widths: 30 50 20", "",
           "   * - option", "     - meaning", "     - default"]
    for a in rows:
        out += ["   * - " + _option_strings(a)]
        out += _cell(_help_text(a), "     ")
        out += _cell(_default(a), "     ")
    return [*out, ""]


def _parser_rst(parser: argparse.ArgumentParser, name: str, underline: str) -> list[str]:
    usage = parser.format_usage().strip()
    if usage.startswith("usage: "):
        usage = usage[len("usage: "):]
    out = [name, underline * len(name), "", ".. code-block:: text", ""]
    out += ["   " + line for line in usage.splitlines()] + [""]
    if parser.description:
        out += [_plain_to_rst(" ".join(parser.description.split())), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._SubParsersAction)]
        out += _actions_table(group.title or "options", actions)
    return out


def cli_rst() -> list[str]:
    """The whole CLI reference as reStructuredText lines."""
    from fedselect.cli import build_parser

    parser = build_parser()
    out = _parser_rst(parser, "fedselect", "-")
    if parser.epilog:
        out += [".. code-block:: text", ""] + ["   " + line for line in parser.epilog.splitlines()] + [""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for cmd, sub in action.choices.items():
                out += _parser_rst(sub, f"fedselect {cmd}", "-")
                if helps.get(cmd) and not sub.description:
                    out += [_plain_to_rst(helps[cmd]), ""]
    return out


class CliDirective(SphinxDirective):
    """``.. fedselect-cli::``: the reference of every subcommand of ``fedselect``."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        import fedselect.cli

        for path in sorted(Path(fedselect.cli.__file__).parent.glob("*.py")):  # the parser and its options
            self.env.note_dependency(str(path))
        self.env.note_dependency(__file__)
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(cli_rst(), source="fedselect.cli.build_parser"), node)
        return node.children


# --------------------------------------------------------------------------- parameter tables


def params_rst(cls: type) -> list[str]:
    """The constructor parameters of ``cls`` as a list-table."""
    from numpydoc.docscrape import NumpyDocString

    doc = NumpyDocString(inspect.getdoc(cls) or "")
    described = {}
    for p in doc["Parameters"]:
        for name in p.name.split(","):
            described[name.strip()] = p
    sig = inspect.signature(cls.__init__)
    out = [".. list-table::", "   :header-rows: 1", "   :widths: 20 18 62", "",
           "   * - parameter", "     - default", "     - meaning"]
    for name, param in sig.parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = "" if param.default is param.empty else _literal(repr(param.default))
        p = described.get(name)
        if p is None:
            raise ValueError(f"fedselect-params: {cls.__qualname__}.__init__ has parameter {name!r} that its "
                             "docstring's Parameters section does not describe")
        ptype = re.sub(r",?\s*default\s*[=:].*$", "", p.type or "").strip()
        text = f"*{ptype}*" if ptype else ""
        body = textwrap.dedent("\n".join(p.desc)).strip()
        text = f"{text}. {body}" if text and body else text or body
        out += ["   * - " + _literal(name), *_cell(default, "     "), *_cell(text, "     ")]
    return [*out, ""]


class ParamsDirective(SphinxDirective):
    """``.. fedselect-params:: module.Class``: the constructor parameters of a class as a table."""

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        cls = _import(self.arguments[0])
        self.env.note_dependency(__file__)
        module = inspect.getmodule(cls)
        if module is not None and getattr(module, "__file__", None):
            self.env.note_dependency(module.__file__)
        node = nodes.container()
        self.state.nested_parse(StringList(params_rst(cls), source=self.arguments[0]), self.content_offset, node)
        return node.children


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("fedselect-cli", CliDirective)
    app.add_directive("fedselect-params", ParamsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
