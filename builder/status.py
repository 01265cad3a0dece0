"""Every verdict that travels with a SIF (its signed build verdict and each signed cluster
verdict) or with an image in a registry, newest first; and which of several last passed on a
cluster. Refused verdicts (unsigned, unknown key, altered, about another file) are listed with
the reason. ``build-env status`` (:mod:`builder.commands.status`) prints them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from builder.errors import TrustError
from builder.files import sha256_file
from builder.trust import remote
from builder.trust.cluster_signing import Entry, read_clusters
from builder.trust.keys import load_public
from builder.trust.sign import sidecar_of
from builder.trust.signatures import verify_sif

__all__ = ["Entry", "gather", "last_passed", "reference_entries", "sif_entries"]


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
    return sorted(entries, key=lambda e: e.recorded_at or "", reverse=True)


def gather(items: Sequence[str], keys: Sequence[Path], *, insecure: bool = False
           ) -> dict[str, list[Entry]]:
    """The verdicts of each item: a SIF file, or a registry reference (an item that is no
    existing path and looks like one)."""
    listing: dict[str, list[Entry]] = {}
    for item in items:
        if not Path(item).exists() and remote.looks_like_reference(item):
            listing[item] = reference_entries(item, keys, insecure)
        else:
            listing[item] = sif_entries(Path(item), keys)
    return listing


def last_passed(listing: Mapping[str, list[Entry]], cluster: str) -> tuple[str, Entry] | None:
    """Which item of ``listing`` last passed on ``cluster`` (by its signed cluster verdicts)."""
    candidates = [(k, e) for k, v in listing.items() for e in v
                  if e.kind == "cluster" and not e.refused and e.cluster == cluster
                  and e.overall == "pass"]
    return max(candidates, key=lambda pair: pair[1].recorded_at or "", default=None)
