"""One module per subcommand: its arguments (``add_arguments``) and its call into the library
(``run``). Only :mod:`builder.cli` imports this package; nothing below a command sees an argparse
Namespace. A command's module is imported when that command runs (or when the whole parser is
needed: ``--help``, ``completion``, a site's ``build-env.toml``): ``build-env check`` does not
start by importing the engine, the registry client and the renderer."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType

# command -> its module under builder.commands, in the order `--help` lists them
MODULES: Mapping[str, str] = {
    "build": "build", "init": "init", "list": "listing", "check": "check", "lock": "lock",
    "render": "render", "verify": "verify", "sif": "sif", "sqsh": "sqsh", "publish": "publish",
    "slurm": "slurm", "doctor": "doctor", "train-check": "train_check", "trust": "trust",
    "cluster": "cluster", "status": "status", "completion": "completion", "propose": "propose",
    "audit": "audit", "reproduce": "reproduce",
}


class _Commands(Mapping[str, ModuleType]):
    """Command name -> its module, imported on first use."""

    def __getitem__(self, name: str) -> ModuleType:
        module = importlib.import_module(f"{__name__}.{MODULES[name]}")
        if module.NAME != name:  # the table and the module disagree: a bug, never user input
            raise RuntimeError(f"builder.commands.{MODULES[name]} is {module.NAME!r}, not {name!r}")
        return module

    def __iter__(self) -> Iterator[str]:
        return iter(MODULES)

    def __len__(self) -> int:
        return len(MODULES)


BY_NAME: Mapping[str, ModuleType] = _Commands()

__all__ = ["BY_NAME", "MODULES"]
