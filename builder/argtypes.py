"""Argument types for the command line: bad numbers are refused by the parser, before anything
is rendered or built (``--expect-gpus -1`` once failed only after the whole build)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


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
