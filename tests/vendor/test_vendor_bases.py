"""Vendor bases for real: two vendor-style bases built here from the debootstrap base with the CPU
torch wheel (one with torch in the system site, one in ``/opt/venv``), a small target on each
through the installed CLI (lock --probe -> build -> gate -> tag), and a target whose provided pin
the base does not hold: the gate refuses it (exit 1, no tag).

The index's x86_64 torch is the multi-GB CUDA build, so the bases take torch from the CPU wheel
this kind of machine keeps in /opt/wheels; torch's own dependencies come from the index.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import docker
import pytest

from builder import engine as eng
from builder.engine import Engine
from builder.errors import EngineError
from tests.conftest import REPO, run_build_env

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.heavy]

WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
TORCH = "2.13.0+cpu"
SYSTEM_BASE = "verl-env-test/vendor-system:bookworm"
VENV_BASE = "verl-env-test/vendor-venv:bookworm"

# What a vendor does: its python, its torch, its PATH. The CA bundle is a build secret only.
_PIP = ("RUN --mount=type=secret,id=site-ca,required=true --mount=type=bind,source=wheels,"
        "target=/wheels \\\n    PIP_CERT=/run/secrets/site-ca {pip} install --no-cache-dir "
        "{extra}/wheels/" + WHEEL.name + "\n")
_APT = ("RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates procps "
        "{pkgs} && rm -rf /var/lib/apt/lists/*\n")
SYSTEM_DOCKERFILE = ("FROM {base}\n" + _APT.format(pkgs="python3 python3-pip")
                     + _PIP.format(pip="pip", extra="--break-system-packages "))
VENV_DOCKERFILE = ("FROM {base}\n" + _APT.format(pkgs="python3 python3-venv")
                   + "RUN python3 -m venv /opt/venv\n"
                   + "ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv\n"
                   + _PIP.format(pip="/opt/venv/bin/pip", extra=""))

MATRIX = """schema: 1
defaults:
  python: "3.11"
  accelerator: cpu
  arch: x86_64
  apt: []
  packages:
    ray: {version: "2.60.0", extras: [default]}
    transformers: "5.9.0"
    tensordict: "0.10.0"
    hydra-core: "1.3.2"
    verl: "0.9.1"
targets:
  vendor-system:
    description: torch provided by the base's system site (PEP 668)
    base: {image: "%(system)s", glibc: "2.36", vendor: probe}
    provided: {torch: "%(torch)s"}
  vendor-venv:
    description: torch provided by the base's /opt/venv
    base: {image: "%(venv)s", glibc: "2.36", vendor: probe}
    provided: {torch: "%(torch)s"}
  vendor-venv-badpin:
    description: claims a torch the base does not hold (the gate must refuse it)
    base: {image: "%(venv)s", glibc: "2.36", vendor: probe}
    provided: {torch: "2.12.0"}
""" % {"system": SYSTEM_BASE, "venv": VENV_BASE, "torch": TORCH}


@pytest.fixture(scope="module")
def client(docker_host: str) -> docker.DockerClient:
    return docker.DockerClient(base_url=docker_host)


@pytest.fixture(scope="module")
def vendor_bases(debian_base: str, ca_bundle: Path, docker_host: str,
                 tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Both vendor-style bases, built through the engine interface and tagged."""
    if not WHEEL.is_file():
        pytest.skip(f"no CPU torch wheel at {WHEEL}")
    try:
        eng.find_buildkit_cli()
    except EngineError as exc:
        pytest.skip(str(exc))
    engine = Engine.connect()
    out = {}
    for ref, text in ((SYSTEM_BASE, SYSTEM_DOCKERFILE), (VENV_BASE, VENV_DOCKERFILE)):
        ctx = tmp_path_factory.mktemp("vendor-base")
        (ctx / "Dockerfile").write_text(text.format(base=debian_base))
        (ctx / "wheels").mkdir()
        shutil.copyfile(WHEEL, ctx / "wheels" / WHEEL.name)
        result = engine.build(ctx, target=ref, secrets={"site-ca": ca_bundle})
        engine.tag(result.image_id, ref)
        out[ref] = result.image_id
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vendor-site")
    (root / "matrix.yaml").write_text(MATRIX)
    shutil.copytree(REPO / "tests" / "fixtures" / "metadata", root / "metadata")
    return root / "matrix.yaml"


