"""Publishing to a registry that speaks the Bearer token flow (Debian ``docker-registry`` with
``auth: token``, tokens from the RS256/x5c issuer in conftest), with credentials from the
environment, a ``credHelpers`` helper and a ``credsStore``; the preflight's verdicts in seconds;
no password and no issued token in any output, record, exception or file the registry keeps."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from builder.publish import push as publish
from builder.publish import transfer
from builder.engine import Engine
from builder.errors import PublishError
from tests.publish.conftest import (PASSWORD, REFRESH_TOKEN, SERVICE, USER, RegistryServer,
                                   free_port)
from tests.sif.images import LAYERED_TAG

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.heavy]
from tests.publish.conftest import REPO, publish_cli
HELPER = "verlenvtest"


def cli_publish(reg: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
                sif: Path | None = None) -> tuple[Any, Path]:
    """The CLI publish with no credentials from the environment (only the docker config's)."""
    return publish_cli(reg, tmp_path, *extra, sif=sif, env={
        publish.USER_ENV: "", publish.PASSWORD_ENV: "", **(env or {})})


def secrets_of(reg: RegistryServer) -> list[str]:
    assert reg.issuer is not None
    b64 = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return [PASSWORD, b64, REFRESH_TOKEN, *reg.issuer.tokens]


def assert_no_secret(reg: RegistryServer, *texts: str) -> None:
    for secret in secrets_of(reg):
        for text in texts:
            assert secret not in text


def bearer_get(reg: RegistryServer, path: str, **headers: str) -> requests.Response:
    """An independent client for the read-back: a pull token straight from the issuer."""
    assert reg.issuer is not None
    t = requests.get(reg.issuer.realm, auth=(USER, PASSWORD), timeout=10,
                     params={"service": SERVICE, "scope": f"repository:{REPO}:pull"})
    assert t.status_code == 200
    return requests.get(f"http://{reg.host}/v2/{REPO}/{path}", timeout=120,
                        headers={"Authorization": f"Bearer {t.json()['token']}", **headers})


def write_config(tmp_path: Path, config: dict[str, Any]) -> None:
    d = tmp_path / "docker-config"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))


