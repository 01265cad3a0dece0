"""The installed-distributions reader (builder.audit.installed) on directory trees, and run as
the image runs it: the module's source handed to a real interpreter, whose own packages it
must find with the versions importlib.metadata reports."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from builder.audit import installed
from tests.audit.conftest import dist_info


def _names(dists: list[dict[str, str]]) -> dict[str, str]:
    return {d["name"]: d["version"] for d in dists}


def test_a_root_file_system_every_python_path_not_only_one(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    dist_info(root / "opt/venv/lib/python3.12/site-packages", "torch", "2.6.0")
    dist_info(root / "usr/lib/python3/dist-packages", "cryptography", "3.4.8")
    dist_info(root / "usr/local/lib/python3.12/site-packages", "Jinja2", "3.1.2")
    egg = root / "usr/lib/python3/dist-packages/legacy-0.1.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: legacy\nVersion: 0.1\n")
    (root / "usr/lib/python3/dist-packages/single-1.2.egg-info").write_text(
        "Metadata-Version: 1.1\nName: single\nVersion: 1.2\n")
    (root / "usr/lib/python3/dist-packages/not_metadata").mkdir()
    dists = installed.read_tree(str(root))
    assert _names(dists) == {"torch": "2.6.0", "cryptography": "3.4.8", "Jinja2": "3.1.2",
                             "legacy": "0.1", "single": "1.2"}
    paths = {d["name"]: d["path"] for d in dists}
    assert paths["torch"] == "/opt/venv/lib/python3.12/site-packages/torch-2.6.0.dist-info"


def test_metadata_wins_over_the_directory_name_which_is_the_fallback(tmp_path: Path) -> None:
    site = tmp_path / "venv/lib/python3.11/site-packages"
    dist_info(site, "Flash_Attn", "2.7.4", dirname="flash_attn-0.0.dist-info")
    dist_info(site, "x", "1", dirname="nometa-3.4.dist-info", metadata=False)
    assert _names(installed.read_tree(str(tmp_path / "venv"))) == {"Flash_Attn": "2.7.4",
                                                                   "nometa": "3.4"}


def test_the_in_image_script_finds_this_interpreters_packages() -> None:
    """The module's source run by an interpreter with ``-c`` (as the image runs it)."""
    script = Path(installed.__file__).read_text()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.split(installed.MARKER, 1)[1].strip().splitlines()[0])
    found = {d["name"].lower(): d["version"] for d in data["distributions"]}
    assert found["packaging"] == importlib.metadata.version("packaging")
    assert sys.executable in data["interpreters"]
