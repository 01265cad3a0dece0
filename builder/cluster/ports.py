"""The ports a job's Ray cluster and self-test open: fixed so that firewalls and ``doctor`` can
know them (:class:`RayPorts`), a compact block on shared nodes, moved by the job id so that jobs
sharing a node do not share ports (``port_slots``, :func:`port_span`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from builder.errors import SlurmError


@dataclass(frozen=True)
class RayPorts:
    """Every port a Ray node opens, fixed so that firewalls and ``doctor`` can know them.

    ``gcs``, ``dashboard`` and ``client`` are opened by the head only; the rest by every node.
    """

    gcs: int = 6379
    dashboard: int = 8265
    client: int = 10001
    node_manager: int = 6800
    object_manager: int = 6801
    runtime_env_agent: int = 6802
    dashboard_agent_grpc: int = 6803
    metrics_export: int = 6804
    dashboard_agent_listen: int = 52365
    min_worker: int = 10002
    max_worker: int = 19999

    def head_only(self) -> dict[str, int]:
        """The ports only the head node opens."""
        return {"gcs": self.gcs, "dashboard": self.dashboard, "client": self.client}

    def per_node(self, index: int = 0, stride: int = 0) -> dict[str, int]:
        """The single ports node ``index`` opens (shifted by ``index * stride``)."""
        shift = index * stride
        names = ("node_manager", "object_manager", "runtime_env_agent", "dashboard_agent_grpc",
                 "metrics_export", "dashboard_agent_listen")
        return {n: getattr(self, n) + shift for n in names}

    def worker_range(self, index: int = 0, stride: int = 0) -> range:
        """The worker port range of node ``index`` (inclusive of ``max_worker``)."""
        shift = index * stride
        return range(self.min_worker + shift, self.max_worker + shift + 1)


#: The ports of a job on shared nodes (``--no-exclusive``): one compact block of 400 (head,
#: self-test rendezvous, per-node ports, 390 worker ports), moved by the job id (below).
SHARED_RAY_PORTS = RayPorts(gcs=20000, dashboard=20001, client=20002, node_manager=20004,
                            object_manager=20005, runtime_env_agent=20006,
                            dashboard_agent_grpc=20007, metrics_export=20008,
                            dashboard_agent_listen=20009, min_worker=20010, max_worker=20399)
SHARED_SELFTEST_PORT = 20003
#: Ports stay below Linux's default ephemeral range (32768-60999), where the kernel hands out
#: client ports that a listener could collide with.
PORT_CEILING = 32767


class PortedJob(Protocol):
    """What of a job its ports depend on (:class:`builder.cluster.job.SlurmJob` has it)."""

    target: str
    nodes: int | None
    port_stride: int
    port_slots: int | None
    selftest_port: int | None

    @property
    def ports(self) -> RayPorts: ...


def port_claims(job: PortedJob) -> list[tuple[int, str]]:
    """Every port the job opens before its job-id shift, with what opens it."""
    ports = job.ports
    claims = [(p, f"head {n}") for n, p in ports.head_only().items()]
    claims.append((job.selftest_port or 0, "self-test rendezvous"))
    for i in range((job.nodes or 1) if job.port_stride else 1):
        claims += [(p, f"node {i} {n}") for n, p in ports.per_node(i, job.port_stride).items()]
        claims += [(p, f"node {i} worker range") for p in ports.worker_range(i, job.port_stride)]
    return claims


def port_span(job: PortedJob) -> int:
    """How far apart two jobs' port blocks are: the span of the job's ports."""
    claimed = [p for p, _ in port_claims(job)]
    return max(claimed) - min(claimed) + 1


def slot_count(job: PortedJob) -> int:
    """How many job-id slots fit between the job's ports and PORT_CEILING (at least 1)."""
    try:
        top = max(p for p, _ in port_claims(job))
        return max(1, (PORT_CEILING - top) // port_span(job) + 1)
    except (TypeError, ValueError):  # validate() names what is wrong
        return 1


def check_ports(job: PortedJob) -> None:
    ports = job.ports
    seen: dict[int, str] = {}
    if ports.min_worker > ports.max_worker:
        raise _fail("min_worker port is above max_worker", job)
    if job.port_stride and job.nodes is None:
        raise _fail("a per-node port stride needs the node count (nodes)", job)
    slots = job.port_slots or 1
    if slots < 1:
        raise _fail("port_slots must be >= 1", job)
    top = (slots - 1) * port_span(job)
    for port, what in port_claims(job):
        if not 1024 <= port <= 65535 - top:
            raise _fail(f"{what} port {port} is outside 1024-{65535 - top}"
                        + (f" (the job-id shift adds up to {top})" if top else ""), job)
        if port in seen:
            raise _fail(f"port {port} is used twice ({seen[port]} and {what})", job)
        seen[port] = what



def _fail(message: str, job: PortedJob) -> SlurmError:
    return SlurmError(message, target=job.target)
