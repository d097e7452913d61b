"""What an option's text means: literals, ``name=value`` lists, counts, selector specs."""

from __future__ import annotations

import argparse
import ast
from typing import Any


def _value(text: str) -> Any:
    if text.lower() in ("true", "false"):  # replace=true as well as replace=True
        return text.lower() == "true"
    if text.lower() in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _jobs(text: str) -> int:
    if text.strip().lower() == "auto":
        return 0
    try:
        return _non_negative(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or 'auto', got {text!r}") from None


def _mapping(text: str) -> dict[Any, Any]:
    """``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}`` (values and keys read as Python literals where they are)."""
    out: dict[Any, Any] = {}
    for item in text.split(","):
        if "=" not in item:
            raise argparse.ArgumentTypeError(f"{item!r} in {text!r} must look like name=value")
        k, v = item.split("=", 1)
        key = _value(k.strip())
        if key in out:  # the last would win silently
            raise argparse.ArgumentTypeError(f"{text!r} repeats {key!r}; give each name once")
        out[key] = _value(v.strip())
    return out


def parse_selector_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``"name"`` or ``"name:p=v,q=w"`` (optionally ``"label=name:..."``) -> (label, name, params).

    The name is what follows the last ``=`` before the first ``:``, so a label may contain
    ``=`` (``"HCSFed (weighting=paper)=hcsfed:weighting=paper"``) but not ``:``.
    """
    label = None
    head, colon, rest = spec.partition(":")
    if "=" in head:
        label, head = head.rsplit("=", 1)
    spec = head + colon + rest
    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    if rest:
        for item in rest.split(","):
            if "=" not in item:
                raise argparse.ArgumentTypeError(f"selector parameter {item!r} in {spec!r} must look like name=value")
            k, v = item.split("=", 1)
            if k.strip() in params:  # the last would win silently
                raise argparse.ArgumentTypeError(f"{spec!r} repeats {k.strip()!r}; give each parameter once")
            params[k.strip()] = _value(v.strip())
    return label or (name if not params else f"{name}({rest})"), name, params
