"""The SBOM of a real image (the debootstrap base, with python3) through the real engine, and
``trust sign`` taking verdict and SBOM from the local record and the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.gate import verdicts
from builder.engine import Engine
from builder.trust import sbom
from builder.trust.keys import KeyFiles
from tests.conftest import run_build_env
from tests.trust.conftest import RELEASE_VERDICT

pytestmark = pytest.mark.docker


def _dpkg(engine: Engine, image: str, package: str) -> str:
    """The version dpkg itself reports, asked separately from the inventory script."""
    r = engine.run(image, ["-W", "-f", "${Version}", package], entrypoint=["dpkg-query"],
                   timeout=120)
    assert r.exit_code == 0, r.logs
    return r.logs.strip()


def test_inventory_of_a_real_image_is_a_valid_cyclonedx_16(debian_base: str) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    engine = Engine.connect()
    image = engine.image(debian_base).id
    inv = sbom.collect(engine, image)
    assert inv.interpreter.endswith("python3") and inv.os_id == "debian"
    debs = {d["name"]: d["version"] for d in inv.debian_packages}
    assert debs["python3"] == _dpkg(engine, image, "python3")
    assert len(debs) > 50
    doc = sbom.build(inv, name="debian-base", version=image, pins={"python": inv.python})
    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc))
    assert errors is None, errors
    purls = {c["purl"] for c in doc["components"]}
    arch = next(d["arch"] for d in inv.debian_packages if d["name"] == "python3")
    assert any(p.startswith("pkg:deb/debian/python3@") and f"arch={arch}" in p for p in purls)
    assert doc["specVersion"] == "1.6" and doc["metadata"]["component"]["version"] == image
    assert sbom.pins_of(doc) == {"python": inv.python}


def test_sign_cli_takes_the_recorded_verdict_and_inventories_the_image(
        debian_base: str, sif: Path, keypair: KeyFiles, report: Path) -> None:
    image = Engine.connect().image(debian_base).id
    data = json.loads(report.read_text())
    data["image_id"] = image
    report.write_text(json.dumps(data))
    verdicts.record(image, verdicts.Verdict.from_dict(RELEASE_VERDICT),
                    target=RELEASE_VERDICT["target"])
    proc = run_build_env("trust", "sign", str(sif), "--key", str(keypair.private), "--report",
                         str(report), timeout=600)
    assert proc.returncode == 0, proc.stderr
    proc = run_build_env("trust", "verify", str(sif), "--key", str(keypair.public), "--json",
                         timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["components"]["deb"] > 50 and out["overall"] == "pass"
    assert out["pins"] == {"torch": "2.6.0+cpu", "verl": "0.5.0"}  # the report's pins
