"""Bus bandwidth, the reference table, and which transport NCCL/RCCL used. Pure, except
``load_reference`` reading the JSON table(s).

busbw follows nccl-tests: ``algbw = S / t`` and, for all-reduce, ``busbw = algbw·2(n−1)/n``
(GB = 1e9). A 1-rank run has no bus bandwidth.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable

from .. import BW_REF_SCHEMA
from ..report import FAIL, PASS, SKIP, WARN, Check, threshold

DEFAULT_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bw_ref.json")
WARN_FRAC, FAIL_FRAC = 0.9, 0.75


class BwRefError(ValueError):
    """The reference table file is malformed."""


def bus_bandwidth(size_bytes: int, seconds: float, n: int) -> tuple[float, float | None]:
    """(algbw, busbw) in GB/s for an all-reduce of ``size_bytes`` over ``n`` ranks."""
    algbw = size_bytes / 1e9 / seconds
    return algbw, (algbw * 2 * (n - 1) / n) if n > 1 else None


def parse_reference(data: Any, source: str) -> list[dict[str, Any]]:
    """Validate a table: ``{"schema": ..., "entries": [...]}`` or a bare list of entries."""
    if isinstance(data, dict):
        if data.get("schema", BW_REF_SCHEMA) != BW_REF_SCHEMA:
            raise BwRefError(f"{source}: schema {data.get('schema')!r}, want {BW_REF_SCHEMA}")
        data = data.get("entries")
    if not isinstance(data, list):
        raise BwRefError(f"{source}: expected a list of entries")
    out = []
    for i, e in enumerate(data):
        where = f"{source}: entry {i}"
        if not isinstance(e, dict) or not isinstance(e.get("match"), list) or not e["match"]:
            raise BwRefError(f"{where}: needs 'match', a non-empty list of name substrings")
        if ("busbw" in e) == ("per_peer" in e):
            raise BwRefError(f"{where}: needs exactly one of 'busbw' or 'per_peer'")
        value = e.get("busbw", e.get("per_peer"))
        if not isinstance(value, (int, float)) or value <= 0:
            raise BwRefError(f"{where}: bandwidth must be a positive number")
        if e.get("gpus") is not None and not isinstance(e["gpus"], int):
            raise BwRefError(f"{where}: 'gpus' must be an integer or null")
        out.append({**e, "origin": source})
    return out


def load_reference(override: str | None = None) -> list[dict[str, Any]]:
    """Site entries from ``--bw-ref`` first (they win), then the shipped table."""
    entries: list[dict[str, Any]] = []
    for path in ([override] if override else []) + [DEFAULT_TABLE]:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise BwRefError(f"{path}: cannot read reference table: {e}") from None
        entries += parse_reference(data, path)
    return entries


def guess_interconnect(gpu_name: str, nodes: int, network: str | None) -> str:
    """Key for the table: ib | socket | <network> across nodes; pcie | xgmi | nvlink on one."""
    if nodes > 1:
        net = (network or "").lower()
        if net.startswith("ib") or "roce" in net:
            return "ib"
        if "socket" in net:
            return "socket"
        return net or "unknown"
    name = gpu_name.lower()
    if "pcie" in name:
        return "pcie"
    if "mi2" in name or "mi3" in name:
        return "xgmi"
    return "nvlink"


def lookup_reference(entries: Iterable[dict[str, Any]], gpu_name: str, gpus: int, nodes: int,
                     interconnect: str) -> tuple[dict[str, Any], float] | None:
    """The first entry matching the GPU model, GPUs per node, node count and interconnect,
    with its reference busbw (``per_peer`` entries scale as per_peer·(n−1))."""
    name = gpu_name.lower()
    for e in entries:
        if not any(m == "*" or m.lower() in name for m in e["match"]):
            continue
        if any(x.lower() in name for x in e.get("exclude", [])):
            continue
        if e.get("interconnect", "any") not in ("any", interconnect):
            continue
        if e.get("gpus") is not None and e["gpus"] != gpus:
            continue
        if int(e.get("nodes", 1)) != nodes:
            continue
        if "busbw" in e:
            return e, float(e["busbw"])
        if gpus * nodes < 2:
            continue
        return e, float(e["per_peer"]) * (gpus * nodes - 1)
    return None


def decide_busbw(busbw: float | None, world: int, ref: tuple[dict[str, Any], float] | None,
                 key: str, required: bool, warn_frac: float = WARN_FRAC,
                 fail_frac: float = FAIL_FRAC, detail: str = "") -> Check:
    """pass ≥ warn_frac·ref, warn ≥ fail_frac·ref, fail below; 1 rank or unknown hardware
    is a skip that still records the measured number (never a pass)."""
    cid = "collective.busbw"
    if world < 2:
        return Check(cid, "collective", SKIP, required=False, applies=False, value=None,
                     unit="GB/s", reason="1 rank: bus bandwidth is undefined (factor 2(n-1)/n = 0)")
    if busbw is None:
        return Check(cid, "collective", SKIP, required=required, unit="GB/s",
                     reason="bandwidth was not measured")
    if ref is None:
        return Check(cid, "collective", SKIP, required=False, applies=False, value=busbw,
                     unit="GB/s", reason=f"no reference for {key}; {detail}".rstrip("; "))
    entry, value = ref
    thr = threshold(">=", fail_frac * value, f"{fail_frac} x {value:g} GB/s "
                    f"({entry.get('name', key)}; {entry.get('source', entry['origin'])})",
                    warn_below=warn_frac * value, reference=value)
    if busbw >= warn_frac * value:
        status, why = PASS, ""
    elif busbw >= fail_frac * value:
        status, why = WARN, f"below {warn_frac} x reference"
    else:
        status, why = FAIL, f"below {fail_frac} x reference"
    reason = "; ".join(x for x in (why, key, detail) if x)
    return Check(cid, "collective", status, required=required, value=busbw, unit="GB/s",
                 threshold=thr, reason=reason)


_VERSION = re.compile(r"\b[NR]CCL version:?\s*([0-9]+\.[0-9]+\.[0-9]+)")
_NETWORK = re.compile(r"Using network ([^\n\r]+)")
_NET_PLUGIN = re.compile(r"NET/(IB|Socket|OFI|AWS)\b")
_VIA = re.compile(r"\bvia (P2P/[A-Za-z]+|SHM|NET/[A-Za-z]+|NVLS|CollNet[A-Za-z]*)")


def parse_nccl_log(text: str) -> dict[str, Any]:
    """From ``NCCL_DEBUG=INFO`` output: library version, network plugin used between nodes,
    channel transports (P2P/IPC, SHM, NET/IB, ...) and whether NVLS was set up."""
    version = _VERSION.search(text)
    network = _NETWORK.search(text)
    plugin = _NET_PLUGIN.search(text)
    net = network.group(1).strip() if network else (plugin.group(1) if plugin else None)
    return {
        "version": version.group(1) if version else None,
        "network": net,
        "channels": sorted(set(_VIA.findall(text))),
        "nvls": bool(re.search(r"\bNVLS\b", text)),
    }


def describe_transport(parsed: Iterable[dict[str, Any]], nodes: int, backend: str) -> str:
    """One word for the report: ``gloo/tcp``; across nodes ``IB``, ``sockets`` or the
    network plugin; on one node ``intra-node (P2P/IPC+SHM)``; ``unknown`` without a log."""
    if backend == "gloo":
        return "gloo/tcp"
    parsed = list(parsed)
    channels = sorted({c for p in parsed for c in p.get("channels", [])})
    networks = [p["network"] for p in parsed if p.get("network")]
    if nodes > 1:
        if any(c == "NET/IB" for c in channels) or any(n.upper().startswith("IB")
                                                      for n in networks):
            return "IB"
        if any(c == "NET/Socket" for c in channels) or any("socket" in n.lower()
                                                          for n in networks):
            return "sockets"
        return networks[0] if networks else "unknown (no NCCL log)"
    if channels:
        return "intra-node (" + "+".join(channels) + ")"
    return "intra-node" if parsed else "unknown (no NCCL log)"


def decide_transport(transport: str, nodes: int, rdma_present: bool, required: bool) -> Check:
    """Across nodes: IB passes; sockets fail when RDMA devices are present (silent fallback),
    warn otherwise. On one node the transport is recorded."""
    cid = "collective.transport"
    if nodes <= 1 or transport == "gloo/tcp":
        return Check(cid, "collective", PASS, required=False, value=transport,
                     reason=f"{nodes} node(s)")
    if transport == "IB":
        return Check(cid, "collective", PASS, required=required, value=transport)
    if transport == "sockets":
        if rdma_present:
            return Check(cid, "collective", FAIL, required=required, value=transport,
                         reason="NCCL used sockets between nodes although RDMA devices are "
                                "present (check NCCL_IB_HCA, libibverbs, /dev/infiniband)")
        return Check(cid, "collective", WARN, required=required, value=transport,
                     reason="NCCL used sockets between nodes (no RDMA device in the container)")
    return Check(cid, "collective", WARN, required=required, value=transport,
                 reason="could not tell the inter-node transport")


def expand_debug_file(pattern: str, host: str, pid: int) -> str:
    """NCCL_DEBUG_FILE expands %h to the host name (up to its first dot) and %p to the pid."""
    return pattern.replace("%h", host.split(".")[0]).replace("%p", str(pid))
