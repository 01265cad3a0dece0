"""Cluster verdicts: what one Slurm job proved about one image on one cluster.

The generated job self-tests every node in one ``srun`` step (the ranks run one collective across
all nodes and share one verdict) and leaves ``selftest-<node>.json`` and ``selftest-<node>.rc`` in
its job directory. :func:`collect` gathers them into one :class:`ClusterVerdict` for the image's
digest (a SIF's sha256): the site/cluster name, the nodes, each node's result and GPU facts
(models, driver, CUDA/ROCm runtime, NCCL/RCCL), and the inter-node collective (correctness,
transport, bus bandwidth). It passes only when every node the collective counted left a passing
report and the inter-node collective passed; a missing node is a fail, never a skip.

:mod:`builder.trust.cluster_signing` signs one (a DSSE statement about the SIF's digest, one line
of ``NAME.sif.clusters.intoto.jsonl``) and reads them back for ``build-env status``; the
``build-env cluster`` command (:mod:`builder.commands.cluster`) collects, writes and signs.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.errors import ClusterError
from builder.matrix.families import family as family_of_name
from builder.files import atomic_write_text, sha256_file
from builder.sif.checks import sif_labels
from builder.gate.verdicts import GPU, NONE, PROVEN, gpu_facts

SCHEMA = "verl-env/cluster-verdict/v1"
FILE_NAME = "cluster-verdict.json"
PASS, FAIL = "pass", "fail"


@dataclass(frozen=True)
class NodeResult:
    """One node's self-test in the job."""

    node: str
    exit_code: int | None  # None: the node left no exit code
    overall: str  # the node's report, or "missing" / "unreadable"
    reason: str = ""
    gpu: Mapping[str, Any] = field(default_factory=dict)  # count, models, driver, runtime, library

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "exit_code": self.exit_code, "overall": self.overall,
                "reason": self.reason, "gpu": dict(self.gpu)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeResult:
        code = d.get("exit_code")
        return cls(str(d.get("node")), code if isinstance(code, int) else None,
                   str(d.get("overall")), str(d.get("reason") or ""), dict(d.get("gpu") or {}))


@dataclass(frozen=True)
class ClusterVerdict:
    cluster: str
    subject: Mapping[str, Any]  # {"name", "digest": "sha256:...", "target", "family"}
    job: str
    recorded_at: str
    nodes: tuple[NodeResult, ...]
    world_size: int | None
    inter_node: Mapping[str, Any]  # {"checks": {id: {status, value, unit, reason}}, transport, ...}
    runtime: str | None = None  # the container runtime the job ran the image with
    # the nodes earlier attempts of the job excluded before it requeued itself (issue 39):
    # {"node", "attempt" (0: the first), "reason"}; not part of this verdict's nodes
    excluded: tuple[Mapping[str, Any], ...] = ()

    @property
    def family(self) -> str | None:
        fam = self.subject.get("family")
        return fam if isinstance(fam, str) else None

    @property
    def problems(self) -> list[str]:
        """Why this is not a passing cluster verdict (empty when it is one)."""
        out = []
        if not self.nodes:
            out.append("no node left a self-test result")
        if self.world_size is not None and len(self.nodes) != self.world_size:
            out.append(f"{len(self.nodes)} node result(s) for a collective of "
                       f"{self.world_size} rank(s)")
        out += [f"{n.node}: {n.overall} (exit {n.exit_code})" + (f": {n.reason}" if n.reason
                                                                  else "")
                for n in self.nodes if n.exit_code != 0 or n.overall != PASS]
        checks = self.inter_node.get("checks") or {}
        correct = [c for cid, c in checks.items()
                   if cid.endswith("allreduce") and isinstance(c, Mapping)]
        if len(self.nodes) > 1 and not any(c.get("status") == PASS for c in correct):
            out.append("no passing inter-node all-reduce in the reports")
        out += [f"{cid}: {c.get('status')} {c.get('reason') or ''}".rstrip()
                for cid, c in checks.items()
                if isinstance(c, Mapping) and c.get("status") == FAIL]
        return out

    @property
    def overall(self) -> str:
        return FAIL if self.problems else PASS

    @property
    def level(self) -> str:
        """``gpu`` when a GPU family's GPU phases passed on every node; ``build`` otherwise."""
        fam = family_of_name(self.family)
        if self.overall != PASS or fam is None or not fam.gpu_phases:
            return "build"
        return GPU if all(n.gpu.get("status") == PROVEN for n in self.nodes) else "build"

    def describe(self) -> str:
        gpus = sorted({m for n in self.nodes for m in n.gpu.get("models") or ()})
        bw = self.inter_node.get("busbw_gbps")
        parts = [f"{len(self.nodes)} node(s)"]
        if self.runtime:
            parts.append(self.runtime)
        if gpus:
            parts.append(", ".join(gpus))
        if self.inter_node.get("transport"):
            parts.append(str(self.inter_node["transport"]))
        if bw is not None:
            parts.append(f"busbw {bw:g} GB/s")
        if self.excluded:
            parts.append("excluded " + ", ".join(sorted({str(e.get("node"))
                                                         for e in self.excluded})))
        return f"{self.overall} on {self.cluster} ({'; '.join(parts)}), {self.level} level"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "cluster": self.cluster, "subject": dict(self.subject),
                "job": self.job, "recorded_at": self.recorded_at, "overall": self.overall,
                "level": self.level, "problems": self.problems, "world_size": self.world_size,
                "nodes": [n.to_dict() for n in self.nodes], "inter_node": dict(self.inter_node),
                "runtime": self.runtime, "excluded": [dict(e) for e in self.excluded]}

    @classmethod
    def from_dict(cls, d: Any) -> ClusterVerdict:
        """Raises ValueError for anything that is not a cluster verdict."""
        if not isinstance(d, Mapping) or d.get("schema") != SCHEMA:
            raise ValueError(f"not a cluster verdict (schema {SCHEMA})")
        subject = d.get("subject")
        if not isinstance(subject, Mapping) or not str(subject.get("digest", "")).startswith(
                "sha256:"):
            raise ValueError("the cluster verdict names no subject digest")
        ws = d.get("world_size")
        return cls(str(d.get("cluster")), dict(subject), str(d.get("job")),
                   str(d.get("recorded_at")),
                   tuple(NodeResult.from_dict(n) for n in d.get("nodes") or ()
                         if isinstance(n, Mapping)),
                   ws if isinstance(ws, int) else None, dict(d.get("inter_node") or {}),
                   str(d["runtime"]) if d.get("runtime") else None,
                   tuple(dict(e) for e in d.get("excluded") or () if isinstance(e, Mapping)))


