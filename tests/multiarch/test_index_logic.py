"""The pure parts of one name for every machine (no daemon): the index document and what it
says per platform, the refusals made before anything is sent, and the options an index publish
refuses as bad input (through the installed CLI, before an engine or a registry is asked). The
real publish, pulls and status are in test_index_publish.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.engine import ImageInfo
from builder.publish.index import Member, PlatformClash, refusal
from builder.registry.api import (OCI_INDEX, IndexEntry, Platform, index_document, index_entries,
                              is_index)
from builder.gate.verdicts import Verdict
from tests.conftest import REPO, run_build_env
from tests.trust.conftest import PARTIAL_VERDICT, verdict_record

FIXTURE = str(REPO / "tests/fixtures/arm64/matrix.yaml")
AMD, ARM = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def _member(target: str, image_id: str, arch: str, verdict: dict | None,
            variant: str = "") -> Member:
    image = ImageInfo(id=image_id, architecture=arch, os="linux", variant=variant)
    v = None if verdict is None else Verdict.from_dict({**verdict, "image_id": image_id})
    return Member(target, image, v, Path(f"build/{target}/report.json"))


def _failed(image_id: str) -> dict:
    record = verdict_record(target="cpu-arm64")
    report = {**record["report"], "overall": "fail"}
    return {**record, "image_id": image_id, "overall": "fail", "exit_code": 1, "report": report}


def test_platform_from_image_configs() -> None:
    assert str(Platform.from_config({"architecture": "arm64", "os": "linux", "variant": "v8"})
               ) == "linux/arm64/v8"
    assert Platform.from_config({"Architecture": "amd64", "Os": "linux"}) == Platform(
        "linux", "amd64")
    assert Platform.from_config({"os": "linux"}) is None
    assert Platform("linux", "arm64", "v8").to_dict() == {"architecture": "arm64", "os": "linux",
                                                         "variant": "v8"}
    assert Platform("linux", "arm64").same_machine(Platform("linux", "arm64", "v8"))
    assert not Platform("linux", "arm64").same_machine(Platform("linux", "amd64"))


def test_index_document_names_each_platform_and_reads_back() -> None:
    docker_v2 = "application/vnd.docker.distribution.manifest.v2+json"
    entries = [IndexEntry(Platform("linux", "amd64"), docker_v2, AMD, 1234, "cpu-x"),
               IndexEntry(Platform("linux", "arm64", "v8"), docker_v2, ARM, 987, "cpu-arm64")]
    data = index_document(entries, "2026-11-26T23:00:00Z")
    doc = json.loads(data)
    assert doc["schemaVersion"] == 2 and doc["mediaType"] == OCI_INDEX
    assert doc["manifests"][1] == {
        "mediaType": docker_v2, "digest": ARM, "size": 987,
        "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"},
        "annotations": {"org.verl-env.target": "cpu-arm64"}}
    assert "variant" not in doc["manifests"][0]["platform"]
    assert index_entries(doc) == entries
    assert is_index(OCI_INDEX, None) and is_index("", doc)
    assert not is_index(docker_v2, {"mediaType": docker_v2})
    # an attestation entry a builder adds (platform unknown/unknown) is no platform
    doc["manifests"].append({"mediaType": docker_v2, "digest": AMD, "size": 1,
                             "platform": {"os": "unknown", "architecture": "unknown"}})
    assert len(index_entries(doc)) == 2
    with pytest.raises(ValueError, match="not an image index"):
        index_entries({"layers": []})


def test_index_document_refuses_two_images_for_one_machine() -> None:
    entries = [IndexEntry(Platform("linux", "arm64"), "m", AMD, 1, "a"),
               IndexEntry(Platform("linux", "arm64", "v8"), "m", ARM, 1, "b")]
    with pytest.raises(ValueError, match="two images for linux/arm64: a and b"):
        index_document(entries, "now")


def test_refusal_names_the_platform_without_a_passing_verdict() -> None:
    good = _member("cpu-x", AMD, "amd64", verdict_record(target="cpu-x"))
    assert refusal([good, _member("cpu-arm64", ARM, "arm64", verdict_record())], "build") is None
    for verdict, why in ((None, "no verdict recorded"), (_failed(ARM), "fail"),
                         (PARTIAL_VERDICT, "partial")):
        problem = refusal([good, _member("cpu-arm64", ARM, "arm64", verdict, "v8")], "build")
        assert problem is not None and problem.exit_code == 1
        text = str(problem)
        assert text.startswith("publish: [cpu-arm64] linux/arm64/v8 image bbbbbbbbbbbb has no "
                               "passing verdict: "), text
        assert why in text and text.endswith("it is never put in an index, and nothing was "
                                             "pushed")


def test_refusal_of_a_verdict_about_other_content() -> None:
    stale = _member("cpu-arm64", ARM, "arm64", verdict_record())
    other = Member(stale.target, stale.image, Verdict.from_dict(
        {**verdict_record(), "image_id": AMD}), stale.report)
    problem = refusal([_member("cpu-x", AMD, "amd64", verdict_record()), other], "build")
    assert problem is not None and "the verdict handed over is about sha256:aaaaaaaaaaa" in str(
        problem)


def test_refusal_of_two_builds_for_one_platform_is_bad_input() -> None:
    a = _member("one", AMD, "arm64", verdict_record())
    b = _member("two", ARM, "arm64", verdict_record(), "v8")
    problem = refusal([a, b], "build")
    assert isinstance(problem, PlatformClash) and problem.exit_code == 2
    assert "one and two are both linux/arm64/v8" in str(problem)


@pytest.mark.parametrize(("extra", "says"), [
    ((), "needs --tag"),
    (("--tag", "s"), "needs --sign-key"),
    (("--tag", "s", "--sign-key", "k", "--force"), "--force cannot put an image"),
    (("--tag", "s", "--sign-key", "k", "--sif", "x.sif"), "a SIF holds one platform"),
    (("--tag", "s", "--sign-key", "k", "--report", "r.json"), "--report given 1 times for 2"),
])
def test_index_options_that_cannot_apply_are_usage_errors(extra: tuple[str, ...], says: str,
                                                         tmp_path: Path) -> None:
    """Refused before the engine or the registry is asked: nothing listens on port 1, and
    DOCKER_HOST names no engine."""
    proc = run_build_env("publish", "--matrix", FIXTURE, "--target", "cpu-arm64", "--target",
                         "cpu-arm64-fallback-x86_64", "--registry", "127.0.0.1:1/x", *extra,
                         env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock",
                              "VERL_ENV_SIGN_KEY": ""}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []


def test_members_with_passing_verdicts_reach_the_registry_preflight(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Past the refusals, the registry is asked before anything is pushed: with nothing
    listening on port 1 that is a PublishError naming the registry (the multi-platform publish
    once died here with AttributeError). The engine and the two images are stand-ins: what is
    tested is the command's order, not Docker (the real publish is in test_index_publish.py)."""
    import argparse

    from builder.commands import _publish_index
    from builder.errors import PublishError

    chosen = [_member("cpu-x", AMD, "amd64", verdict_record(target="cpu-x")),
              _member("cpu-arm64", ARM, "arm64", verdict_record())]
    monkeypatch.setattr(_publish_index, "members", lambda args, targets: (object(), chosen))
    pushed: list[str] = []
    monkeypatch.setattr(_publish_index.lib, "publish_index", lambda *a, **k: pushed.append("x"))
    args = argparse.Namespace(tag="s", force=False, sif=None, sif_tag=None, attach=False,
                              sign_key=tmp_path / "k", report=None, require="build",
                              registry="127.0.0.1:1/x", insecure=True, attempts=1)
    with pytest.raises(PublishError, match="127.0.0.1:1"):
        _publish_index.run(args, ["cpu-x", "cpu-arm64"])
    assert pushed == []
