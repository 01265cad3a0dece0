"""The bytecode stage's script (dockerfiles/native_bytecode.py), run as the build runs it, on
this host's interpreters: its byte code is the bytes ``uv pip install --compile-bytecode``
writes, it compiles only what has no current byte code (no layer rewrites another's), and the
launcher it writes starts the interpreter through its own loader from where the stage is
mounted. The build under emulation that uses it: tests/pipeline/test_arm64.py."""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder import shipped

# a program of the build, beside the templates (no module of the tool): loaded from its file
_SPEC = importlib.util.spec_from_file_location("native_bytecode",
                                               shipped.dockerfiles_dir() / "native_bytecode.py")
assert _SPEC is not None and _SPEC.loader is not None
nb = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(nb)

ENV = {"SOURCE_DATE_EPOCH": "315532800", "PYC_INVALIDATION_MODE": "CHECKED_HASH"}


def _pip_wheel() -> Path:
    """This interpreter's own pip wheel, where the image's venv step finds one (WHEEL_PKG_DIR,
    Debian's python-wheels, ensurepip's bundle)."""
    import ensurepip
    import sysconfig

    dirs = [sysconfig.get_config_var("WHEEL_PKG_DIR") or "", "/usr/share/python-wheels",
            os.path.join(os.path.dirname(ensurepip.__file__), "_bundled")]
    found = [w for d in dirs if d for w in sorted(glob.glob(os.path.join(d, "pip-*.whl")))]
    assert found, f"no pip wheel for this interpreter in {dirs}"
    return Path(found[0])


def _pycs(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.pyc"))}


def _site(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def test_the_same_bytes_as_uvs_compile_and_only_what_is_stale(tmp_path: Path) -> None:
    if shutil.which("uv") is None:
        pytest.skip("uv not on PATH")
    wheel = _pip_wheel()
    venv = tmp_path / "venv"
    env = {**os.environ, **ENV, "TMPDIR": str(tmp_path)}
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True,
                   env=env)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                    "--cache-dir", str(tmp_path / "cache"), "--no-index", "--find-links",
                    str(wheel.parent), "--compile-bytecode", "pip"], check=True, env=env)
    site = _site(venv)
    by_uv = _pycs(site)
    assert len(by_uv) > 400  # pip's modules, compiled
    for cache in site.rglob("__pycache__"):
        shutil.rmtree(cache)
    script = tmp_path / "compile.py"
    script.write_bytes(shipped.native_bytecode_script())
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    proc = subprocess.run([sys.executable, "-I", "-S", str(script), "--expect", version,
                           str(site)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"bytecode: {len(by_uv)} of {len(by_uv)} modules compiled by Python" in proc.stdout
    assert _pycs(site) == by_uv

    # a second run writes nothing; one changed source is compiled again, alone
    stamps = {p: p.stat().st_mtime_ns for p in site.rglob("*.pyc")}
    changed = site / "pip" / "__init__.py"
    changed.write_text(changed.read_text() + "\n# changed\n")
    proc = subprocess.run([sys.executable, "-I", "-S", str(script), "--expect", version,
                           str(site)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "bytecode: 1 of 1 modules" in proc.stdout, proc.stdout
    rewritten = [p for p, ns in stamps.items() if p.stat().st_mtime_ns != ns]
    assert [p.parent.parent / p.name.split(".")[0] for p in rewritten] == [site / "pip" / "__init__"]
    assert nb.stale([str(site)], nb.MODES["CHECKED_HASH"]) == []


def test_the_wrong_python_or_directory_is_one_line(tmp_path: Path) -> None:
    script = tmp_path / "compile.py"
    script.write_bytes(shipped.native_bytecode_script())
    proc = subprocess.run([sys.executable, "-I", "-S", str(script), "--expect", "2.7",
                           str(tmp_path)], capture_output=True, text=True)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert proc.returncode == 1
    assert proc.stderr == (f"bytecode: this interpreter is Python {version}, the image's is 2.7: "
                           "byte code is per Python version (base.bytecode_image must have "
                           "python2.7)\n")
    proc = subprocess.run([sys.executable, "-I", "-S", str(script), "--expect", version,
                           str(tmp_path / "nope")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr == f"bytecode: no such directory: {tmp_path / 'nope'}\n"
    proc = subprocess.run([sys.executable, "-I", "-S", str(script), "--expect", version,
                           str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "PYC_INVALIDATION_MODE": "SOMETIMES"})
    assert proc.returncode == 1 and "PYC_INVALIDATION_MODE='SOMETIMES' is none of" in proc.stderr


def test_the_launcher_runs_the_interpreter_through_its_own_loader(tmp_path: Path) -> None:
    """The stage's root seen under a mount point, as an install step sees it: the launcher runs
    the loader ``ldd`` names for this interpreter, with its libraries' directories, on the
    interpreter, every path under the mount point; the interpreter finds its standard library
    from there and compiles."""
    if shutil.which("ldd") is None:
        pytest.skip("no ldd on this host")
    stage = tmp_path / "stage"
    script = stage / "opt" / "verl-env-bytecode" / "compile.py"
    script.parent.mkdir(parents=True)
    script.write_bytes(shipped.native_bytecode_script())
    mount = tmp_path / "mnt"
    launcher = stage / "opt" / "verl-env-bytecode" / "python"
    # written as the bytecode stage writes it: the script at its place in the stage
    proc = subprocess.run([sys.executable, "-I", "-S", "-c",
                           "import runpy, sys; sys.argv = sys.argv[1:]; "
                           "runpy.run_path(sys.argv[0], run_name='__main__')",
                           str(script), "--launcher", str(launcher), "--mount", str(mount)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = launcher.read_text()
    loader, dirs = nb.loader_and_libraries(os.path.realpath(sys.executable))
    assert f"exec {mount}{loader} --library-path " in text
    assert all(f"{mount}{d}" in text for d in dirs)
    assert f" -I -S {mount}{script}" in text
    assert os.access(launcher, os.X_OK)
    # the mount: every top-level directory of this host's root, as links, so that each path the
    # launcher names exists only under the mount point's prefix
    mount.mkdir()
    for entry in os.listdir("/"):
        (mount / entry).symlink_to(f"/{entry}")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text("VALUE = 1\n")
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    proc = subprocess.run([str(launcher), "--expect", version, str(pkg)], capture_output=True,
                          text=True, env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stderr
    assert "bytecode: 1 of 1 modules compiled by Python" in proc.stdout
    assert nb.stale([str(pkg)], nb.MODES["CHECKED_HASH"]) == []
