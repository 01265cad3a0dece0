"""CLI logic in-process: phases, usage errors (exit 3), report assembly; and that the
package imports only the stdlib at import time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builder.selftest import cli
from builder.selftest.report import ReportMeta

from .helpers import PACKAGE, clean_env


def test_parse_phases() -> None:
    assert cli.parse_phases("all", False) == list(cli.PHASES)
    assert cli.parse_phases("ray,preflight", False) == ["preflight", "ray"]
    assert cli.parse_phases("all", True) == ["preflight", "env", "collective"]
    assert cli.parse_phases("imports", True) == ["imports", "collective"]
    with pytest.raises(cli.UsageError, match="unknown phase"):
        cli.parse_phases("preflight,gpus", False)
    with pytest.raises(cli.UsageError):
        cli.parse_phases(",", False)


@pytest.fixture
def manifest(tmp_path: Path) -> str:
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps({"schema": "verl-env/manifest/v1", "accelerator": "cpu",
                             "pins": {}, "imports": {}}))
    return str(p)


@pytest.mark.parametrize("args, word", [
    (["--expect-gpus", "lots"], "--expect-gpus"),
    (["--bw-size", "1X"], "--bw-size"),
    (["--gloo-ranks", "0"], "--gloo-ranks"),
    (["--bw-fail-frac", "0.95"], "--bw-fail-frac"),
    (["--launcher", "mpirun"], "invalid choice"),
    (["--phases", "warp"], "unknown phase"),
    (["--coverage-root", "/nonexistent/site"], "--coverage-root /nonexistent/site: not a "
                                               "directory"),
])
def test_usage_errors_exit_3(args: list[str], word: str, manifest: str, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert cli.main(["--manifest", manifest, "--json", str(out), *args]) == 3
    assert word in capsys.readouterr().err
    if args[0] != "--launcher":           # parse errors happen before --json is known
        data = json.loads(out.read_text())
        assert data["overall"] == "error" and data["checks"] == []


def test_missing_manifest_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--manifest", str(tmp_path / "none.json")]) == 3
    assert "manifest not found" in capsys.readouterr().err


def test_bad_launcher_env_exit_3(manifest: str, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert cli.main(["--manifest", manifest]) == 3
    assert "MASTER_ADDR" in capsys.readouterr().err


def test_meta_from_facts() -> None:
    meta = ReportMeta(started="t", duration_s=0, host="h")
    facts = {"platform.machine": "aarch64", "versions.torch": "2.13.0", "versions.hip": None,
             "platform.gpus": [{"index": 0}, {"index": 1}], "report.transport": "IB",
             "report.world_size": 16, "cpu.gloo_world": 2, "cpu.gloo_transport": "gloo/tcp"}
    cli._meta_from_facts(meta, facts, {"accelerator": "cuda", "arch": "aarch64"}, 2)
    assert meta.platform["machine"] == "aarch64" and meta.platform["gpu_count"] == 2
    assert meta.versions == {"torch": "2.13.0"}
    assert meta.transport == "IB" and meta.world_size == 16
    meta2 = ReportMeta(started="t", duration_s=0, host="h")
    cli._meta_from_facts(meta2, {"cpu.gloo_world": 4, "cpu.gloo_transport": "gloo/tcp"},
                         {"accelerator": "cpu"}, None)
    assert meta2.transport == "gloo/tcp" and meta2.world_size == 4


def test_package_imports_only_stdlib(tmp_path: Path) -> None:
    """Every module imports with a bare interpreter (no torch/ray/packaging needed), using
    relative imports only, under the in-image name verl_env_selftest."""
    (tmp_path / "verl_env_selftest").symlink_to(PACKAGE)
    mods = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__main__")
    code = ("import sys, importlib\n"
            f"for m in {mods!r}:\n"
            "    name = 'verl_env_selftest' + ('' if m == '__init__' else '.' + m)\n"
            "    importlib.import_module(name)\n"
            "bad = [m for m in ('torch', 'ray', 'tensordict', 'packaging', 'builder') "
            "if m in sys.modules]\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env=clean_env(PYTHONPATH=str(tmp_path)), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
    for path in PACKAGE.glob("*.py"):
        text = path.read_text()
        assert "from builder" not in text and "import builder" not in text, path


def test_help_runs(tmp_path: Path) -> None:
    (tmp_path / "verl_env_selftest").symlink_to(PACKAGE)
    out = subprocess.run([sys.executable, "-m", "verl_env_selftest", "--help"],
                         capture_output=True, text=True, env=clean_env(PYTHONPATH=str(tmp_path)))
    assert out.returncode == 0
    for flag in ("--phases", "--expect-gpus", "--strict", "--json", "--manifest", "--bw-size",
                 "--bw-ref", "--timeout"):
        assert flag in out.stdout
