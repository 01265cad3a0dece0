"""``build-env trust``: keys, signed attestations, and checking them."""

from __future__ import annotations

import argparse

from builder.trust import cli as lib

NAME = "trust"
HELP = "sign and check attestations"


def add_arguments(p: argparse.ArgumentParser) -> None:
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)