def _node_gpu(report: Mapping[str, Any], family: str | None) -> dict[str, Any]:
    fam = family_of_name(family)
    if fam is not None and not fam.gpu_phases:
        return {"status": NONE}
    checks = {str(c.get("id", "")).split("@")[0]: c for c in report.get("checks") or ()
              if isinstance(c, dict)}
    count = checks.get("gpu.device_count", {})
    if count.get("status") != PASS:
        return {"status": "pending", "reason": f"gpu.device_count {count.get('status', 'absent')}"
                f" {count.get('reason') or ''}".rstrip()}
    ev = gpu_facts(report, fam.name if fam else "cuda", count.get("value"))
    return {k: v for k, v in ev.to_dict().items()
            if k in ("status", "count", "models", "driver", "runtime", "library")}


def host_view(report: Mapping[str, Any], host: str) -> dict[str, Any]:
    """One node's part of a multi-host report: the self-test's rank 0 report holds every rank's
    local checks with ids suffixed ``@host`` (selftest.distributed.merge); this keeps ``host``'s,
    without the suffix, and the checks that belong to no host (the collective). A report with
    no suffixed ids (one host) is returned as it is."""
    checks = [c for c in report.get("checks") or () if isinstance(c, dict)]
    if not any("@" in str(c.get("id", "")) for c in checks):
        return dict(report)
    mine = []
    for c in checks:
        cid = str(c.get("id", ""))
        if "@" not in cid:
            mine.append(c)
        elif cid.rsplit("@", 1)[1] == host:
            mine.append({**c, "id": cid.rsplit("@", 1)[0]})
    view = {**report, "checks": mine}
    if str(report.get("host") or "") not in ("", host):
        view.pop("platform", None)  # the writer's platform section is rank 0's node, not this
    return view


def _inter_node(reports: list[dict[str, Any]]) -> tuple[dict[str, Any], int | None]:
    sizes = [int(r["world_size"]) for r in reports if isinstance(r.get("world_size"), int)]
    world = max(sizes) if sizes else None
    checks: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for r in reports:
        for c in r.get("checks") or ():
            if isinstance(c, dict) and c.get("phase") == "collective" and "@" not in str(
                    c.get("id")):
                checks.setdefault(str(c["id"]), {k: c.get(k) for k in
                                                 ("status", "value", "unit", "reason")})
        info.setdefault("transport", r.get("transport"))
        if r.get("hosts"):
            info.setdefault("hosts", list(r["hosts"]))
    bw = (checks.get("collective.busbw") or {}).get("value")
    info.update(checks=checks, busbw_gbps=bw if isinstance(bw, (int, float)) else None)
    return info, world


EXCLUDED_FILE = "excluded-nodes.tsv"  # the job's record: ATTEMPT<TAB>NODE<TAB>REASON a line


def excluded_nodes(job_dir: Path) -> tuple[dict[str, Any], ...]:
    """The nodes the job's earlier attempts excluded before requeueing itself (the job appends
    one line per node to ``excluded-nodes.tsv``), in the order they were excluded."""
    path = Path(job_dir) / EXCLUDED_FILE
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ()
    out = []
    for line in lines:
        attempt, _, rest = line.partition("\t")
        node, _, reason = rest.partition("\t")
        if node.strip():
            out.append({"node": node.strip(), "reason": reason.strip(),
                        "attempt": int(attempt) if attempt.strip().isdigit() else None})
    return tuple(out)


