"""The job's cluster verdict on the real two-node Slurm (ch-run, CPU: gloo), end to end.

The image the verdict names is a SIF: the verified CPU fixture image converted by ``build-env sif``
(the native writer; the group's ``fixture_sif``, tests/slurm/conftest.py). ch-run runs an unpacked
directory, so the job runs what that SIF holds: its squashfs partition extracted with
``unsquashfs`` at the partition offset, with the image ENV of the SIF's own ``oci-config.json``
written to ``/ch/environment`` (as ``ch-convert`` does). The
job is told the SIF (``verdict_sif``); the batch host's ``build-env cluster`` (the test venv's,
on the job's PATH) writes ``cluster-verdict.json`` into the job directory after the per-node
self-test and its one inter-node gloo all-reduce. The verdict is then signed
(``trust sign --cluster-verdict``), attached to the image and the SIF in a real
``docker-registry`` (``publish --attach``), listed by ``status`` from the registry and from the
SIF's sidecar, and an edited copy is refused. A node whose self-test fails gives a failed
verdict naming it, and the job stops at the self-test stage (exit 13).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.files import sha256_file
from builder.trust.keys import KeyFiles
from tests.conftest import run_build_env
from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_sbatch_real import Bench, _bench, _leftover_ray

pytestmark = pytest.mark.slurm

REPO = "verl-env/cluster"


@pytest.fixture(scope="module")
def sif_bench(slurm_cluster: SlurmCluster, fixture_sif: tuple[Path, Path],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    if shutil.which("docker-registry") is None:  # the verdict is attached in a real registry
        pytest.skip("docker-registry not installed (scripts/os-packages.sh)")
    yield from _bench(slurm_cluster, fixture_sif[1], "ch-run", tmp_path_factory)


def test_job_writes_a_cluster_verdict_signed_attached_and_listed(
        sif_bench: Bench, fixture_sif: tuple[Path, Path], cpu_image: dict,
        keypair: KeyFiles, tmp_path: Path) -> None:
    from builder.cluster import verdict as cluster
    from builder.trust.cluster_signing import clusters_sidecar
    from tests.publish.conftest import start_registry

    bench, (sif, _) = sif_bench, fixture_sif
    info, out, wall = bench.submit(bench.job(verdict_sif=str(sif)), "verdict")
    assert info["JobState"] == "COMPLETED", out
    assert "cluster verdict: pass on verlenvtest" in out, out  # Slurm's SLURM_CLUSTER_NAME
    job_dir = bench.root / f"job-{info['JobId']}"
    verdict_file = job_dir / cluster.FILE_NAME
    v = cluster.read(verdict_file)
    assert v.overall == "pass" and v.problems == [] and v.level == "build"
    assert v.cluster == "verlenvtest" and v.job == info["JobId"] and v.runtime == "ch-run"
    assert v.subject["digest"] == sha256_file(sif)
    assert v.subject["family"] == "cpu" and v.subject["target"] == "cpu-x86_64"
    assert [(n.node, n.exit_code, n.overall) for n in v.nodes] == [("node1", 0, "pass"),
                                                                    ("node2", 0, "pass")]
    assert v.world_size == 2
    checks = v.inter_node["checks"]
    assert checks["collective.gloo_allreduce"]["status"] == "pass", checks
    assert "collective.busbw" in checks, checks
    print(f"TIMING verdict job wall {wall:.1f}s; {v.describe()}")
    assert _leftover_ray(bench) == []

    # signed beside the SIF, and attached (signed again) to the image and the SIF in a registry
    key = keypair
    proc = run_build_env("trust", "sign", str(sif), "--key", str(key.private),
                         "--cluster-verdict", str(verdict_file), timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = Path(cpu_image["stages"]["render"]["context"]).parent / "report.json"
    registry = start_registry(tmp_path / "registry")
    try:
        env = {"HOME": str(tmp_path / "home"), "DOCKER_CONFIG": str(tmp_path / "docker-config")}
        publish = ["publish", "--image", cpu_image["image_id"], "--registry",
                   f"{registry.host}/{REPO}", "--tag", "cpu", "--sif", str(sif),
                   "--sign-key", str(key.private), "--report", str(report),
                   "--record", str(tmp_path / "record.json")]
        # a verdict about another file is refused before anything is pushed
        other = tmp_path / "other-verdict.json"
        doc = json.loads(verdict_file.read_text())
        doc["subject"]["digest"] = "sha256:" + "0" * 64
        other.write_text(json.dumps(doc))
        proc = run_build_env(*publish, "--attach", str(other), env=env, timeout=900)
        assert proc.returncode != 0 and "the cluster verdict is about" in proc.stderr, proc.stderr
        proc = run_build_env(*publish, "--attach", str(verdict_file), env=env, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"attached cluster verdict verlenvtest (pass, build level, job {info['JobId']})" \
            in proc.stdout, proc.stdout
        record = json.loads((tmp_path / "record.json").read_text())
        ref = f"{registry.host}/{REPO}@{record['image_digest']}"
        proc = run_build_env("status", ref, "--key", str(key.public),
                             "--cluster", "verlenvtest", timeout=300)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "cluster pass on verlenvtest (2 node(s); ch-run" in proc.stdout, proc.stdout
        assert f"last passed on verlenvtest: {ref}" in proc.stdout
    finally:
        registry.stop()

    # the sidecar lists it; an edited copy of the signed verdict is refused
    proc = run_build_env("status", str(sif), "--key", str(key.public), timeout=300)
    assert proc.returncode == 0 and "cluster pass on verlenvtest" in proc.stdout, proc.stdout
    sidecar = clusters_sidecar(sif)
    envelope = json.loads(sidecar.read_text().splitlines()[0])
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    stmt["predicate"]["clusterVerdict"]["nodes"][1]["overall"] = "pass-edited"
    envelope["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    sidecar.write_text(json.dumps(envelope) + "\n")
    proc = run_build_env("status", str(sif), "--key", str(key.public), timeout=300)
    assert proc.returncode == 1 and "REFUSED cluster" in proc.stdout, proc.stdout + proc.stderr
    assert "does not verify" in proc.stdout


def test_a_failing_node_fails_the_cluster_verdict_naming_it(
        sif_bench: Bench, fixture_sif: tuple[Path, Path]) -> None:
    from builder.cluster import verdict as cluster

    bench, (sif, _) = sif_bench, fixture_sif
    switch = bench.break_node("node2", "HIP_VISIBLE_DEVICES=0\nCUDA_VISIBLE_DEVICES=1\n")
    try:
        info, out, _ = bench.submit(bench.job(verdict_sif=str(sif), cluster="site-b"), "bad")
    finally:
        switch.unlink()
    assert info["ExitCode"] == "13:0", out
    assert "cluster verdict: FAIL on site-b" in out, out
    assert re.search(r"self-test did not pass on (node1 )?node2 \(exit codes node1=\d node2=1",
                     out), out
    assert "result: FAILED at stage selftest (exit 13)" in out
    v = cluster.read(bench.root / f"job-{info['JobId']}" / cluster.FILE_NAME)
    assert v.overall == "fail" and v.cluster == "site-b"
    assert any(p.startswith("node2: fail (exit 1)") for p in v.problems), v.problems
    assert "=== stage training ===" not in out
    assert _leftover_ray(bench) == []
