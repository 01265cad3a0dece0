"""``cpu.source_build.NAME`` imports each compiled module once: a package whose loader already
loaded its extension under another name (TransformerEngine loads
``transformer_engine/wheel_lib/transformer_engine_torch*.so`` as ``transformer_engine_torch``)
must not have it imported a second time, which a pybind11 module refuses ("DType is already
registered"). A real C extension that refuses a second initialisation stands in for it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EXT_C = r"""
#include <Python.h>
static int initialised = 0;
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "dupext_torch", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_dupext_torch(void) {
    if (initialised) {
        PyErr_SetString(PyExc_ImportError, "generic_type: type \"DType\" is already registered!");
        return NULL;
    }
    initialised = 1;
    return PyModule_Create(&def);
}
"""

# The package's loader, like transformer_engine/common/__init__.py: the extension by its path,
# under its own top-level name.
INIT_PY = """
import importlib.util, pathlib, sys
_so = next(pathlib.Path(__file__).parent.joinpath("wheel_lib").glob("dupext_torch*.so"))
_spec = importlib.util.spec_from_file_location("dupext_torch", _so)
_mod = importlib.util.module_from_spec(_spec)
sys.modules["dupext_torch"] = _mod
_spec.loader.exec_module(_mod)
"""

STEP = """
import json, sys
from builder.selftest.phases.cpu import source_build_step
from builder.selftest.phase import Run
arch = {"x86_64": "x86_64", "aarch64": "aarch64"}.get(__import__("platform").machine())
c = source_build_step("dupext").fn(Run(ctx={"manifest": {"arch": arch}}))
print(json.dumps({"status": c.status, "reason": c.reason}))
"""


def _site(tmp_path: Path, with_loader: bool) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in extension")
    site = tmp_path / "site"
    lib = site / "dupext" / "wheel_lib"
    lib.mkdir(parents=True)
    (site / "dupext" / "__init__.py").write_text(INIT_PY if with_loader else "")
    (lib / "__init__.py").write_text("")
    src = tmp_path / "ext.c"
    src.write_text(EXT_C)
    so = lib / f"dupext_torch{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run([cc, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                    str(src), "-o", str(so)], check=True, capture_output=True)
    info = site / "dupext-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dupext\nVersion: 1.0\n")
    files = ["dupext/__init__.py", "dupext/wheel_lib/__init__.py",
             f"dupext/wheel_lib/{so.name}", "dupext-1.0.dist-info/METADATA",
             "dupext-1.0.dist-info/RECORD"]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    return site


def _run_step(site: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_extension_loaded_by_its_package_is_not_imported_again(tmp_path: Path) -> None:
    c = _run_step(_site(tmp_path, with_loader=True))
    assert c["status"] == "pass", c["reason"]
    assert "dupext.wheel_lib.dupext_torch" in c["reason"]


def test_extension_without_a_loader_is_imported_by_its_path(tmp_path: Path) -> None:
    c = _run_step(_site(tmp_path, with_loader=False))
    assert c["status"] == "pass", c["reason"]


def test_stand_in_refuses_a_second_import(tmp_path: Path) -> None:
    """The stand-in really fails the way TE's extension does when imported twice."""
    site = _site(tmp_path, with_loader=True)
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", "import dupext, dupext.wheel_lib.dupext_torch"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "already registered" in out.stderr