def install_helper(tmp_path: Path, host: str) -> tuple[Path, Path]:
    """``docker-credential-verlenvtest`` on a private PATH dir: answers ``get`` for ``host``
    only, logs every call (action and server address) to a file."""
    bindir, log = tmp_path / "bin", tmp_path / "helper.log"
    bindir.mkdir()
    script = bindir / f"docker-credential-{HELPER}"
    script.write_text(f"""#!/bin/sh
read -r server || true
echo "$1 $server" >> {log}
if [ "$1" = get ] && [ "$server" = "{host}" ]; then
  printf '{{"ServerURL":"%s","Username":"{USER}","Secret":"{PASSWORD}"}}' "$server"
  exit 0
fi
echo "credentials not found in native keychain"
exit 1
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bindir, log


# --------------------------------------------------------------------------- publish for real


def test_publish_image_and_sif_with_bearer_tokens(token_registry: RegistryServer, layered: Any,
                                                  layered_sif: Path, docker_client: Any,
                                                  tmp_path: Path) -> None:
    reg = token_registry
    env = {publish.USER_ENV: USER, publish.PASSWORD_ENV: PASSWORD}
    proc, record_path = cli_publish(reg.host, tmp_path, sif=layered_sif, env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(record_path.read_text())
    assert record["credentials"] == "environment"
    # the flow really went through the issuer, with the push scope for the repository
    assert reg.issuer is not None and reg.issuer.tokens
    assert any(f"repository:{REPO}:pull,push" in r["scope"] for r in reg.issuer.requests)
    # both digests read back independently
    m = bearer_get(reg, "manifests/layers",
                   Accept="application/vnd.docker.distribution.manifest.v2+json")
    assert m.status_code == 200
    assert "sha256:" + hashlib.sha256(m.content).hexdigest() == record["image_digest"]
    sif = record["sif"]
    m = bearer_get(reg, f"manifests/{sif['digest']}", Accept=publish.OCI_MANIFEST)
    assert "sha256:" + hashlib.sha256(m.content).hexdigest() == sif["digest"]
    (layer,) = m.json()["layers"]
    assert layer["mediaType"] == publish.SIF_LAYER_MEDIA and layer["size"] == sif["size"]
    blob = bearer_get(reg, f"blobs/{layer['digest']}")
    assert blob.content == layered_sif.read_bytes()
    # the image by digest through the engine (which does its own token flow): same image ID
    pulled = docker_client.images.pull(f"{reg.host}/{REPO}@{record['image_digest']}",
                                       auth_config={"username": USER, "password": PASSWORD})
    assert pulled.id == layered.id
    # no secret anywhere: output, record, what the registry stored or logged
    assert_no_secret(reg, proc.stdout, proc.stderr, record_path.read_text())
    for f in reg.root.rglob("*"):
        if f.is_file() and f.suffix != ".pem":
            data = f.read_bytes()
            for secret in secrets_of(reg):
                assert secret.encode() not in data, f
    assert not (tmp_path / "home" / ".docker").exists()


@pytest.mark.parametrize("how", ["credHelpers", "credsStore"])
def test_credentials_from_a_credential_helper(token_registry: RegistryServer, layered: Any,
                                              tmp_path: Path, how: str) -> None:
    reg = token_registry
    bindir, log = install_helper(tmp_path, reg.host)
    if how == "credHelpers":
        # an unrelated auths entry for another host must not be used
        write_config(tmp_path, {"credHelpers": {reg.host: HELPER},
                                "auths": {"other.example.org": {"auth": "eDp5"}}})
    else:
        write_config(tmp_path, {"credsStore": HELPER, "auths": {reg.host: {}}})
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    proc, record_path = cli_publish(reg.host, tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(record_path.read_text())
    assert record["credentials"] == f"credential-helper:{HELPER}"
    assert f"get {reg.host}" in log.read_text().splitlines()
    m = bearer_get(reg, "manifests/layers",
                   Accept="application/vnd.docker.distribution.manifest.v2+json")
    assert "sha256:" + hashlib.sha256(m.content).hexdigest() == record["image_digest"]
    assert_no_secret(reg, proc.stdout, proc.stderr, record_path.read_text())


@pytest.mark.parametrize("password", ["wrong-password", None])
def test_refused_credentials_fail_clearly_with_nothing_recorded(
        token_registry: RegistryServer, layered: Any, layered_sif: Path, tmp_path: Path,
        password: str | None) -> None:
    reg = token_registry
    env = {publish.USER_ENV: USER, publish.PASSWORD_ENV: password} if password else {}
    proc, record_path = cli_publish(reg.host, tmp_path, sif=layered_sif, env=env)
    assert proc.returncode == 1
    expected = ("authentication failed for user 'verl'" if password
                else "requires authentication")
    assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not record_path.exists()
    assert_no_secret(reg, proc.stdout, proc.stderr)
    if password:
        assert password not in proc.stdout + proc.stderr
    # nothing reached the repository
    tags = bearer_get(reg, "tags/list")
    assert tags.status_code == 404 or not tags.json().get("tags")


def test_identity_token_from_docker_config(token_registry: RegistryServer, layered: Any,
                                           layered_sif: Path, tmp_path: Path) -> None:
    """An ``identitytoken`` (what `docker login` stores for OAuth registries) is exchanged with
    the OAuth2 refresh-token grant, by us and by the engine; it is never shown."""
    reg = token_registry
    write_config(tmp_path, {"auths": {reg.host: {"identitytoken": REFRESH_TOKEN}}})
    proc, record_path = cli_publish(reg.host, tmp_path, sif=layered_sif)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(record_path.read_text())
    assert record["credentials"] == "docker-config" and record["sif"]["size"] > 0
    assert reg.issuer is not None
    assert any(r.get("oauth") == "refresh_token" for r in reg.issuer.requests)
    assert not any(r["basic"] for r in reg.issuer.requests)
    assert_no_secret(reg, proc.stdout, proc.stderr, record_path.read_text())
    # a refresh token the issuer does not know: refused, one clear line, no record
    write_config(tmp_path, {"auths": {reg.host: {"identitytoken": "stale-refresh"}}})
    record_path.unlink()
    proc, record_path = cli_publish(reg.host, tmp_path)
    assert proc.returncode == 1 and "authentication failed for the identity token" in proc.stderr
    assert "stale-refresh" not in proc.stderr + proc.stdout and not record_path.exists()


# --------------------------------------------------------------------------- preflight


def test_preflight_answers_in_seconds(token_registry: RegistryServer, auth_registry:
                                      RegistryServer, registry_factory: Any, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setattr(transfer, "RETRY_BASE_S", 0.05)
    monkeypatch.delenv(publish.USER_ENV, raising=False)
    monkeypatch.delenv(publish.PASSWORD_ENV, raising=False)
    ro = registry_factory(readonly=True)
    errors: list[str] = []

    def refused(where: str, match: str) -> None:
        start = time.monotonic()
        with pytest.raises(PublishError, match=match) as err:
            publish.preflight(f"{where}/{REPO}")
        assert time.monotonic() - start < 100  # 10x headroom: catches a hang only
        errors.append(str(err.value))

    refused(token_registry.host, "requires authentication")
    refused(auth_registry.host, "requires authentication")
    refused(f"127.0.0.1:{free_port()}", "API check: still failing after 2 attempts")
    refused(ro.host, "refuses writes to verl-env/test")
    monkeypatch.setenv(publish.USER_ENV, USER)
    monkeypatch.setenv(publish.PASSWORD_ENV, "wrong-password")
    refused(token_registry.host, "authentication failed for user 'verl'")
    refused(auth_registry.host, "authentication failed for user 'verl'")
    monkeypatch.setenv(publish.PASSWORD_ENV, PASSWORD)
    for good in (token_registry, auth_registry):
        start = time.monotonic()
        publish.preflight(f"{good.host}/{REPO}")
        assert time.monotonic() - start < 100  # 10x headroom: catches a hang only
    # a credential helper named in the config that is not installed: a clear error
    write_config(tmp_path, {"credHelpers": {token_registry.host: "verlenv-absent"}})
    monkeypatch.delenv(publish.USER_ENV)
    refused(token_registry.host, "docker-credential-verlenv-absent is not on PATH")
    for text in errors:
        assert_no_secret(token_registry, text)
        assert "wrong-password" not in text


def test_token_is_refetched_when_a_cached_one_is_refused(
        token_registry: RegistryServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached bearer token that the registry no longer accepts (expired, revoked) is replaced
    once, transparently; only a refusal of a fresh one is an error."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setenv(publish.USER_ENV, USER)
    monkeypatch.setenv(publish.PASSWORD_ENV, PASSWORD)
    reg, source = publish.connect(f"{token_registry.host}/{REPO}")
    assert source == "environment"
    reg.check_push()
    assert token_registry.issuer is not None
    issued = len(token_registry.issuer.tokens)
    reg._auth[reg.scope] = {"Authorization": "Bearer not.a.token"}  # noqa: SLF001
    reg.check_push()
    assert len(token_registry.issuer.tokens) == issued + 1
    # a token close to its expires_in is dropped before use, not sent to be refused
    held = dict(reg._auth[reg.scope])  # noqa: SLF001
    reg.check_push()
    assert len(token_registry.issuer.tokens) == issued + 1  # still valid: reused
    reg._expires[reg.scope] = time.monotonic() - 1  # noqa: SLF001
    reg.check_push()
    assert len(token_registry.issuer.tokens) == issued + 2
    assert reg._auth[reg.scope] != held  # noqa: SLF001


def test_engine_push_gets_the_helper_credentials(token_registry: RegistryServer, layered: Any,
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's push (dockerd's own token flow) is given the helper's credentials: with
    the API checks skipped, the push itself succeeds; with none, the engine is refused."""
    bindir, _ = install_helper(tmp_path, token_registry.host)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.delenv(publish.USER_ENV, raising=False)
    monkeypatch.delenv(publish.PASSWORD_ENV, raising=False)
    monkeypatch.setattr(publish, "check_access", lambda reg, attempts: None)
    engine = Engine.connect()
    with pytest.raises(PublishError, match="refused") as err:
        publish.publish(engine, engine.image(LAYERED_TAG), f"{token_registry.host}/{REPO}",
                        tag="layers", sif=None, target=None, record_path=tmp_path / "r.json")
    assert_no_secret(token_registry, str(err.value))
    assert not (tmp_path / "r.json").exists()
    write_config(tmp_path, {"credHelpers": {token_registry.host: HELPER}})
    record = publish.publish(engine, engine.image(LAYERED_TAG), f"{token_registry.host}/{REPO}",
                             tag="layers", sif=None, target=None,
                             record_path=tmp_path / "r.json")
    assert record["credentials"] == f"credential-helper:{HELPER}"
    assert_no_secret(token_registry, json.dumps(record))