EXIT_NAMES = {0: PASS, 1: FAIL, 2: "incomplete", 3: "error"}  # the self-test's exit codes


def _has_gpus(family: str | None) -> bool:
    fam = family_of_name(family)
    return fam is None or bool(fam.gpu_phases)


def _shared_report(job_dir: Path) -> tuple[str, dict[str, Any]] | None:
    """The multi-rank report in the job directory (only rank 0 of the self-test's one srun step
    writes one, holding every rank's checks and the collective), as (file name, report)."""
    for path in sorted(job_dir.glob("selftest-*.json")):
        try:
            rep = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(rep, dict) and isinstance(rep.get("world_size"), int) and \
                rep["world_size"] > 1:
            return path.name, rep
    return None


def collect(job_dir: Path, sif: Path, cluster: str, *, job: str | None = None,
            now: str | None = None, nodes: tuple[str, ...] = (),
            runtime: str | None = None) -> ClusterVerdict:
    """The cluster verdict of the job in ``job_dir`` about ``sif`` (its sha256 and labels).
    ``nodes``: the job's nodes (the generated job passes its allocation); one that left no
    result is a ``missing`` node, a fail. ``runtime``: the container runtime the job used."""
    job_dir, sif = Path(job_dir), Path(sif)
    if not cluster.strip():
        raise ClusterError("name the cluster (--cluster NAME): a verdict says where it holds")
    if not job_dir.is_dir():
        raise ClusterError(f"{job_dir}: no such job directory")
    if not sif.is_file():
        raise ClusterError(f"{sif}: no such SIF (the image the job ran)")
    try:
        labels = sif_labels(sif)
    except Exception as exc:  # noqa: BLE001 - any unreadable SIF is named the same way
        raise ClusterError(f"{sif}: not a readable SIF ({exc})") from None
    family = labels.get("org.verl-env.accelerator")
    names = sorted({p.name[len("selftest-"):].rsplit(".", 1)[0]
                    for p in job_dir.glob("selftest-*") if p.suffix in (".json", ".rc")}
                   | {n for n in nodes if n})
    if not names or not any(job_dir.glob("selftest-*")):
        raise ClusterError(f"{job_dir}: no selftest-<node>.json or .rc: the job's self-test "
                           "stage did not run there")
    shared = _shared_report(job_dir)  # rank 0's report: every rank's checks, the collective
    results, reports = [], []
    for name in names:
        rc_path, rep_path = job_dir / f"selftest-{name}.rc", job_dir / f"selftest-{name}.json"
        code: int | None = None
        if rc_path.exists():
            text = rc_path.read_text().strip()
            code = int(text) if text.isdigit() else None
        report: dict[str, Any] = {}
        reason = ""
        if rep_path.exists():
            try:
                loaded = json.loads(rep_path.read_text())
                report = loaded if isinstance(loaded, dict) else {}
            except (OSError, json.JSONDecodeError) as exc:
                reason = f"{rep_path.name}: {exc}"
        elif code is not None and shared is not None:
            # a rank other than 0: its own exit code (the ranks' agreed verdict); its checks, and
            # so its GPU facts, are in rank 0's shared report under ids suffixed @<node>
            view = host_view(shared[1], name)
            own = [c for c in view.get("checks") or () if str(c.get("phase")) == "gpu"]
            gpu = _node_gpu(view, family) if own else (
                {"status": "pending", "reason": f"no gpu checks for {name} in {shared[0]} (the "
                 "node's hostname differs from its Slurm name, or one host ran every rank)"}
                if _has_gpus(family) else {"status": NONE})
            results.append(NodeResult(
                name, code, EXIT_NAMES.get(code, "error"),
                f"checks in the ranks' shared report {shared[0]}", gpu))
            continue
        else:
            reason = f"no {rep_path.name}"
        overall = str(report.get("overall") or ("unreadable" if rep_path.exists() else "missing"))
        if report:
            reports.append(report)
            failing = [str(c.get("id")) for c in report.get("checks") or ()
                       if isinstance(c, dict) and c.get("status") == FAIL]
            reason = reason or (f"failing: {', '.join(failing[:5])}" if failing else "")
        results.append(NodeResult(name, code, overall, reason,
                                  _node_gpu(host_view(report, name), family)))
    inter, world = _inter_node(reports)
    stamp = now or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    subject = {"name": sif.name, "digest": sha256_file(sif),
               "target": labels.get("org.verl-env.target"), "family": family}
    return ClusterVerdict(cluster, subject, job or job_dir.name, stamp, tuple(results), world,
                          inter, runtime, excluded_nodes(job_dir))


def write(verdict: ClusterVerdict, path: Path) -> Path:
    atomic_write_text(path, json.dumps(verdict.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def read(path: Path) -> ClusterVerdict:
    try:
        return ClusterVerdict.from_dict(json.loads(Path(path).read_text()))
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        raise ClusterError(f"{path}: {exc}") from None


__all__ = ["ClusterError", "ClusterVerdict", "NodeResult", "collect", "read", "write"]
