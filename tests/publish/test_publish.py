"""Publishing against a real OCI registry on loopback (Debian ``docker-registry``), with and
without basic auth: image and SIF pushed, pulled back (image by digest through the engine, SIF by
its manifest) and compared; refused pushes (wrong password, missing credentials, a read-only
registry) reported clearly with no record written; transient 503s and connection resets retried;
credentials never in the record, the output or the report."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import requests

from builder.publish import push as publish
from builder.publish import transfer
from builder.gate import verdicts
from builder.registry import api as regapi
from builder.engine import Engine, credentials
from builder.errors import PublishError
from tests.publish.conftest import PASSWORD, REPO, USER, RegistryServer
from tests.publish.conftest import publish_cli as cli_publish
from tests.sif.images import LAYERED_TAG

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.heavy]


def _no_secret(*texts: str) -> None:
    b64 = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    for text in texts:
        assert PASSWORD not in text and b64 not in text


def _pull_sif(reg: RegistryServer, digest: str, dest: Path) -> bytes:
    """Fetch the SIF the way apptainer does: manifest by digest, then its single layer."""
    auth = (reg.user, reg.password) if reg.user and reg.password else None
    m = requests.get(f"http://{reg.host}/v2/{REPO}/manifests/{digest}", auth=auth, timeout=30,
                     headers={"Accept": publish.OCI_MANIFEST})
    assert m.status_code == 200 and "sha256:" + hashlib.sha256(m.content).hexdigest() == digest
    manifest = m.json()
    assert manifest["config"] == {
        "mediaType": "application/vnd.sylabs.sif.config.v1+json",
        "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
        "size": 2}
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.sylabs.sif.layer.v1.sif"
    assert layer["annotations"]["org.opencontainers.image.title"] == dest.name
    blob = requests.get(f"http://{reg.host}/v2/{REPO}/blobs/{layer['digest']}", auth=auth,
                        timeout=120)
    assert blob.status_code == 200
    return blob.content


def test_publish_image_and_sif_and_pull_back(registry: RegistryServer, layered: Any,
                                             layered_sif: Path, docker_client: Any,
                                             tmp_path: Path) -> None:
    proc, record_path = cli_publish(registry.host, tmp_path, sif=layered_sif)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(record_path.read_text())
    assert json.loads(proc.stdout)["image_digest"] == record["image_digest"]
    assert record["schema"] == "verl-env/publish-record/v1"
    assert record["pins"] == {"demo": "1.0"} and record["credentials"] == "none"
    digest = record["image"]["digest"]
    # the image by digest, through the engine: the same image ID comes back
    pulled = docker_client.images.pull(f"{registry.host}/{REPO}@{digest}")
    assert pulled.id == layered.id
    # the SIF by its manifest digest: byte-identical
    sif = record["sif"]
    assert sif["size"] == layered_sif.stat().st_size
    data = _pull_sif(registry, sif["digest"], layered_sif)
    assert data == layered_sif.read_bytes()
    assert sif["blob_digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
    # and by tag: the tag names the same manifest
    by_tag = requests.get(f"http://{registry.host}/v2/{REPO}/manifests/layers-sif", timeout=30,
                          headers={"Accept": publish.OCI_MANIFEST})
    assert "sha256:" + hashlib.sha256(by_tag.content).hexdigest() == sif["digest"]
    assert not (tmp_path / "home" / ".docker").exists()


def test_publish_with_basic_auth_keeps_secret(auth_registry: RegistryServer, layered: Any,
                                              layered_sif: Path, docker_client: Any,
                                              tmp_path: Path) -> None:
    env = {publish.USER_ENV: USER, publish.PASSWORD_ENV: PASSWORD}
    proc, record_path = cli_publish(auth_registry.host, tmp_path, sif=layered_sif, env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(record_path.read_text())
    assert record["credentials"] == "environment"
    _no_secret(record_path.read_text(), proc.stdout, proc.stderr)
    data = _pull_sif(auth_registry, record["sif"]["digest"], layered_sif)
    assert data == layered_sif.read_bytes()
    pulled = docker_client.images.pull(f"{auth_registry.host}/{REPO}@{record['image_digest']}",
                                       auth_config={"username": USER, "password": PASSWORD})
    assert pulled.id == layered.id
    assert not (tmp_path / "home" / ".docker").exists()  # no login was written anywhere
    # nor in what reached the registry (layers, manifests, its log); htpasswd holds a hash
    for f in auth_registry.root.rglob("*"):
        if f.is_file() and f.name != "htpasswd":
            assert PASSWORD.encode() not in f.read_bytes(), f


def test_credentials_from_docker_config(auth_registry: RegistryServer, layered: Any,
                                        tmp_path: Path) -> None:
    config = tmp_path / "docker-config"
    config.mkdir()
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    auths = {"auths": {auth_registry.host: {"auth": token}}}
    (config / "config.json").write_text(json.dumps(auths))
    proc, record_path = cli_publish(auth_registry.host, tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(record_path.read_text())
    assert record["credentials"] == "docker-config" and record["sif"] is None
    _no_secret(record_path.read_text(), proc.stdout, proc.stderr)


@pytest.mark.parametrize("password,expected", [
    ("wrong-password", "authentication failed for user 'verl'"),
    (None, "requires authentication"),
])
def test_refused_push_is_clear_and_writes_no_record(auth_registry: RegistryServer, layered: Any,
                                                    layered_sif: Path, tmp_path: Path,
                                                    password: str | None, expected: str) -> None:
    env = {publish.USER_ENV: USER, publish.PASSWORD_ENV: password} if password else {}
    proc, record_path = cli_publish(auth_registry.host, tmp_path, sif=layered_sif, env=env)
    assert proc.returncode == 1
    assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not record_path.exists()
    _no_secret(proc.stdout, proc.stderr)
    if password:
        assert password not in proc.stderr


def test_engine_push_refusal_is_not_swallowed(auth_registry: RegistryServer, layered: Any,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    """Past the API check, the engine's push still fails on bad credentials: the error event
    in the stream (images.push never raises) becomes a clear PublishError."""
    monkeypatch.setattr(publish, "check_access", lambda reg, attempts: None)
    monkeypatch.setenv(publish.USER_ENV, USER)
    monkeypatch.setenv(publish.PASSWORD_ENV, "wrong-password")
    engine = Engine.connect()
    with pytest.raises(PublishError, match="refused") as err:
        publish.publish(engine, engine.image(LAYERED_TAG), f"{auth_registry.host}/{REPO}",
                        tag="layers", sif=None, target=None, record_path=tmp_path / "r.json")
    assert "wrong-password" not in str(err.value)
    assert not (tmp_path / "r.json").exists()


def test_read_only_registry_refuses(registry_factory: Any, layered: Any, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ro = registry_factory(readonly=True)
    proc, record_path = cli_publish(ro.host, tmp_path)
    assert proc.returncode == 1
    assert "refuses writes" in proc.stderr and "read-only?" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not record_path.exists()
    # and past the preflight, the engine's own push is refused just as clearly
    monkeypatch.setattr(publish, "check_access", lambda reg, attempts: None)
    engine = Engine.connect()
    with pytest.raises(PublishError, match="push of .* refuses writes"):
        publish.publish(engine, engine.image(LAYERED_TAG), f"{ro.host}/{REPO}", tag="layers",
                        sif=None, target=None, record_path=tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("pattern,mode", [
    ("GET /v2/ ", "503"),            # the API check
    ("/manifests/layers ", "503"),  # reading the image digest back
    ("POST /v2/", "reset"),          # starting a blob upload (engine, then ORAS)
])
def test_transient_errors_are_retried(registry: RegistryServer, flaky_proxy: Any, layered: Any,
                                      layered_sif: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, pattern: str,
                                      mode: str) -> None:
    monkeypatch.setattr(transfer, "RETRY_BASE_S", 0.1)
    proxy = flaky_proxy(registry.host, pattern, failures=2, mode=mode)
    engine = Engine.connect()
    record = publish.publish(engine, engine.image(LAYERED_TAG), f"{proxy.host}/{REPO}",
                             tag="layers", sif=layered_sif, target=None,
                             record_path=tmp_path / "r.json")
    assert len(proxy.injected) == 2, proxy.injected
    assert json.loads((tmp_path / "r.json").read_text())["image_digest"] == record["image_digest"]


def test_persistent_5xx_gives_up(registry: RegistryServer, flaky_proxy: Any, layered: Any,
                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "RETRY_BASE_S", 0.05)
    proxy = flaky_proxy(registry.host, "GET /v2/ ", failures=100)
    engine = Engine.connect()
    with pytest.raises(PublishError, match="still failing after 3 attempts"):
        publish.publish(engine, engine.image(LAYERED_TAG), f"{proxy.host}/{REPO}", tag="t",
                        sif=None, target=None, record_path=tmp_path / "r.json", attempts=3)
    assert not (tmp_path / "r.json").exists()


def test_digest_mismatch_writes_no_record(registry: RegistryServer, layered: Any,
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = publish.manifest_digest
    monkeypatch.setattr(transfer, "manifest_digest",
                        lambda *a, **k: ("sha256:" + "0" * 64, real(*a, **k)[1]))
    engine = Engine.connect()
    with pytest.raises(PublishError, match="the registry serves sha256:0000"):
        publish.publish(engine, engine.image(LAYERED_TAG), f"{registry.host}/{REPO}",
                        tag="layers", sif=None, target=None, record_path=tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_sif_of_another_image_is_refused(registry: RegistryServer, layered: Any,
                                         tmp_path: Path) -> None:
    from builder.sif import format as sif_format
    from builder.sif import meta as sif_meta

    meta = sif_meta.generate({"Labels": {"org.verl-env.pin.demo": "2.0"}}, source="other:1",
                             arch="amd64", when=__import__("datetime").datetime.now().astimezone())
    objs = [sif_format.DataObject(sif_format.DATA_DEFFILE, meta.deffile),
            sif_format.DataObject(sif_format.DATA_GENERIC_JSON, meta.inspect_json,
                                  "inspect-metadata.json")]
    other = tmp_path / "other.sif"
    layout = sif_format.plan(objs)
    other.write_bytes(bytes(layout.partition_offset) + b"hsqs" + bytes(4092))
    sif_format.write_head(other, layout, partition_size=4096, arch="amd64")
    proc, record_path = cli_publish(registry.host, tmp_path, sif=other)
    assert proc.returncode == 1 and "was not made from this image" in proc.stderr
    assert "org.verl-env.pin.demo" in proc.stderr and not record_path.exists()
    # nothing was pushed either
    tags = requests.get(f"http://{registry.host}/v2/{REPO}/tags/list", timeout=10)
    assert tags.status_code == 404 or not tags.json().get("tags")


def test_pipeline_entry_requires_a_verdict(registry: RegistryServer, layered: Any,
                                           layered_sif: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    engine = Engine.connect()
    image = engine.image(layered.id)
    with pytest.raises(PublishError, match="no passing verdict"):
        publish.publish_verified(engine, image, f"{registry.host}/{REPO}", target="layers",
                                 sif=None, pins={}, verdict=verdicts.lookup(layered.id))
    # a passing release verdict, as the gate records one (scope: the full phase set), handed
    # over as the pipeline does
    recorded = verdicts.record(layered.id, verdicts.Verdict(
        layered.id, 0, {"overall": "pass", "gate": {"scope": "release", "family": "cpu"}}),
        target="layers")
    try:
        record = publish.publish_verified(engine, image, f"{registry.host}/{REPO}",
                                          target="layers", sif=layered_sif,
                                          pins={"demo": "1.0"}, verdict=recorded)
    finally:
        os.unlink(verdicts.state_dir() / f"{layered.id.split(':')[1]}.json")
    assert record["target"] == "layers"
    on_disk = json.loads((tmp_path / "build" / "layers" / "publish.json").read_text())
    assert on_disk["sif"]["digest"] == record["sif"]["digest"]
    assert record["image"]["reference"] == f"{registry.host}/{REPO}@{record['image_digest']}"


def test_registry_argument_and_credentials_units(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    parse = regapi.parse_reference
    assert parse("127.0.0.1:5000/a/b") == ("127.0.0.1:5000", "a/b", "http")
    assert parse("localhost:5000/a")[2] == "http"
    assert parse("reg.example.org/a")[2] == "https"
    assert parse("reg.example.org/a", insecure=True)[2] == "http"
    for bad in ("127.0.0.1:5000", "host/UPPER", "host/", "verl/env"):
        with pytest.raises(PublishError):
            parse(bad)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv(publish.USER_ENV, raising=False)
    monkeypatch.delenv(publish.PASSWORD_ENV, raising=False)
    assert credentials.resolve_credentials("h:1") is None
    token = base64.b64encode(b"cfguser:cfgpass").decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"https://h:1": {"auth": token}}}))
    creds = credentials.resolve_credentials("h:1")
    assert creds and (creds.user, creds.secret, creds.source) == (
        "cfguser", "cfgpass", "docker-config")
    assert "cfgpass" not in repr(creds) and "cfgpass" not in str(creds)
    (tmp_path / "config.json").write_text(json.dumps({"auths": {
        "h:1": {"username": "u2", "password": "p2"},
        "h:2": {"identitytoken": "refresh-xyz"}}}))
    creds = credentials.resolve_credentials("h:1")
    assert creds and (creds.user, creds.secret) == ("u2", "p2")
    creds = credentials.resolve_credentials("h:2")
    assert creds and creds.identity and creds.auth_config() == {"identitytoken": "refresh-xyz"}
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(PublishError, match="config.json: not readable as JSON"):
        credentials.resolve_credentials("h:1")
    monkeypatch.setenv(publish.USER_ENV, "envuser")
    monkeypatch.setenv(publish.PASSWORD_ENV, "envpass")
    creds = credentials.resolve_credentials("h:1")
    assert creds and (creds.user, creds.secret, creds.source) == (
        "envuser", "envpass", "environment")
    reg, source = publish.connect("127.0.0.1:1/x")
    assert source == "environment" and "envpass" not in repr(reg)


def test_challenge_parsing() -> None:
    scheme, params = regapi.parse_challenge(
        'Bearer realm="https://auth.example.org/token",service="registry.example.org",'
        'scope="repository:a/b:pull,push",error="insufficient_scope"')
    assert scheme == "bearer" and params == {
        "realm": "https://auth.example.org/token", "service": "registry.example.org",
        "scope": "repository:a/b:pull,push", "error": "insufficient_scope"}
    assert regapi.parse_challenge('Basic realm="x"') == ("basic", {"realm": "x"})
