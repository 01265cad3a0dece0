"""Helpers shared by the self-test's tests (imported by conftest and test modules)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "builder" / "selftest"
# Variables that would change what the self-test does if they leaked in from the caller.
SCRUB_PREFIXES = ("SLURM_", "NCCL_", "RAY_", "TORCHELASTIC_", "VERL_ENV_SELFTEST_")
SCRUB = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "GROUP_RANK", "ROLE_RANK", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HF_HOME",
         "HF_HUB_CACHE", "PYTHONPATH"}


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without launcher/NCCL/Ray variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in SCRUB and not k.startswith(SCRUB_PREFIXES)}
    env.update(extra)
    return env


def manifest_for(installed: dict[str, str], accelerator: str = "cpu",
                 names: tuple[str, ...] = ("torch", "tensordict", "ray"),
                 extra_pins: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    """A manifest pinning ``names`` at their installed versions (public part for torch)."""
    pins = {n: installed[n].split("+")[0] for n in names}
    pins.update(extra_pins or {})
    imports = {n: n.replace("-", "_") for n in pins}
    return {"schema": "verl-env/manifest/v1", "target": f"test-{accelerator}",
            "accelerator": accelerator, "arch": "x86_64", "python": "3.11",
            "cuda": "13.0" if accelerator == "cuda" else None, "rocm": None,
            "pins": pins, "provided": {}, "imports": imports,
            # as the build carries them from its catalogue
            "extensions": {n: e for n, e in catalog_manifest()["extensions"].items()
                           if n in imports},
            "checks": {n: c for n, c in catalog_manifest()["checks"].items() if n in imports},
            **fields}


@dataclass
class Result:
    """A finished self-test run."""

    rc: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None
    wall_s: float

    def check(self, cid: str) -> dict[str, Any]:
        """The record with this id (KeyError if absent)."""
        assert self.report is not None, self.stderr
        for c in self.report["checks"]:
            if c["id"] == cid:
                return c
        raise KeyError(cid)

    def ids(self) -> set[str]:
        """All check ids."""
        assert self.report is not None
        return {c["id"] for c in self.report["checks"]}


def catalog_manifest() -> dict[str, Any]:
    """The manifest sections the build carries from its catalogue for every catalogued
    distribution: ``abi_loader`` (what packages load themselves), ``extensions`` and
    ``checks``."""
    from builder import catalog

    cat = catalog.shipped()
    return {"abi_loader": cat.abi_loader(), "checks": cat.checks(cat.distributions),
            "extensions": {n: [list(c) for c in d.extensions]
                           for n, d in cat.distributions.items() if d.extensions}}


def loader_rules() -> Any:
    """The self-test's reading of the catalogue's loader rules (an image's manifest's)."""
    from builder.selftest.elf import abiload

    return abiload.rules(catalog_manifest())
