"""Argument types for the command line: bad numbers and strings are refused by the parser, before
anything is rendered or built (``--expect-gpus -1`` once failed only after the whole build; a
``--base-image`` holding a newline once rendered an instruction of its own)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

from builder.matrix import grammar


def _number(kind: Callable[[str], float], what: str, minimum: float
            ) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum or value != value:  # NaN compares false
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in its message
    return parse


non_negative_int = _number(int, "an integer >= 0", 0)
positive_int = _number(int, "an integer >= 1", 1)
positive_float = _number(float, "a number > 0", 1e-9)


# --- strings that reach the Dockerfile or the build's configuration: each against its grammar
# (builder.matrix.grammar), refused by the parser in one line (exit 2) before anything is read.


def _grammar(check: Callable[[str], str], what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return check(text)
        except grammar.GrammarError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = what
    return parse


image_reference = _grammar(grammar.oci_reference, "an image reference")
index_url = _grammar(lambda s: grammar.url(s, ("https", "http", "file")), "an index URL")
_SET_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", re.ASCII)


def assignment(text: str) -> str:
    """``KEY=VALUE`` for ``--set``: a dotted key, a plain single-line value (the value is then
    held to the grammar of the matrix key it sets)."""
    key, eq, value = text.partition("=")
    if not eq or not _SET_KEY.fullmatch(key):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with a dotted KEY "
                                         f"(packages.verl=0.9.1), got {text!r}")
    try:
        grammar.plain(value)
    except grammar.GrammarError as exc:
        raise argparse.ArgumentTypeError(f"{key}: {exc}") from None
    return text


def file_path(text: str) -> Path:
    """A path (``--ca-bundle``, ``--templates``): no control characters or line separators."""
    try:
        return Path(grammar.path(text))
    except grammar.GrammarError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


assignment.__name__ = "KEY=VALUE"
file_path.__name__ = "a path"
