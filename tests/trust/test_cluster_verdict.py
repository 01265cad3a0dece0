"""Cluster verdicts: a job directory's per-node reports gathered into one verdict about a real SIF
(made with the reference ``siftool``), signed, listed by ``build-env status`` newest first, and
refused when tampered with, signed by another key, or about another file.

The node reports are real self-test reports: the one-GPU report of the lent H100
(``docs/gpu-h100/gpus-1.json``) and two-rank CPU reports written by the self-test's own report
code. The job on the two-node Slurm that writes the directory and its verdict, and
``publish --attach`` of it: tests/slurm/test_cluster_verdict_real.py."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.cluster import verdict as cluster
from builder.errors import ClusterError, TrustError
from builder.selftest.report import Check, ReportMeta, build_report
from builder.trust import dsse
from builder.files import sha256_file
from builder.publish.status import gather, last_passed, sif_entries
from builder.trust.cluster_signing import clusters_sidecar, sign_cluster
from builder.trust.keys import KeyFiles, load_private
from tests.conftest import run_build_env
from tests.trust.conftest import need

ROOT = Path(__file__).resolve().parents[2]


def _sif(d: Path, labels: dict[str, str], name: str = "image.sif") -> Path:
    """A SIF as apptainer lays it out (definition, inspect metadata with the labels, squashfs)."""
    need("mksquashfs", "siftool")
    root = d / f"root-{name}"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "motd").write_text(f"{name}\n")
    subprocess.run(["mksquashfs", str(root), str(d / f"{name}.sqfs"), "-quiet", "-noappend",
                    "-no-progress"], check=True)
    (d / "def").write_text("Bootstrap: docker-daemon\nFrom: verl-env-test\n")
    meta = d / "inspect-metadata.json"
    meta.write_text(json.dumps({"data": {"attributes": {"labels": labels}},
                                "type": "container"}))
    sif = d / name
    for args in (["new", str(sif)],
                 ["add", str(sif), str(d / "def"), "--datatype", "1", "--groupid", "1"],
                 ["add", str(sif), str(meta), "--datatype", "6", "--groupid", "1",
                  "--filename", "inspect-metadata.json"],
                 ["add", str(sif), str(d / f"{name}.sqfs"), "--datatype", "4", "--parttype", "2",
                  "--partfs", "1", "--partarch", "2", "--groupid", "1"]):
        subprocess.run(["siftool", *args], check=True, capture_output=True)
    return sif


def _cpu_reports(job: Path, *, fail_node2: bool = False) -> None:
    """Two ranks of one distributed run, as the job leaves them (selftest-NODE.{json,rc})."""
    for rank, node in enumerate(("node1", "node2")):
        bad = fail_node2 and node == "node2"
        checks = [Check("imports.torch", "imports", "pass", reason="import torch"),
                  Check("cpu.tensordict_membership", "cpu", "fail" if bad else "pass"),
                  Check("collective.gloo_allreduce", "collective", "pass",
                        reason="2 ranks over gloo/tcp"),
                  Check("collective.busbw", "collective", "skip", required=False,
                        value=0.41, unit="GB/s", reason="no reference for gloo/tcp x2"),
                  Check("collective.transport", "collective", "pass", value="inter-node")]
        meta = ReportMeta(started="2026-11-25T12:00:00Z", duration_s=9.0, host="fake-host",
                          launcher="srun", world_size=2, hosts=["fake-host"],
                          transport="inter-node")
        report = build_report(meta, checks, "fail" if bad else "pass")
        report["rank"] = rank
        (job / f"selftest-{node}.json").write_text(json.dumps(report))
        (job / f"selftest-{node}.rc").write_text("1\n" if bad else "0\n")


def test_a_two_node_cpu_job_is_one_cluster_verdict(tmp_path: Path) -> None:
    sif = _sif(tmp_path, {"org.verl-env.accelerator": "cpu", "org.verl-env.target": "cpu-x86_64"})
    job = tmp_path / "job-42"
    job.mkdir()
    _cpu_reports(job)
    v = cluster.collect(job, sif, "fake-cluster", now="2026-11-25T12:01:00+00:00")
    assert v.overall == "pass" and v.problems == [] and v.level == "build"
    assert [n.node for n in v.nodes] == ["node1", "node2"] and v.world_size == 2
    assert v.subject["digest"] == sha256_file(sif) and v.subject["target"] == "cpu-x86_64"
    assert v.inter_node["checks"]["collective.gloo_allreduce"]["status"] == "pass"
    assert v.inter_node["busbw_gbps"] == 0.41 and v.inter_node["transport"] == "inter-node"
    assert cluster.ClusterVerdict.from_dict(v.to_dict()).to_dict() == v.to_dict()
    # the job names its nodes and runtime: a node of the job that left nothing is a fail
    named = cluster.collect(job, sif, "fake-cluster", nodes=("node1", "node2", "node3"),
                            runtime="apptainer", job="42")
    assert named.overall == "fail" and named.runtime == "apptainer" and named.job == "42"
    assert "node3: missing (exit None): no selftest-node3.json" in named.problems
    assert "apptainer" in named.describe()
    assert cluster.ClusterVerdict.from_dict(named.to_dict()).to_dict() == named.to_dict()
    # a node that failed, and a node that left nothing: a fail naming them, never a skip
    _cpu_reports(job, fail_node2=True)
    bad = cluster.collect(job, sif, "fake-cluster")
    assert bad.overall == "fail"
    assert any("node2: fail (exit 1): failing: cpu.tensordict_membership" in p
               for p in bad.problems), bad.problems
    _cpu_reports(job)
    (job / "selftest-node2.json").unlink()
    (job / "selftest-node2.rc").unlink()
    gone = cluster.collect(job, sif, "fake-cluster")
    assert "1 node result(s) for a collective of 2 rank(s)" in gone.problems
    # as the job leaves them: only rank 0 writes a report (every rank's checks and the collective);
    # node2 left its exit code, the ranks' agreed verdict
    _cpu_reports(job)
    (job / "selftest-node2.json").unlink()
    ranked = cluster.collect(job, sif, "fake-cluster", nodes=("node1", "node2"))
    assert ranked.overall == "pass", ranked.problems
    assert [(n.node, n.exit_code, n.overall) for n in ranked.nodes] == [
        ("node1", 0, "pass"), ("node2", 0, "pass")]
    assert ranked.nodes[1].reason == "checks in the ranks' shared report selftest-node1.json"
    (job / "selftest-node2.rc").write_text("1\n")
    assert "node2: fail (exit 1): checks in the ranks' shared report selftest-node1.json" in \
        cluster.collect(job, sif, "fake-cluster").problems
    (job / "selftest-node2.rc").unlink()
    assert "1 node result(s) for a collective of 2 rank(s)" in \
        cluster.collect(job, sif, "fake-cluster").problems
    with pytest.raises(ClusterError, match="no selftest-<node>.json"):
        cluster.collect(tmp_path, sif, "fake-cluster")
    with pytest.raises(ClusterError, match="name the cluster"):
        cluster.collect(job, sif, " ")


def test_a_gpu_node_report_gives_a_gpu_level_with_its_facts(tmp_path: Path) -> None:
    sif = _sif(tmp_path, {"org.verl-env.accelerator": "cuda"})
    job = tmp_path / "job-h100"
    job.mkdir()
    shutil.copyfile(ROOT / "docs" / "gpu-h100" / "gpus-1.json", job / "selftest-gpu1.json")
    (job / "selftest-gpu1.rc").write_text("0\n")
    v = cluster.collect(job, sif, "lent-h100")
    assert v.overall == "pass" and v.level == "gpu", v.problems
    gpu = v.nodes[0].gpu
    assert gpu["models"] == ["NVIDIA H100 80GB HBM3"] and gpu["driver"] == "580.159.04"
    assert gpu["runtime"] == "CUDA 13.0" and gpu["library"] == "NCCL 2.28.9"
    assert "NVIDIA H100 80GB HBM3" in v.describe() and "gpu level" in v.describe()


def test_each_nodes_gpu_facts_come_from_rank_0s_shared_report(tmp_path: Path) -> None:
    """Rank 0 writes one report with every rank's local checks suffixed @host (the self-test's
    distributed merge); node2, which left only its exit code, gets its own GPU facts from it,
    not node1's, and a node whose checks are not there stays pending, saying why."""
    sif = _sif(tmp_path, {"org.verl-env.accelerator": "cuda"})
    job = tmp_path / "job-2"
    job.mkdir()
    h100 = json.loads((ROOT / "docs" / "gpu-h100" / "gpus-1.json").read_text())
    local = [c for c in h100["checks"] if c.get("phase") != "collective"]
    shared = dict(h100, world_size=2, hosts=["gpu1", "gpu2"], host="gpu1", checks=[
        *({**c, "id": f"{c['id']}@gpu1"} for c in local),
        *({**c, "id": f"{c['id']}@gpu2", **({"value": {**c["value"], "driver": "575.51.03"}}
                                            if c["id"] == "gpu.driver" else {})}
          for c in local),
        *(c for c in h100["checks"] if c.get("phase") == "collective")])
    (job / "selftest-gpu1.json").write_text(json.dumps(shared))
    (job / "selftest-gpu1.rc").write_text("0\n")
    (job / "selftest-gpu2.rc").write_text("0\n")
    v = cluster.collect(job, sif, "two-h100", nodes=("gpu1", "gpu2"))
    gpu1, gpu2 = (n.gpu for n in v.nodes)
    assert gpu1["driver"] == "580.159.04" and gpu2["driver"] == "575.51.03"  # each its own
    assert gpu2["count"] == 1 and gpu2["library"] == "NCCL 2.28.9"
    assert gpu1["models"] == ["NVIDIA H100 80GB HBM3"]  # the writer's platform section
    (job / "selftest-gpu3.rc").write_text("0\n")
    v3 = cluster.collect(job, sif, "two-h100", nodes=("gpu1", "gpu2", "gpu3"))
    assert v3.nodes[2].gpu["status"] == "pending" and "no gpu checks for gpu3" in \
        v3.nodes[2].gpu["reason"]


