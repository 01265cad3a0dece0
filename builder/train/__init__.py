"""The training stage's command and its check: :mod:`builder.train.shapes` (the default
``verl.trainer.main_ppo`` command as data keyed by the verl version), :mod:`builder.train.incheck`
(the checker that runs inside the image with the image's verl, shipped as one zip application:
:func:`checker_bytes`) and :mod:`builder.train.check` (the host side: run the checker through
the engine, read its verdict). docs/train-check.md."""

from __future__ import annotations

import functools
import io
import zipfile
from pathlib import Path

from builder.train.incheck import SCHEMA
from builder.train.shapes import (TrainShapeError, default_command, hydra_overrides, logger_env,
                                  parse_override, target_rollout, target_verl)

CHECKER_SOURCE = Path(__file__).resolve().parent / "incheck"
CHECKER_NAME = "incheck.pyz"  # the file the image, the SIF's run and the Slurm job run
# inside the zip: the package under a name no image's own module has, and what runs it
PACKAGE = "verl_env_incheck"
ENTRY = f"import sys\n\nfrom {PACKAGE}.main import main\n\nsys.exit(main())\n"


@functools.cache
def checker_bytes() -> bytes:
    """The in-image checker, one zip application: ``python3 incheck.pyz --nnodes N
    --gpus-per-node G -- <the main_ppo hydra overrides>`` prints one JSON verdict (exit 0
    pass, 1 rejected, 3 could not run). The same bytes from the same sources on every host
    (stored, not compressed; fixed times and modes), so a job script renders the same; the
    stdlib's ``zipapp.create_archive`` stamps each file's mtime and takes no package prefix."""
    members = [(f"{PACKAGE}/{f.name}", f.read_bytes())
               for f in sorted(CHECKER_SOURCE.glob("*.py"))]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in [("__main__.py", ENTRY.encode()), *members]:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return out.getvalue()


__all__ = ["CHECKER_NAME", "SCHEMA", "TrainShapeError", "checker_bytes", "default_command",
           "hydra_overrides", "logger_env", "parse_override", "target_rollout", "target_verl"]
