"""Every installed distribution's declared requirements against what is installed (what
``pip check`` does), with the manifest's reviewed dependency overrides (``overrides``:
builder.overrides) as the only accepted exceptions.

An override forces one version of a package over what other packages declare (sglang 0.5.12
pins ``transformers==5.6.0``; the image holds the reviewed 5.9.0). So a requirement on an
overridden package is accepted exactly when the installed version is the override's and the
requirement is one the override replaces (declared by another distribution); every accepted
one is named in the check's reason. Any other unmet or missing requirement fails, naming the
distribution, the requirement and what is installed. Needs the image's ``packaging`` (verl
depends on it); without it the check is a required skip, never a pass.

Stdlib apart from that; imports nothing of ``builder``.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Iterable, Mapping

from ..manifest import normalize
from ..phase import skip
from ..report import FAIL, PASS, Check, threshold

PHASE = "versions"
CHECK_ID = "versions.requires"
SHOWN = 8  # violations named in the reason; the rest are counted


def overrides_of(manifest: Mapping[str, Any]) -> dict[str, str]:
    """``{normalised name: version}`` of the manifest's reviewed overrides."""
    raw = manifest.get("overrides") or {}
    if not isinstance(raw, dict):
        return {}
    return {normalize(k): str(v.get("version")) for k, v in raw.items()
            if isinstance(v, dict) and v.get("version")}


def installed_dists(path: list[str] | None = None) -> list[tuple[str, str, list[str]]]:
    """``(name, version, requirement strings)`` of every installed distribution, once each
    (the first on ``sys.path``, or ``path``, wins, as import does)."""
    seen: dict[str, tuple[str, str, list[str]]] = {}
    found = (importlib.metadata.distributions() if path is None
             else importlib.metadata.distributions(path=path))
    for dist in found:
        name = dist.metadata.get("Name")
        if not name or normalize(name) in seen:
            continue
        seen[normalize(name)] = (normalize(name), dist.version, list(dist.requires or []))
    return sorted(seen.values())


def applies(req: Any) -> bool:
    """The requirement's marker holds for this interpreter with no extra (what ``pip check``
    evaluates)."""
    return req.marker is None or req.marker.evaluate({"extra": ""})


def holds(req: Any, have: str | None) -> bool:
    """``have`` (None: not installed) satisfies the requirement's specifier, pre-releases
    included."""
    return have is not None and (not req.specifier
                                 or req.specifier.contains(have, prereleases=True))


def judge(dists: Iterable[tuple[str, str, list[str]]], overrides: Mapping[str, str],
          requirement_cls: Any) -> tuple[int, list[str], list[str]]:
    """(requirements that applied, violations, accepted by an override). Markers are
    evaluated for this interpreter with no extra (what ``pip check`` does)."""
    versions = {n: v for n, v, _ in dists}
    applied, bad, accepted = 0, [], []
    for name, version, reqs in dists:
        for text in reqs:
            req = requirement_cls(text)
            if not applies(req):
                continue
            applied += 1
            dep = normalize(req.name)
            have = versions.get(dep)
            if holds(req, have):
                continue
            what = (f"{name} {version} requires {req.name}{req.specifier}, "
                    + (f"{have} installed" if have is not None else "not installed"))
            forced = overrides.get(dep)
            if forced is not None and have == forced and dep != name:
                accepted.append(f"{what} (replaced by the reviewed override {dep}=={forced})")
            else:
                bad.append(what)
    return applied, bad, accepted


def decide(overrides: Mapping[str, str], applied: int, bad: list[str], accepted: list[str],
           versions: Mapping[str, str | None]) -> Check:
    """Fail on any violation, or on an override the image does not hold at its version."""
    thr = threshold("==", 0, "every installed distribution's requirements; the manifest's "
                             "reviewed overrides replace the ones they name")
    for dep, forced in sorted(overrides.items()):
        if versions.get(dep) != forced:
            bad.append(f"the reviewed override {dep}=={forced} is not what is installed "
                       f"({versions.get(dep) or 'not installed'})")
    if bad:
        more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        return Check(CHECK_ID, PHASE, FAIL, value=len(bad), unit="violations", threshold=thr,
                     reason="; ".join(bad[:SHOWN]) + more)
    said = f"; accepted: {'; '.join(accepted)}" if accepted else ""
    return Check(CHECK_ID, PHASE, PASS, value=0, unit="violations", threshold=thr,
                 reason=f"{applied} requirements hold{said}")


def check(manifest: Mapping[str, Any], path: list[str] | None = None) -> Check:
    """The check on this interpreter's installed distributions (``path``: those on it)."""
    try:
        from packaging.requirements import Requirement  # type: ignore[import-not-found]
    except ImportError:
        return skip(CHECK_ID, PHASE, "packaging is not installed in the image: cannot evaluate "
                                     "the installed requirements", required=True)
    dists = installed_dists(path)
    overrides = overrides_of(manifest)
    applied, bad, accepted = judge(dists, overrides, Requirement)
    return decide(overrides, applied, bad, accepted, {n: v for n, v, _ in dists})
