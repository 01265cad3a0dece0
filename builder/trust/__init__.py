"""Trust that travels: signed verdict, SBOM and provenance beside and inside every SIF.

``keys`` (key pairs), ``dsse`` (envelopes), ``statements`` (in-toto Statement v1), ``sbom``
(CycloneDX 1.6 of an image), ``sifraw``/``sifsig`` (the native Apptainer SIF signature),
``sign`` (sidecar + embedded objects), ``verify`` (the offline check), ``cli``.
"""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """``build-env trust``: the CLI dispatches ``builder.<command>.run``."""
    from builder.trust.cli import run as run_cli

    return run_cli(args)
