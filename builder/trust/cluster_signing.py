"""Signed cluster verdicts beside a SIF: signing one, and reading them back checked (for
``build-env status``, :mod:`builder.publish.status`).

A cluster verdict (:class:`builder.cluster.verdict.ClusterVerdict`) is signed as an in-toto
Statement (predicate ``https://verl-env.dev/cluster-verification/v1``) whose subject is the SIF's
sha256, one DSSE envelope a line of ``NAME.sif.clusters.intoto.jsonl`` (appended: one line per
job); :mod:`builder.publish.push` pushes the same envelope as a registry referrer.
Reading it back, a line that is unsigned, signed by an unknown key, altered, or about another
file is *refused* (listed with the reason, never counted).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import __version__
from builder.cluster.verdict import ClusterVerdict
from builder.errors import TrustError
from builder.files import atomic_write_text, sha256_file
from builder.trust import dsse
from builder.trust import statements as st
from builder.trust.keys import keyid, load_private

CLUSTER_TYPE = st.CLUSTER_TYPE


def envelope(subjects: list[dict[str, Any]], verdict: ClusterVerdict, private: Any
             ) -> dict[str, Any]:
    """The signed DSSE envelope of ``verdict``'s statement about ``subjects``."""
    stmt = st.statement(subjects, CLUSTER_TYPE,
                        {"clusterVerdict": verdict.to_dict(), "builderVersion": __version__})
    return dsse.sign(st.to_bytes(stmt), private)


def referrer_kind(verdict: ClusterVerdict) -> str:
    """The referrer's own kind (its tag suffix): one per cluster and job."""
    name = re.sub(r"[^a-z0-9]+", "-", verdict.cluster.lower()).strip("-")[:40] or "cluster"
    key = hashlib.sha256(f"{verdict.cluster}\0{verdict.job}\0{verdict.recorded_at}".encode())
    return f"cluster-{name}-{key.hexdigest()[:12]}"


def clusters_sidecar(sif: Path) -> Path:
    return sif.with_name(sif.name + ".clusters.intoto.jsonl")


def sign_cluster(sif: Path, verdict: ClusterVerdict, key: Path) -> tuple[Path, str]:
    """Append the signed statement of ``verdict`` to the SIF's cluster sidecar; refuses a
    verdict about another file. Returns (sidecar, keyid)."""
    sif = Path(sif)
    if not sif.is_file():
        raise TrustError(f"{sif}: no such file")
    digest = sha256_file(sif)
    if verdict.subject.get("digest") != digest:
        raise TrustError(f"{sif}: refusing to sign: the cluster verdict is about "
                         f"{verdict.subject.get('digest')}, not this file ({digest})")
    private = load_private(key)
    line = json.dumps(envelope([st.subject(sif.name, digest)], verdict, private),
                      sort_keys=True, separators=(",", ":"))
    sidecar = clusters_sidecar(sif)
    old = sidecar.read_text() if sidecar.exists() else ""
    atomic_write_text(sidecar, old + ("" if not old or old.endswith("\n") else "\n") + line + "\n")
    return sidecar, keyid(private.public_key())


@dataclass(frozen=True)
class Entry:
    """One verdict that travels with a SIF (or why it was refused)."""

    kind: str  # build | cluster
    where: str  # file[:line]
    recorded_at: str | None
    overall: str | None
    level: str | None
    cluster: str | None
    detail: str
    keyid: str | None = None
    refused: str | None = None  # why it does not count

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_clusters(sif: Path, keys: list[Any], digest: str) -> list[Entry]:
    """The cluster verdicts of the SIF's cluster sidecar, each checked (see the module doc)."""
    sidecar = clusters_sidecar(sif)
    if not sidecar.exists():
        return []
    out = []
    for n, line in enumerate(sidecar.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{sidecar}:{n}"
        try:
            opened = st.open_statement(json.loads(line), keys, where)
            stmt, subjects = opened.statement, opened.subjects
            if opened.predicate_type != CLUSTER_TYPE:
                raise TrustError(f"{where}: predicateType {opened.predicate_type!r} is not "
                                 f"{CLUSTER_TYPE}")
            if digest.split(":", 1)[1] not in subjects:
                raise TrustError(f"{where}: the statement is about sha256:{(subjects or ['?'])[0]}"
                                 f", not this file ({digest})")
            try:
                v = ClusterVerdict.from_dict((stmt.get("predicate") or {}).get("clusterVerdict"))
            except ValueError as exc:
                raise TrustError(f"{where}: {exc}") from None
            if v.subject.get("digest") != digest:
                raise TrustError(f"{where}: the cluster verdict names {v.subject.get('digest')}, "
                                 f"not this file ({digest})")
        except json.JSONDecodeError as exc:
            out.append(Entry("cluster", where, None, None, None, None, "", None,
                             f"{where}: not JSON ({exc.msg})"))
            continue
        except TrustError as exc:
            out.append(Entry("cluster", where, None, None, None, None, "", None,
                             str(exc).removeprefix("trust: ")))
            continue
        out.append(Entry("cluster", where, v.recorded_at, v.overall, v.level, v.cluster,
                         v.describe(), opened.keyid))
    return out
