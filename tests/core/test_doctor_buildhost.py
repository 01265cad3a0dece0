"""``build-env doctor`` on a build host: the build-host checks by default (no ib0, no
apptainer), the cluster checks on a cluster node or with ``--cluster``; each build-host check
against real files and a real local HTTP index. The engine-facing checks against a real engine
are in tests/cli/test_doctor_engine.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.cluster import doctor
from builder.cluster.doctor import FAIL, OK, SKIP, WARN
from builder.engine import HostFacts
from tests.conftest import run_build_env
from tests.support.simple_index import serve_index

GB = 1000 ** 3


def _env_without_slurm() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def test_on_cluster(tmp_path: Path) -> None:
    assert doctor.on_cluster({"SLURM_JOB_ID": "7"}, pidfiles=())
    assert not doctor.on_cluster({"HOME": "/root"}, pidfiles=())
    live, dead = tmp_path / "live.pid", tmp_path / "dead.pid"
    live.write_text(f"{os.getpid()}\n")
    dead.write_text("999999999\n")
    assert doctor.on_cluster({}, pidfiles=(str(live),))
    assert not doctor.on_cluster({}, pidfiles=(str(dead), str(tmp_path / "none.pid")))


def _cli_doctor(tmp_path: Path, *args: str) -> dict:
    env = _env_without_slurm()
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-engine.sock"
    proc = run_build_env("doctor", "--json", *args, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def test_a_build_host_is_not_held_to_ib0_and_apptainer(tmp_path: Path, index: str) -> None:
    """The finding: `doctor --target cuda-x86_64` on a build host failed on --interface ib0 and
    --runtime apptainer, which a build never uses, and checked nothing a build needs."""
    doc = _cli_doctor(tmp_path, "--target", "cuda-x86_64", "--index-url", index)
    ids = {f["id"]: f for f in doc["findings"]}
    assert doc["checks"] == ["build-host"]
    assert "net.interface" not in ids and "runtime" not in ids and "ports.ray" not in ids
    assert ids["engine"]["status"] == FAIL and "cannot reach" in ids["engine"]["message"]
    assert ids["site.index"]["status"] == OK
    assert {"engine.buildkit", "site.ca_bundle"} <= set(ids)


def test_cluster_checks_when_asked_or_on_a_node(tmp_path: Path, index: str) -> None:
    for asked in (["--cluster"], ["--interface", "lo"], ["--runtime", "ch-run"]):
        doc = _cli_doctor(tmp_path, *asked, "--index-url", index)
        ids = {f["id"] for f in doc["findings"]}
        assert doc["checks"] == ["cluster"] and {"net.interface", "runtime"} <= ids, asked
        assert "engine" not in ids
    env = {**_env_without_slurm(), "SLURM_JOB_ID": "42"}
    proc = run_build_env("doctor", "--json", env=env, cwd=tmp_path, timeout=300)
    assert json.loads(proc.stdout)["checks"] == ["cluster"], proc.stderr
    both = _cli_doctor(tmp_path, "--cluster", "--build-host", "--index-url", index)
    assert both["checks"] == ["build-host", "cluster"]


@pytest.fixture
def index() -> Iterator[str]:
    with serve_index() as url:
        yield url


def test_the_index_check_is_one_bounded_request(index: str) -> None:
    [found] = doctor.check_index(index, None)
    assert found.status == OK and "secret" not in found.message
    [missing] = doctor.check_index(index.replace("/simple", "/nothing"), None)
    assert missing.status == FAIL and "HTTP 404" in missing.message
    [down] = doctor.check_index("http://127.0.0.1:9/simple", None, timeout=2)
    assert down.status == FAIL and "--index-url" in down.fix


def test_the_ca_bundle_check(tmp_path: Path) -> None:
    assert doctor.check_ca_bundle(None)[0].status == SKIP
    assert doctor.check_ca_bundle(tmp_path / "none.pem")[0].status == FAIL
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    assert doctor.check_ca_bundle(tmp_path / "junk.pem")[0].status == FAIL
    pem = Path("/etc/ssl/certs/ca-certificates.crt")
    if pem.is_file():
        assert doctor.check_ca_bundle(pem)[0].status == OK


def _facts(**kw: object) -> HostFacts:
    return HostFacts(**{"version": "28.0", "data_root": "/var/lib/docker",  # type: ignore
                        "free_bytes": 100 * GB, "runtimes": ("runc",), "local": True, **kw})


def test_the_nvidia_toolkit_missing_is_a_warning_naming_the_pending_phases(tmp_path: Path
                                                                          ) -> None:
    [missing] = doctor.check_nvidia_toolkit(_facts(), "cuda")
    assert missing.status == WARN and "GPU gate phases will be pending" in missing.message
    assert doctor.check_nvidia_toolkit(_facts(runtimes=("nvidia", "runc")), "cuda")[0].status == OK
    assert doctor.check_nvidia_toolkit(_facts(cdi_devices=("nvidia.com/gpu=all",)),
                                       None)[0].status == OK
    spec = tmp_path / "cdi"
    spec.mkdir()
    (spec / "nvidia.yaml").write_text("kind: nvidia.com/gpu\ndevices: []\n")
    assert doctor.check_nvidia_toolkit(_facts(cdi_spec_dirs=(str(spec),)), "cuda")[0].status == OK
    assert doctor.check_nvidia_toolkit(_facts(), "cpu")[0].status == SKIP


def test_the_disk_check_holds_the_data_root_to_the_target() -> None:
    assert doctor.check_disk(_facts(free_bytes=100 * GB), "cuda")[0].status == OK
    small = doctor.check_disk(_facts(free_bytes=20 * GB), "cuda")[0]
    assert small.status == FAIL and "needs about 60 GB" in small.message
    assert doctor.check_disk(_facts(free_bytes=20 * GB), "cpu")[0].status == OK
    assert doctor.check_disk(_facts(free_bytes=None, local=False), "cuda")[0].status == SKIP


def test_no_driver_on_a_build_host_is_pending_not_failed(tmp_path: Path) -> None:
    [found] = doctor.check_build_host_driver("13.0", "cuda", proc=str(tmp_path / "none"))
    assert found.status == SKIP and "pending" in found.message
    assert doctor.check_build_host_driver("13.0", "cpu") == []
