"""Issue 38, ``verify``'s messages through the installed ``build-env``: ``--timeout 0`` refused
before any engine call (no engine needed: the test listens where the engine would be and sees
no one come); with the test session's dockerd, an image without a verl-env manifest told what
``verify`` accepts, and a real gate's text output saying what the ABI and coverage phases read,
with a progress line before the container starts and one per phase (none with ``--json``)."""

from __future__ import annotations

import io
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_build_env


@pytest.mark.parametrize("argv", [["--timeout", "0"], ["--timeout", "-5"], ["--timeout=-5"],
                                  ["--timeout", "nan"]])
def test_verify_timeout_not_above_zero_is_refused_before_the_engine(argv: list[str],
                                                                    tmp_path: Path) -> None:
    path = tmp_path / "engine.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as engine:
        engine.bind(str(path))
        engine.listen(8)
        engine.setblocking(False)
        proc = run_build_env("verify", "debian:bookworm", *argv, timeout=120,
                             env={"DOCKER_HOST": f"unix://{path}", "DOCKER_CONTEXT": ""})
        with pytest.raises(BlockingIOError):
            engine.accept()  # nothing asked the engine anything
    assert proc.returncode == 2, proc.stdout + proc.stderr
    value = argv[-1].split("=")[-1]
    assert f"--timeout: expected a number > 0, got {value!r}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr


@pytest.fixture
def no_manifest_image(cpu_image: dict, docker_host: str) -> Iterator[str]:
    """The CPU fixture image without its baked manifest: a Python image verl-env knows nothing
    about (a plain base has no Python: the gate would stop before the self-test reads one)."""
    import docker

    client = docker.from_env()
    tag = "verl-env-test/no-manifest:38c"
    text = f"FROM {cpu_image['image_id']}\nRUN rm /opt/verl-env/manifest.json\n"
    client.images.build(fileobj=io.BytesIO(text.encode()), tag=tag, rm=True, network_mode="none")
    try:
        yield tag
    finally:
        client.images.remove(tag, force=True)


@pytest.mark.docker
@pytest.mark.network
def test_verify_an_image_without_a_manifest_names_verifys_own_options(
        no_manifest_image: str) -> None:
    proc = run_build_env("verify", no_manifest_image, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 3, text
    assert "--manifest" not in text and "no verl-env manifest" in text, text
    assert f"build-env verify {no_manifest_image} --target T" in proc.stderr, text
    helped = run_build_env("verify", "--help", timeout=120).stdout
    for option in set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text)):
        assert option in helped, (option, text)
    assert f"[{no_manifest_image}] verify     start" in proc.stderr, proc.stderr


@pytest.mark.docker
@pytest.mark.network
def test_verify_text_says_what_the_abi_phase_read_with_a_line_per_phase(
        cpu_image: dict, tmp_path: Path) -> None:
    image = cpu_image["image_id"]
    out = tmp_path / "report.json"
    proc = run_build_env("verify", image, "--report", str(out), "--selftest-args",
                         "--timeout 600", timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    scan = next(c["value"] for c in report["checks"] if c["id"] == "abi.scan")
    abi = next(line for line in proc.stdout.splitlines() if line.startswith("  abi: "))
    assert abi == (f"  abi: {scan['elf_files']:,} ELF files read, {scan['objects']:,} shared "
                   f"objects of {scan['distributions']:,} distributions, {scan['symbols']:,} "
                   f"undefined symbols checked in {scan['seconds']:.2f} s"), abi
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"[{image}] verify     start the self-test runs in a fresh "
                               "container: phases "), proc.stderr
    for phase in dict.fromkeys(c["phase"] for c in report["checks"]):
        seconds = sum(c["duration_s"] for c in report["checks"] if c["phase"] == phase)
        assert any(x.startswith(f"[{image}] {phase:10} ") and x.endswith(f"{seconds:.1f} s")
                   for x in lines), (phase, proc.stderr)
    quiet = run_build_env("verify", image, "--json", "--selftest-args", "--timeout 600",
                          timeout=1800)
    assert quiet.returncode == 0 and json.loads(quiet.stdout)["overall"] == "pass"
    assert f"[{image}]" not in quiet.stderr and "  abi: " not in quiet.stderr, quiet.stderr
