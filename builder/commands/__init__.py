"""One module per subcommand: its arguments (``add_arguments``) and its call into the library
(``run``), imported explicitly. Only :mod:`builder.cli` imports this package; nothing below a
command sees an argparse Namespace."""

from __future__ import annotations

from builder.commands import (build, check, cluster, completion, doctor, init, listing, lock,
                              propose, publish, render, reproduce, sif, slurm, sqsh, status,
                              train_check, trust, verify)

COMMANDS = (build, init, listing, check, lock, render, verify, sif, sqsh, publish, slurm, doctor,
            train_check, trust, cluster, status, completion, propose, reproduce)
BY_NAME = {m.NAME: m for m in COMMANDS}

__all__ = ["BY_NAME", "COMMANDS"]