def test_signed_listed_newest_first_and_tampering_refused(
        tmp_path: Path, keypair: KeyFiles, other_keypair: KeyFiles) -> None:
    labels = {"org.verl-env.accelerator": "cpu", "org.verl-env.target": "cpu-x86_64"}
    sif = _sif(tmp_path, labels)
    other = _sif(tmp_path, labels, "other.sif")
    job = tmp_path / "job-1"
    job.mkdir()
    _cpu_reports(job)
    # the CLI: collect, write JOBDIR/cluster-verdict.json, sign beside the SIF
    proc = run_build_env("cluster", str(job), "--sif", str(sif), "--cluster", "site-a",
                         "--sign-key", str(keypair.private), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "pass on site-a (2 node(s)" in proc.stdout
    written = job / cluster.FILE_NAME
    assert cluster.read(written).overall == "pass"
    # a later job on another cluster, signed through `trust sign --cluster-verdict`
    later = cluster.collect(job, sif, "site-b", now="2999-01-01T00:00:00+00:00")
    later_file = tmp_path / "later.json"
    cluster.write(later, later_file)
    proc = run_build_env("trust", "sign", str(sif), "--key", str(keypair.private),
                         "--cluster-verdict", str(later_file), timeout=300)
    assert proc.returncode == 0, proc.stderr
    # a verdict about another file is refused at signing
    with pytest.raises(TrustError, match="refusing to sign: the cluster verdict is about"):
        sign_cluster(other, later, keypair.private)
    entries = sif_entries(sif, [keypair.public])
    assert [e.cluster for e in entries] == ["site-b", "site-a"]  # newest first
    assert all(e.refused is None and e.overall == "pass" for e in entries)
    best = last_passed(gather([str(sif), str(other)], [keypair.public]), "site-a")
    assert best is not None and best[0] == str(sif)
    proc = run_build_env("status", str(sif), str(other), "--key", str(keypair.public),
                         "--cluster", "site-a", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"last passed on site-a: {sif}" in proc.stdout and "site-b" in proc.stdout
    assert f"{other}: no verdict travels with it" in proc.stdout

    sidecar = clusters_sidecar(sif)
    lines = sidecar.read_text().splitlines()
    # tampered: the verdict edited after signing
    env = json.loads(lines[1])
    stmt = json.loads(base64.b64decode(env["payload"]))
    stmt["predicate"]["clusterVerdict"]["cluster"] = "site-c"
    env["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    # another key; and a statement about another file moved beside this SIF
    foreign = dsse.sign(base64.b64decode(json.loads(lines[0])["payload"]),
                        load_private(other_keypair.private))
    sign_cluster(other, cluster.collect(job, other, "site-a"), keypair.private)
    moved = clusters_sidecar(other).read_text().splitlines()[0]
    sidecar.write_text("\n".join([lines[0], json.dumps(env), json.dumps(foreign), moved]) + "\n")
    entries = sif_entries(sif, [keypair.public])
    refused = sorted(e.refused or "" for e in entries if e.refused)
    assert len(refused) == 3 and [e.cluster for e in entries if not e.refused] == ["site-a"]
    assert any("does not verify" in r for r in refused)
    assert any("signed by unknown key(s)" in r for r in refused)
    assert any("not this file" in r for r in refused)
    proc = run_build_env("status", str(sif), "--key", str(keypair.public), timeout=300)
    assert proc.returncode == 1 and "3 verdict(s) refused" in proc.stderr
    assert proc.stdout.count("REFUSED cluster") == 3
