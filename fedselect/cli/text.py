"""reST and numpydoc as a terminal shows them: the help of a generated option, what `fedselect list` prints."""

from __future__ import annotations

import re

_ROLE = re.compile(r":[\w:.+-]+:`(~?)([^`<]*?)(?:\s*<([^>]*)>)?`")  # :class:`~a.B`, :ref:`text <target>`
_CITATION = re.compile(r"\s*\[(\w+)\]_")  # numpydoc's "[1]_"
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`__?")  # `text <url>`_
_FOOTNOTE = re.compile(r"^\.\. \[(\w+)\]\s*(.*)$")


def _role(match: re.Match[str]) -> str:
    tilde, text, target = match.groups()
    text = text.strip() or (target or "")
    return text.rsplit(".", 1)[-1] if tilde else text


def plain_text(text: str) -> str:
    """reST/numpydoc inline markup as a terminal shows it: roles, literals, emphasis, links, citations dropped.

    ``:class:`~fedselect.FederatedTrainer``` -> ``FederatedTrainer``, ````code```` -> ``code``,
    ``*Title*`` -> ``Title``, ```text <url>`_`` -> ``text``, ``Goetz et al. [1]_`` -> ``Goetz et al.``.
    """
    text = _CITATION.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _ROLE.sub(_role, text)
    text = re.sub(r"``(.+?)``", r"\1", text)
    text = re.sub(r"\*\*(.+?)\*\*|\*(.+?)\*", lambda m: m.group(1) or m.group(2), text)
    text = re.sub(r"(?<=\w)\\ ", "", text)  # reST's escaped space, as in "n\ :sub:`k`"
    return " ".join(text.split())


def _first_sentence(text: str) -> str:
    """The first sentence of a numpydoc description, as plain text; a long one up to its first colon or semicolon."""
    text = plain_text(text)
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z])", text, maxsplit=1)[0] if text else ""
    if len(first) > 160:
        head = re.split(r"[:;]\s", first, maxsplit=1)[0]
        first = head.rstrip(".") + "." if len(head) < len(first) else first
    return first


def _numpydoc_params(doc: str | None) -> dict[str, str]:
    """Parameter name -> the description under it, from a numpydoc ``Parameters`` section."""
    import inspect

    lines = inspect.cleandoc(doc or "").splitlines()
    out: dict[str, str] = {}
    try:
        start = next(
            i
            for i, line in enumerate(lines[:-1])
            if line.strip() == "Parameters" and set(lines[i + 1].strip()) == {"-"}
        )
    except StopIteration:
        return out
    names: list[str] = []
    for i in range(start + 2, len(lines)):
        line = lines[i]
        if i + 1 < len(lines) and line.strip() and set(lines[i + 1].strip()) == {"-"}:
            break  # the next section
        if line and not line[0].isspace():
            names = [n.strip() for n in line.split(":", 1)[0].split(",") if n.strip().isidentifier()]
            for name in names:
                out[name] = ""
        elif line.strip():
            for name in names:
                out[name] = f"{out[name]} {line.strip()}".strip()
    return out


def _doc_summary(doc: str) -> tuple[str, list[str]]:
    """A docstring's summary (its first paragraph) and the references it cites, as plain text."""
    import inspect

    doc = inspect.cleandoc(doc or "")
    summary = doc.split("\n\n", 1)[0]
    cited = _CITATION.findall(summary)
    notes: dict[str, str] = {}
    key = None
    for line in doc.splitlines():
        m = _FOOTNOTE.match(line)
        if m:
            key = m.group(1)
            notes[key] = m.group(2)
        elif key is not None and line.startswith("   ") and line.strip():
            notes[key] += " " + line.strip()
        else:
            key = None
    refs = [f"[{k}] {plain_text(notes[k])}" for k in dict.fromkeys(cited) if k in notes]
    return plain_text(summary), refs
