"""A CycloneDX 1.6 SBOM of an image: its Python distributions and its Debian packages.

A stdlib script runs inside a container of the image, with the image's own interpreter
(``/opt/venv/bin/python`` when present, else ``python3``), and prints what
``importlib.metadata`` and ``dpkg-query -W`` know. The document is then built on the host with
``cyclonedx-python-lib``. Nothing is mounted, so this works with a remote engine too; only
``builder.engine`` speaks Docker.
"""

from __future__ import annotations

import datetime
import json
import uuid
from dataclasses import dataclass
from typing import Any

from builder import catalog
from builder.engine import ContainerEngine
from builder.errors import TrustError

MARKER = "--verl-env-sbom--"
# Runs under /bin/sh in the image.
_LAUNCH = ('if [ -x /opt/venv/bin/python ]; then PY=/opt/venv/bin/python; else '
           'PY=$(command -v python3 || command -v python) || { echo "no python in image" >&2; '
           'exit 3; }; fi; exec "$PY" -c "$0" "$PY"')
_COLLECT = r'''
import importlib.metadata as md, json, shutil, subprocess, sys
dists = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if name and name.lower() not in dists:
        dists[name.lower()] = {"name": name, "version": d.version,
                               "license": d.metadata.get("License-Expression")
                               or d.metadata.get("License") or ""}
debs = []
if shutil.which("dpkg-query"):
    out = subprocess.run(["dpkg-query", "-W", "-f",
                          "${Package}\t${Version}\t${Architecture}\t${db:Status-Abbrev}\n"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[3].startswith("ii"):
            debs.append({"name": parts[0], "version": parts[1], "arch": parts[2]})
osr = {}
try:
    for line in open("/etc/os-release"):
        k, _, v = line.strip().partition("=")
        if k:
            osr[k] = v.strip('"')
except OSError:
    pass
print("--verl-env-sbom--")
print(json.dumps({"interpreter": sys.argv[1], "python": sys.version.split()[0],
                  "python_packages": sorted(dists.values(), key=lambda x: x["name"].lower()),
                  "debian_packages": debs, "os": {"id": osr.get("ID", ""),
                  "version_id": osr.get("VERSION_ID", "")}}))
'''


@dataclass(frozen=True)
class Inventory:
    """What the script found in the image."""

    interpreter: str
    python: str
    python_packages: tuple[dict[str, str], ...]
    debian_packages: tuple[dict[str, str], ...]
    os_id: str = ""
    os_version: str = ""


def collect(engine: ContainerEngine, image: str, *, timeout: float = 300) -> Inventory:
    """Run the inventory script in a throw-away container of ``image`` (no network)."""
    result = engine.run(image, ["-c", _LAUNCH, _COLLECT], entrypoint=["/bin/sh"],
                        timeout=timeout, network="none", shm_size="64m", role="sbom")
    if result.exit_code != 0 or MARKER not in result.logs:
        raise TrustError(f"{image[:19]}: SBOM inventory failed (exit {result.exit_code}): "
                         f"{result.logs[-1500:].strip()}")
    try:
        data = json.loads(result.logs.split(MARKER, 1)[1].strip().splitlines()[0])
    except (json.JSONDecodeError, IndexError) as exc:
        raise TrustError(f"{image[:19]}: SBOM inventory printed no JSON ({exc})") from None
    return Inventory(data["interpreter"], data["python"], tuple(data["python_packages"]),
                     tuple(data["debian_packages"]), data["os"]["id"], data["os"]["version_id"])


def build(inv: Inventory, *, name: str, version: str, pins: dict[str, str] | None = None,
          timestamp: str | None = None) -> dict[str, Any]:
    """The CycloneDX 1.6 JSON document (as a dict). ``name``/``version`` name the image (target
    and image digest); ``pins`` go into the metadata as ``verl-env:pin:<package>`` properties."""
    # CycloneDX and packageurl load in about 0.3 s: only a signing run pays for them
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.license import DisjunctiveLicense
    from cyclonedx.output import make_outputter
    from cyclonedx.schema import OutputFormat, SchemaVersion
    from packageurl import PackageURL

    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"verl-env:{name}:{version}"))
    if timestamp:
        bom.metadata.timestamp = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    bom.metadata.component = Component(
        type=ComponentType.CONTAINER, name=name, version=version, bom_ref="image",
        properties=[Property(name=f"verl-env:pin:{k}", value=v)
                    for k, v in sorted((pins or {}).items())]
        + [Property(name="verl-env:interpreter", value=inv.interpreter),
           Property(name="verl-env:python", value=inv.python)])
    seen: set[str] = set()
    for p in inv.python_packages:
        purl = PackageURL("pypi", name=p["name"].lower().replace("_", "-"), version=p["version"])
        ref = str(purl)
        if ref in seen:
            continue
        seen.add(ref)
        licenses: list[Any] = []
        lic = (p.get("license") or "").strip()
        if lic and len(lic) < 100 and "\n" not in lic:
            licenses = [DisjunctiveLicense(name=lic)]  # a name: not always valid SPDX
        bom.components.add(Component(type=ComponentType.LIBRARY, name=p["name"],
                                     version=p["version"], purl=purl, bom_ref=ref,
                                     licenses=licenses))
    distro = inv.os_id or "debian"
    for d in inv.debian_packages:
        qualifiers = {"arch": d["arch"]}
        if inv.os_id and inv.os_version:
            qualifiers["distro"] = f"{inv.os_id}-{inv.os_version}"
        purl = PackageURL("deb", namespace=distro, name=d["name"], version=d["version"],
                          qualifiers=qualifiers)
        ref = str(purl)
        if ref in seen:
            continue
        seen.add(ref)
        bom.components.add(Component(type=ComponentType.LIBRARY, name=d["name"],
                                     version=d["version"], purl=purl, bom_ref=ref))
    # The image depends on everything in it: a complete dependency graph for the root.
    bom.register_dependency(bom.metadata.component, list(bom.components))
    text = make_outputter(bom, OutputFormat.JSON, SchemaVersion.V1_6).output_as_string(indent=None)
    doc: dict[str, Any] = json.loads(text)
    return doc


def pins_of(doc: dict[str, Any]) -> dict[str, str]:
    """The pins recorded in an SBOM's metadata, else the versions of the well-known packages."""
    props = (doc.get("metadata", {}).get("component", {}) or {}).get("properties", []) or []
    pins = {p["name"].split(":", 2)[2]: p["value"] for p in props
            if isinstance(p, dict) and str(p.get("name", "")).startswith("verl-env:pin:")}
    if pins:
        return pins
    known = catalog.shipped()
    wanted = {*known.prominent(), *(known.import_name(n) for n in known.prominent())}
    return {c["name"]: c.get("version", "") for c in doc.get("components", [])
            if isinstance(c, dict) and str(c.get("purl", "")).startswith("pkg:pypi/")
            and str(c.get("name", "")).lower() in wanted}


def counts(doc: dict[str, Any]) -> dict[str, int]:
    out = {"pypi": 0, "deb": 0}
    for c in doc.get("components", []):
        if not isinstance(c, dict):
            continue
        kind = str(c.get("purl", "")).split("/", 1)[0].removeprefix("pkg:")
        if kind in out:
            out[kind] += 1
    return out
