"""Every verdict that travels with a SIF (its signed build verdict and each signed cluster
verdict) or with an image in a registry, newest first; and which of several last passed on a
cluster. Refused verdicts (unsigned, unknown key, altered, about another file) are listed with
the reason. ``build-env status`` (:mod:`builder.commands.status`) prints them.

A reference that names an OCI image index (``build-env publish`` of several platforms) is
answered per platform (:class:`PlatformStatus`): each entry's manifest digest, its platform and
target as the index declares them, and the verdicts that travel with that manifest (checked as
``trust verify`` checks one image; a platform whose referrers do not verify is listed as
refused, never silently left out)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.audit.result import summary as audit_summary
from builder.engine.credentials import resolve_credentials
from builder.errors import PublishError, TrustError
from builder.registry.api import Client, Transient, index_entries, is_index, is_loopback
from builder.files import sha256_file
from builder.trust import remote
from builder.trust.cluster_signing import Entry, read_clusters
from builder.trust.keys import load_public
from builder.trust.referrers import MANIFEST_TYPES
from builder.trust.sign import sidecar_of
from builder.trust.signatures import verify_sif

__all__ = ["Entry", "Listing", "PlatformStatus", "gather", "index_platforms", "last_passed",
           "reference_entries", "sif_entries", "survey"]


def sif_entries(sif: Path, key_paths: Sequence[Path]) -> list[Entry]:
    """Every verdict that travels with ``sif``, newest first (refused ones listed as such)."""
    sif = Path(sif)
    if not sif.is_file():
        raise TrustError(f"{sif}: no such file")
    if not key_paths:
        raise TrustError("no public key given (--key verl-env.pub)")
    keys = [load_public(k) for k in key_paths]
    entries: list[Entry] = []
    if sidecar_of(sif).exists():
        try:
            checked = verify_sif(sif, list(key_paths))
            v = checked.verdict
            assert v is not None
            entries.append(Entry("build", str(sidecar_of(sif)), v.recorded_at, v.overall,
                                 v.level, None, v.describe(),
                                 checked.keyids[0] if checked.keyids else None))
        except TrustError as exc:
            entries.append(Entry("build", str(sidecar_of(sif)), None, None, None, None, "", None,
                                 str(exc).removeprefix("trust: ")))
    entries += read_clusters(sif, keys, sha256_file(sif))
    return sorted(entries, key=lambda e: (e.recorded_at or ""), reverse=True)


def reference_entries(ref: str, keys: Sequence[Path], insecure: bool) -> list[Entry]:
    """The verdicts attached to a registry reference (every referrer checked as `trust verify`
    does: one that does not verify refuses the whole reference)."""
    checked = remote.verify_reference(ref, list(keys), insecure=insecure)
    v = checked.verdict
    entries = [Entry("build", ref, v.recorded_at if v else None, v.overall if v else None,
                     v.level if v else None, None, v.describe() if v else "")]
    entries += [Entry("cluster", ref, c.recorded_at, c.overall, c.level, c.cluster, c.describe())
                for c in checked.clusters]
    if checked.audit is not None:  # the last signed audit: its counts and database date
        entries.append(Entry("audit", ref, checked.audit.get("audited_at"), None, None, None,
                             audit_summary(checked.audit)))
    return sorted(entries, key=lambda e: e.recorded_at or "", reverse=True)


@dataclass(frozen=True)
class PlatformStatus:
    """One platform of an image index: its manifest and the verdicts that travel with it."""

    platform: str  # os/architecture[/variant], as the index declares it
    digest: str  # the platform's manifest
    reference: str  # HOST/REPO@digest
    target: str | None
    entries: list[Entry] = field(default_factory=list)  # newest first
    refused: str | None = None  # why its verdicts do not count

    @property
    def verdict(self) -> Entry | None:
        """Its build verdict (the gate's), when one verified."""
        return next((e for e in self.entries if e.kind == "build"), None)

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        return {"platform": self.platform, "digest": self.digest, "reference": self.reference,
                "target": self.target, "refused": self.refused,
                "verdict": None if v is None else v.overall, "level": None if v is None
                else v.level, "gate_time": None if v is None else v.recorded_at,
                "entries": [e.to_dict() for e in self.entries]}


@dataclass
class Listing:
    """What ``status`` found: each item's verdicts (an index's: every platform's, together),
    and, for an item that is an image index, each platform's."""

    entries: dict[str, list[Entry]] = field(default_factory=dict)
    platforms: dict[str, list[PlatformStatus]] = field(default_factory=dict)


def index_platforms(ref: str, keys: Sequence[Path], insecure: bool
                    ) -> list[PlatformStatus] | None:
    """Each platform of the image index ``ref`` names, with its verdicts; None when ``ref``
    names no index (one image, a SIF artifact)."""
    if ref.startswith("oras://"):
        return None
    parsed = remote.parse(ref)
    scheme = "http" if insecure or is_loopback(parsed.host) else "https"
    reg = Client(parsed.host, parsed.repo, scheme, resolve_credentials(parsed.host))
    try:
        got = reg.fetch_manifest(parsed.reference, MANIFEST_TYPES)
    except (PublishError, Transient) as exc:
        raise TrustError(f"{parsed}: registry: {str(exc).removeprefix('publish: ')}") from None
    assert got is not None
    body = json.loads(got[1])
    if not is_index(got[2], body):
        return None
    out = []
    for e in index_entries(body):
        where = f"{parsed.host}/{parsed.repo}@{e.digest}"
        try:
            entries, refused = reference_entries(where, keys, insecure), None
        except TrustError as exc:
            entries, refused = [], str(exc).removeprefix("trust: ")
        out.append(PlatformStatus(str(e.platform), e.digest, where, e.target, entries, refused))
    return out


def survey(items: Sequence[str], keys: Sequence[Path], *, insecure: bool = False) -> Listing:
    """The verdicts of each item: a SIF file, or a registry reference (an item that is no
    existing path and looks like one), per platform when it names an image index."""
    listing = Listing()
    for item in items:
        if Path(item).exists() or not remote.looks_like_reference(item):
            listing.entries[item] = sif_entries(Path(item), keys)
            continue
        platforms = index_platforms(item, keys, insecure)
        if platforms is None:
            listing.entries[item] = reference_entries(item, keys, insecure)
            continue
        listing.platforms[item] = platforms
        listing.entries[item] = sorted((e for p in platforms for e in p.entries),
                                       key=lambda e: e.recorded_at or "", reverse=True)
    return listing


def gather(items: Sequence[str], keys: Sequence[Path], *, insecure: bool = False
           ) -> dict[str, list[Entry]]:
    """The verdicts of each item (:func:`survey`, without the per-platform view)."""
    return survey(items, keys, insecure=insecure).entries


def last_passed(listing: Mapping[str, list[Entry]], cluster: str) -> tuple[str, Entry] | None:
    """Which item of ``listing`` last passed on ``cluster`` (by its signed cluster verdicts)."""
    candidates = [(k, e) for k, v in listing.items() for e in v
                  if e.kind == "cluster" and not e.refused and e.cluster == cluster
                  and e.overall == "pass"]
    return max(candidates, key=lambda pair: pair[1].recorded_at or "", default=None)
