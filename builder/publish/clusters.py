"""Cluster verdicts (``build-env cluster``) attached at publish (``--attach``): each checked to
be about the SIF before anything is pushed, then signed about the image manifest, the SIF
artifact and the SIF file and pushed as a referrer of both manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.cluster.verdict import ClusterVerdict
from builder.cluster.verdict import read as read_cluster_verdict
from builder.errors import ClusterError, PublishError
from builder.files import sha256_file
from builder.publish.transfer import retrying
from builder.registry.api import Client
from builder.trust import referrers
from builder.trust import statements as st
from builder.trust.cluster_signing import envelope, referrer_kind
from builder.trust.keys import load_private


def _clusters_to_attach(files: tuple[Path, ...], sif: Path | None,
                        sign_key: Path | None) -> list[ClusterVerdict]:
    """The cluster verdicts of ``--attach``, each about this SIF: checked before any push."""
    if not files:
        return []
    if sign_key is None or sif is None:
        raise PublishError("--attach signs cluster verdicts about the SIF: give --sign-key and "
                           "--sif")
    digest = sha256_file(sif)
    out = []
    for path in files:
        try:
            verdict = read_cluster_verdict(path)
        except ClusterError as exc:
            raise PublishError(str(exc).removeprefix("cluster: ")) from None
        if verdict.subject.get("digest") != digest:
            raise PublishError(f"{path}: the cluster verdict is about "
                               f"{verdict.subject.get('digest')}, not {sif} ({digest})")
        out.append(verdict)
    return out


def _attach_clusters(reg: Client, clusters: list[ClusterVerdict], sign_key: Path, image_digest: str,
                     sif_record: dict[str, Any], sif_name: str, attempts: int
                     ) -> list[dict[str, Any]]:
    """Each cluster verdict signed about the image manifest, the SIF artifact and the SIF file,
    and pushed as a referrer of both manifests (its own kind: several live side by side)."""
    private = load_private(sign_key)
    subjects = [st.subject(f"{reg.host}/{reg.repo}", image_digest),
                st.subject(f"oras://{reg.host}/{reg.repo}", sif_record["digest"]),
                st.subject(sif_name, sif_record["blob_digest"])]
    out = []
    for verdict in clusters:
        env = envelope(subjects, verdict, private)
        kind = referrer_kind(verdict)
        pushed = {what: _attach_cluster(reg, digest, env, kind, attempts)
                  for what, digest in (("image", image_digest), ("sif", sif_record["digest"]))}
        out.append({"cluster": verdict.cluster, "job": verdict.job, "overall": verdict.overall,
                    "level": verdict.level, "recorded_at": verdict.recorded_at, "kind": kind,
                    "referrers": pushed})
    return out


def _attach_cluster(reg: Client, digest: str, env: dict[str, Any], kind: str, attempts: int
                    ) -> dict[str, Any]:
    """One signed cluster verdict pushed as a referrer (of its own ``kind``) of ``digest``."""
    subject = retrying(lambda: referrers.read_subject(reg, digest),
                       f"read back {reg.repo}@{digest}", attempts)
    return retrying(lambda: referrers.attach(reg, subject, [env], kind=kind, cosign=False),
                    f"cluster verdict of {reg.repo}@{digest}", attempts)
