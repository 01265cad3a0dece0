"""``build-env audit`` against a real image (the CI fixture target's release image) through the
real engine: every distribution its interpreters see (asked separately, with importlib.metadata),
the planted advisories matched exactly, --fail-on, the target form, the local record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.audit import result as audits
from builder.engine import Engine
from tests.audit.conftest import advisory, ecosystem, write_db
from tests.conftest import FIXTURE, run_build_env

pytestmark = pytest.mark.docker
LIST = ("import importlib.metadata as m, json; "
        "print(json.dumps(sorted({d.metadata['Name']: d.version for d in m.distributions()}"
        ".items())))")


def _installed(image: str) -> dict[str, str]:
    r = Engine.connect().run(image, ["-c", LIST], entrypoint=["/opt/venv/bin/python"],
                             timeout=120, role="audit-test")
    assert r.exit_code == 0, r.logs
    return dict(json.loads(r.logs.strip().splitlines()[-1]))


def test_audit_of_the_fixture_image(cpu_image: dict, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # the audit this records stays in this test's own state: the session's image is published
    # by other tests, and `publish --sign-key` attaches an image's recorded audit
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    image = cpu_image["image_id"]
    venv = _installed(image)
    (a, va), (b, vb), (c, vc) = sorted(venv.items())[:3]
    db = write_db(tmp_path, [
        advisory("GHSA-range", a, ranges=ecosystem({"introduced": va})),
        advisory("GHSA-list", b.upper(), versions=[vb], database_specific={"severity": "LOW"}),
        advisory("GHSA-fixed", c, ranges=ecosystem({"introduced": "0"}, {"fixed": vc})),
        advisory("GHSA-absent", "no-such-distribution", ranges=ecosystem({"introduced": "0"}))])
    proc = run_build_env("audit", image, "--osv", str(db), "--json", "--fail-on", "CRITICAL",
                         timeout=600)
    assert proc.returncode == 1, proc.stderr  # GHSA-range has no severity: UNKNOWN fails
    doc = json.loads(proc.stdout)
    assert {(h["id"], h["version"]) for h in doc["hits"]} == {("GHSA-range", va),
                                                               ("GHSA-list", vb)}
    assert doc["distributions"] >= len(venv) and doc["subject"]["image_id"] == image
    assert audits.lookup(image)["hits"] == doc["hits"]
    by_target = run_build_env("audit", "cpu-x86_64", "--matrix", str(FIXTURE), "--osv", str(db),
                              "--fail-on", "LOW", timeout=600)
    assert by_target.returncode == 1, by_target.stderr
    assert "audit of verl-env:cpu-x86_64" in by_target.stdout
    assert "newest modified 2026-03-04T05:06:07Z" in by_target.stdout
