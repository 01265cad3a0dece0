"""One name for every machine, on the real parts: the arm64 CPU fixture (built and gated under
QEMU user emulation) and its x86_64 build (native) from ``tests/fixtures/arm64/matrix.yaml``,
built and gated by the installed CLI, published by ``build-env publish --target A --target B``
to a real ``docker-registry`` (token auth; Basic auth for the refusal) as one OCI image
index.

Proven here: the index names each platform's manifest with its platform; each manifest carries
its own signed verdict as referrers (``trust verify`` of each digest); ``docker pull`` of the tag
on this x86_64 engine gets the amd64 image and ``--platform linux/arm64`` the arm64 one; enroot
(what pyxis runs for ``--container-image docker://``, built from the vendored sources) takes the
host's platform; ``build-env status`` shows each platform's verdict, digest and gate time; a
platform whose gate failed is refused before anything is sent. Apptainer is not installed here:
its pull skips with the reason.

The arm64 target is built and gated once per session, alone (``arm64_image``,
tests/support/arm64.py, shared with ``tests/pipeline/test_arm64.py``): the emulated gate is the
part a loaded host breaks (2026-11-29 CI: its Ray start timed out eight times while the x86_64
build ran beside it). ``build-env --target A --target B`` then reuses that verified image and
builds the x86_64 platform. Timings are printed (``TIMING``)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
import requests

from builder.trust import keys
from tests.conftest import REPO, run_build_env
from tests.publish.conftest import (PASSWORD, SERVICE, USER, RegistryServer, TokenIssuer,
                                    start_registry)
from tests.slurm import enroot

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.network, pytest.mark.slow,
              pytest.mark.emulated, pytest.mark.multiarch]
FIXTURE = str(REPO / "tests/fixtures/arm64/matrix.yaml")
ARM64, AMD64 = "cpu-arm64", "cpu-arm64-fallback-x86_64"
NAME = "verl-env/stack"
INDEX = "application/vnd.oci.image.index.v1+json"
CREDS = {"VERL_ENV_REGISTRY_USER": USER, "VERL_ENV_REGISTRY_PASSWORD": PASSWORD}


@dataclass(frozen=True)
class Stack:
    ids: dict[str, str]  # target -> image ID
    reports: dict[str, Path]  # target -> report.json
    key: keys.KeyFiles


@dataclass(frozen=True)
class Published:
    registry: RegistryServer
    record: dict[str, Any]
    stack: Stack

    @property
    def tag(self) -> str:
        return f"{self.registry.host}/{NAME}:stack"


def _timing(what: str, t0: float) -> None:
    print(f"\nTIMING {what}: {time.monotonic() - t0:.1f} s")


@pytest.fixture(scope="module")
def stack(arm64_image: dict[str, Any], debian_base: str, ca_bundle: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Stack:
    """Both platforms of the fixture stack built, gated and tagged by one run of the CLI, each
    on its own debootstrap base: the arm64 one reused from ``arm64_image`` (verified once)."""
    work = tmp_path_factory.mktemp("stack")
    t0 = time.monotonic()
    proc = run_build_env("--target", ARM64, "--target", AMD64, "--matrix", FIXTURE,
                         "--ca-bundle", str(ca_bundle), "--workdir", str(work), "--json",
                         timeout=5400)
    _timing("both builds (arm64 emulated, x86_64 native)", t0)
    assert proc.returncode == 0, f"{proc.stderr[-5000:]}\n{proc.stdout[-3000:]}"
    reports = json.loads(proc.stdout)
    for target in (ARM64, AMD64):
        assert reports[target]["result"] == "pass", reports[target].get("error")
    assert reports[ARM64]["image_id"] == arm64_image["image_id"]
    assert reports[ARM64]["stages"]["build"]["reused"], reports[ARM64]["stages"]["build"]
    return Stack({t: reports[t]["image_id"] for t in (ARM64, AMD64)},
                 {t: work / t / "report.json" for t in (ARM64, AMD64)},
                 keys.generate(work / "keys"))


def _publish(host: str, stack: Stack, tmp: Path, *extra: str, env: dict[str, str] | None = None,
             prefix: str = "verl-env") -> subprocess.CompletedProcess[str]:
    args = ["publish", "--matrix", FIXTURE, "--tag-prefix", prefix, "--target", AMD64,
            "--target", ARM64, "--registry", f"{host}/{NAME}", "--tag", "stack",
            "--sign-key", str(stack.key.private), "--report", str(stack.reports[AMD64]),
            "--report", str(stack.reports[ARM64]), "--record", str(tmp / "index.json"),
            "--json", *extra]
    base = {"HOME": str(tmp / "home"), "DOCKER_CONFIG": str(tmp / "docker-config")}
    return run_build_env(*args, env={**base, **(env or {})}, timeout=1800)


@pytest.fixture(scope="module")
def published(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    """The stack published once to a registry with ``auth: token`` (Bearer tokens, as public
    and site registries have), shared by the checks below."""
    if shutil.which("docker-registry") is None:
        pytest.skip("docker-registry not installed (apt-get install docker-registry)")
    pytest.importorskip("cryptography", reason="the test token issuer signs with cryptography")
    tmp = tmp_path_factory.mktemp("published")
    issuer = TokenIssuer(tmp / "registry")
    server = start_registry(tmp / "registry", token=issuer)
    try:
        t0 = time.monotonic()
        proc = _publish(server.host, stack, tmp, env=CREDS)
        _timing("publish of two platforms and the index", t0)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert PASSWORD not in proc.stdout + proc.stderr
        yield Published(server, json.loads(proc.stdout), stack)
    finally:
        server.stop()
        issuer.stop()


def _bearer(server: RegistryServer) -> dict[str, str]:
    """A pull token for the stack's repository from the registry's own token service."""
    assert server.issuer is not None
    token = requests.get(server.issuer.realm, auth=(USER, PASSWORD), timeout=30, params={
        "service": SERVICE, "scope": f"repository:{NAME}:pull"}).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def _get(p: Published, path: str, accept: str) -> requests.Response:
    return requests.get(f"http://{p.registry.host}/v2/{NAME}/{path}", timeout=30,
                        headers={"Accept": accept, **_bearer(p.registry)})


def test_one_index_names_each_platform_with_its_own_verdict(published: Published) -> None:
    record, stack = published.record, published.stack
    r = _get(published, "manifests/stack", INDEX)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith(INDEX)
    assert r.headers["Docker-Content-Digest"] == record["index"]["digest"]
    index = r.json()
    assert index["mediaType"] == INDEX
    by_arch = {m["platform"]["architecture"]: m for m in index["manifests"]}
    assert sorted(by_arch) == ["amd64", "arm64"]
    assert all(m["platform"]["os"] == "linux" for m in index["manifests"])
    platforms = {p["target"]: p for p in record["platforms"]}
    assert by_arch["amd64"]["digest"] == platforms[AMD64]["digest"]
    assert by_arch["arm64"]["digest"] == platforms[ARM64]["digest"]
    for target, arch in ((AMD64, "amd64"), (ARM64, "arm64")):
        entry, rec = by_arch[arch], platforms[target]
        assert entry["annotations"]["org.verl-env.target"] == target
        assert rec["image_id"] == stack.ids[target]
        served = _get(published, f"manifests/{entry['digest']}", entry["mediaType"])
        assert len(served.content) == entry["size"]
        config = _get(published, f"blobs/{served.json()['config']['digest']}", "*/*").json()
        assert config["architecture"] == arch
        assert entry["platform"].get("variant", "") == config.get("variant", "")
        # its own verdict, signed, as referrers of this platform's manifest
        assert rec["attestations"]["image"]["subject"] == entry["digest"]
        check = run_build_env("trust", "verify", f"{published.registry.host}/{NAME}@"
                              f"{entry['digest']}", "--key", str(stack.key.public),
                              env=CREDS, timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr
        assert f"verdict: pass (target {target}" in check.stdout
    assert "stack" in _get(published, "tags/list", "application/json").json()["tags"]


def test_docker_pull_gets_the_node_platform(published: Published, docker_host: str) -> None:
    client = docker.from_env()
    auth = {"username": USER, "password": PASSWORD}
    repo = f"{published.registry.host}/{NAME}"
    native = client.images.pull(repo, tag="stack", auth_config=auth)
    assert native.id == published.stack.ids[AMD64]
    assert native.attrs["Architecture"] == "amd64"
    arm = client.images.pull(repo, tag="stack", platform="linux/arm64", auth_config=auth)
    assert arm.id == published.stack.ids[ARM64]
    assert arm.attrs["Architecture"] == "arm64"


def test_status_shows_each_platform_verdict(published: Published) -> None:
    ref = published.tag
    proc = run_build_env("status", ref, "--key", str(published.stack.key.public), "--json",
                         env=CREDS, timeout=300)
    assert proc.returncode == 0, proc.stderr
    platforms = {p["target"]: p for p in json.loads(proc.stdout)["platforms"][ref]}
    recorded = {p["target"]: p for p in published.record["platforms"]}
    assert sorted(platforms) == sorted([AMD64, ARM64])
    for target, arch in ((AMD64, "linux/amd64"), (ARM64, "linux/arm64")):
        p = platforms[target]
        assert p["platform"].startswith(arch) and p["refused"] is None
        assert p["digest"] == recorded[target]["digest"]
        assert p["verdict"] == "pass" and p["level"] == "build"
        assert p["gate_time"] == recorded[target]["verdict"]["recorded_at"]
    text = run_build_env("status", ref, "--key", str(published.stack.key.public), env=CREDS,
                         timeout=300)
    assert text.returncode == 0, text.stderr
    assert "image index, 2 platforms" in text.stdout
    for target in (AMD64, ARM64):
        line = next(x for x in text.stdout.splitlines() if f" {target}: " in x)
        assert recorded[target]["digest"] in line and "verdict pass, build level, gate " in line


def test_enroot_takes_the_host_platform(published: Published,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    """What pyxis runs for ``srun --container-image docker://...``: ``enroot import``. (Token
    auth: enroot's probe of a Basic-auth registry GETs the tag without the index media type in
    ``Accept``, which distribution 2.8 answers 404 for an OCI index: docs/publish-multiarch.md.)
    """
    reason = enroot.skip_reason()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("enroot")
    t0 = time.monotonic()
    tools = enroot.build(work / "build")
    config = work / "config"
    config.mkdir()
    host = published.registry.host
    (config / ".credentials").write_text(
        f"machine {host.split(':')[0]} login {USER} password {PASSWORD}\n")
    env = {**os.environ, "ENROOT_ALLOW_HTTP": "y", "ENROOT_CONFIG_PATH": str(config),
           "PATH": f"{tools.prefix / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           # the squashfs uncompressed: which platform enroot takes does not depend on it, and
           # enroot's default (-comp lzo -noD: every small file's fragment compressed) costs
           # about 45 CPU-seconds for this 2 GB image against 3 uncompressed
           "ENROOT_SQUASH_OPTIONS": "-noI -noD -noF -noX -exit-on-error"}
    for kind in ("CACHE", "DATA", "RUNTIME", "TEMP"):
        (work / kind.lower()).mkdir()
        env[f"ENROOT_{kind}_PATH"] = str(work / kind.lower())
    uri = f"docker://{USER}@{host}#{NAME}:stack"
    exe = str(tools.prefix / "bin" / "enroot")
    digests = {p["target"]: p["digest"] for p in published.record["platforms"]}

    def digest(*arch: str) -> str:
        proc = subprocess.run([exe, "digest", *arch, uri], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert digest() == digests[AMD64]
    assert digest("--arch", "aarch64") == digests[ARM64]
    out = work / "stack.sqsh"
    proc = subprocess.run([exe, "import", "-o", str(out), uri], env=env, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    listing = subprocess.run(["unsquashfs", "-l", str(out)], capture_output=True, text=True,
                             check=True).stdout
    assert "/usr/lib/x86_64-linux-gnu/" in listing
    assert "/usr/lib/aarch64-linux-gnu/" not in listing
    _timing("enroot build, digests and import", t0)


def test_apptainer_pull_takes_the_host_platform(published: Published, tmp_path: Path) -> None:
    apptainer = shutil.which("apptainer")
    if apptainer is None:
        pytest.skip("apptainer is not installed on this host: its docker:// pull of the index "
                    "is not exercised here")
    out = tmp_path / "stack.sif"
    env = {**os.environ, "APPTAINER_DOCKER_USERNAME": USER,
           "APPTAINER_DOCKER_PASSWORD": PASSWORD}
    proc = subprocess.run([apptainer, "pull", "--no-https", str(out),
                           f"docker://{published.tag}"], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    listing = subprocess.run(["siftool", "list", str(out)], capture_output=True, text=True,
                             check=True).stdout
    assert "amd64" in listing


def test_platform_whose_gate_failed_is_refused_and_nothing_is_sent(
        stack: Stack, auth_registry: RegistryServer, tmp_path: Path,
        docker_host: str) -> None:
    """The x86_64 build, changed by one label (its own content), gated against the arm64
    target: the real gate fails it. Published beside the arm64 build: refused, one line naming
    the target and platform, exit 1, nothing in the registry, no record."""
    client = docker.from_env()
    dockerfile = f"FROM verl-env:{AMD64}\nLABEL org.verl-env.test.changed=1\n"
    changed, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()),
                                     tag=f"verl-env-refused:{AMD64}", rm=True, pull=False)
    client.images.get(f"verl-env:{ARM64}").tag("verl-env-refused", ARM64)
    gate = run_build_env("verify", f"verl-env-refused:{AMD64}", "--target", ARM64, "--matrix",
                         FIXTURE, "--json", timeout=600)
    assert gate.returncode == 1, gate.stderr
    assert json.loads(gate.stdout)["overall"] == "fail"
    proc = _publish(auth_registry.host, stack, tmp_path, env=CREDS, prefix="verl-env-refused")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"[{AMD64}]" in lines[0] and "linux/amd64" in lines[0] and changed.id[7:19] in lines[0]
    assert "no passing verdict" in lines[0] and "nothing was pushed" in lines[0]
    assert proc.stdout == ""
    assert not (tmp_path / "index.json").exists()
    assert not list(tmp_path.glob("index.incomplete*"))
    assert NAME not in auth_registry.log()  # the registry was not even asked about it
    # nothing sent: the repository does not exist (no tag, no manifest, no blob)
    listed = requests.get(f"http://{auth_registry.host}/v2/{NAME}/tags/list", timeout=30,
                          auth=(USER, PASSWORD))
    assert listed.status_code == 404, listed.text
    assert not list((auth_registry.root / "data").rglob("_manifests"))