def _lock(site: Path, target: str) -> tuple[dict, str]:
    proc = run_build_env("lock", "--probe", "--target", target, "--matrix", str(site),
                         timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((site.parent / "locks" / f"{target}.base.json").read_text())
    return record, proc.stderr


def _build(site: Path, target: str, ca_bundle: Path, workdir: Path
           ) -> tuple[int, dict, str]:
    proc = run_build_env("--target", target, "--matrix", str(site), "--ca-bundle",
                         str(ca_bundle), "--workdir", str(workdir), "--json", timeout=1800)
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, report, proc.stderr


def _checks(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in (report.get("verification") or {}).get("checks", [])}


@pytest.mark.parametrize("target,base,interpreter,kind", [
    ("vendor-system", SYSTEM_BASE, "/usr/bin/python3", "system"),
    ("vendor-venv", VENV_BASE, "/opt/venv/bin/python3", "venv")])
def test_a_vendor_base_is_probed_built_gated_and_tagged(
        vendor_bases: dict[str, str], site: Path, ca_bundle: Path, client: docker.DockerClient,
        tmp_path: Path, target: str, base: str, interpreter: str, kind: str) -> None:
    record, _ = _lock(site, target)
    assert record["inspected"] is True and record["image_id"] == vendor_bases[base]
    assert record["interpreter"] == interpreter and record["kind"] == kind
    assert record["externally_managed"] is (kind == "system")  # Debian's PEP 668 marker
    assert record["dists"]["torch"]["version"] == TORCH
    assert record["dists"]["torch"]["record"].startswith("sha256:")
    lock = (site.parent / "locks" / f"{target}.txt").read_text()
    assert "\ntorch==" not in lock  # provided: never resolved
    # the base's other distributions are constraints: whatever the lock shares with the base
    # is at the base's version
    for name, dist in record["dists"].items():
        for line in lock.splitlines():
            if line.startswith(f"{name}=="):
                assert line.split("==")[1].split()[0] == dist["version"], (name, line)

    code, report, err = _build(site, target, ca_bundle, tmp_path / "work")
    assert code == 0, err[-4000:]
    assert report["result"] == "pass" and report["tags"][-1] == f"verl-env:{target}"
    checks = _checks(report)
    for cid in ("versions.provided.torch", "versions.base_files.torch", "imports.torch",
                "imports.verl", "versions.verl_requires", "cpu.gloo_allreduce",
                "ray.local_start"):
        assert checks[cid]["status"] == "pass", checks[cid]
    layers = "".join(p.read_text() for p in (tmp_path / "work" / "context" / "layers").iterdir())
    assert "torch==" not in layers  # never reinstalled
    image = client.images.get(f"verl-env:{target}")
    env = dict(e.split("=", 1) for e in image.attrs["Config"]["Env"])
    base_env = dict(e.split("=", 1) for e in client.images.get(base).attrs["Config"]["Env"])
    assert env["PATH"] == base_env["PATH"]  # the base's PATH is kept as it is
    out = client.containers.run(image.id, ["cat", "/opt/verl-env/interpreter"], remove=True,
                                entrypoint=[], network_mode="none").decode()
    assert out.strip() == interpreter
    assert not client.containers.list(all=True, filters={"ancestor": image.id})


def test_a_provided_pin_the_base_does_not_hold_is_refused_by_the_gate(
        vendor_bases: dict[str, str], site: Path, ca_bundle: Path, client: docker.DockerClient,
        tmp_path: Path) -> None:
    record, err = _lock(site, "vendor-venv-badpin")
    assert "torch: the matrix claims 2.12.0" in err  # said early, refused by the gate
    code, report, err = _build(site, "vendor-venv-badpin", ca_bundle, tmp_path / "work")
    assert code == 1, err[-3000:]
    check = _checks(report)["versions.provided.torch"]
    assert check["status"] == "fail"
    assert "torch" in check["reason"] and "2.12.0" in check["reason"] and TORCH in check["reason"]
    assert not report.get("tags")
    assert not [t for i in client.images.list() for t in i.tags
                if t.startswith("verl-env:vendor-venv-badpin")]
