"""The BuildKit engine on a real Docker Engine: which CLI drives the build, what happens without
one, progress and errors, cancellation, and the layers of the built fixture (no dead bytes)."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import docker
import pytest

from builder.engine import buildkit as eng
from builder.engine import BuildProgress, Engine, PlainProgress
from builder.errors import EngineError
from tests.conftest import REPO
from tests.pipeline.layerwalk import dead_files, read_saved

# ------------------------------------------------------------------ progress parsing (pure)

PLAIN = """\
#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 37B done
#1 DONE 0.0s

#4 [source-build 1/3] FROM docker.io/library/debian:bookworm
#4 CACHED

#5 [runtime 1/2] FROM docker.io/library/debian:bookworm
#5 DONE 0.0s

#6 [source-build 2/3] RUN make wheels
#6 CACHED

#7 [source-build 3/3] RUN apt-get install -y no-such
#7 0.512 Reading package lists...
#7 1.204 E: Unable to locate package no-such
#8 [runtime 2/2] RUN echo ok
#8 0.101 ok
#8 DONE 0.3s
#7 ERROR: executor failed running [/bin/bash -c apt-get install -y no-such]: exit code: 100
------
 > [source-build 3/3] RUN apt-get install -y no-such:
------
failed to solve: executor failed running [/bin/bash -c apt-get install -y no-such]: exit code: 100
"""


def test_plain_progress_steps_cache_hits_seconds_and_the_failed_step() -> None:
    progress = BuildProgress()
    parser = PlainProgress(progress)
    for line in PLAIN.splitlines(keepends=True):
        parser.feed(line)
    assert progress.total == 5  # 3 in source-build + 2 in runtime; internal vertices excluded
    assert progress.step == 5 and progress.cache_hits == 1
    by_at = {(s["stage"], s["at"]): s for s in progress.steps}
    assert by_at[("source-build", "2/3")]["cached"] is True
    assert by_at[("runtime", "2/2")]["seconds"] == 0.3
    error = parser.error()
    assert error.startswith("build failed at step source-build 3/3 "
                            "(RUN apt-get install -y no-such): executor failed running")
    assert "E: Unable to locate package no-such" in error and "ok" not in error.split("\n", 1)[1]


def test_an_error_before_any_step_shows_the_engines_words() -> None:
    parser = PlainProgress(BuildProgress())
    for line in ["#1 [internal] load build definition from Dockerfile\n", "#1 DONE 0.0s\n",
                 "failed to solve with frontend dockerfile.v0: failed to create LLB definition: "
                 "dockerfile parse error line 2: unknown instruction: RUNN\n"]:
        parser.feed(line)
    assert "unknown instruction: RUNN" in parser.error()


@pytest.mark.parametrize("value,expected", [("x86_64", "linux/amd64"), ("amd64", "linux/amd64"),
                                            ("aarch64", "linux/arm64"), ("arm64", "linux/arm64"),
                                            ("linux/riscv64", "linux/riscv64")])
def test_platform_of(value: str, expected: str) -> None:
    assert eng.platform_of(value) == expected


# ------------------------------------------------------------------ which CLI drives the build

NO_BUILDX = """#!/bin/sh
# a docker 23+ CLI without the buildx plugin, as it answers these two probes
if [ "$1" = buildx ]; then echo "docker: unknown command: docker buildx" >&2; exit 1; fi
if [ -n "$DOCKER_BUILDKIT" ]; then
  echo "ERROR: BuildKit is enabled but the buildx component is missing or broken." >&2; exit 1
fi
echo "classic builder: would have built" >&2
touch "$(dirname "$0")/CALLED"
exit 0
"""


@pytest.fixture
def no_buildkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
                ) -> Path:
    """PATH holds one docker CLI and it cannot drive BuildKit; the Debian fallback is hidden."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if request.param == "fake":
        (bindir / "docker").write_text(NO_BUILDX)
        (bindir / "docker").chmod(0o755)
    else:  # the real 23+ CLI of this machine, when it has no buildx plugin
        real = Path("/usr/local/bin/docker")
        if not real.exists() or eng._probe([str(real), "buildx", "version"]) is not None:
            pytest.skip("no docker CLI without buildx at /usr/local/bin/docker")
        (bindir / "docker").symlink_to(real)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/sbin:/sbin")
    monkeypatch.delenv(eng.CLI_OVERRIDE, raising=False)
    monkeypatch.setattr(eng, "FALLBACK_CLIS", ())
    monkeypatch.setattr(eng, "_cli_cache", {})
    return bindir


@pytest.mark.docker  # a real engine (the session's dockerd)
@pytest.mark.parametrize("no_buildkit", ["fake", "real-cli-without-buildx"], indirect=True)
def test_without_buildkit_the_error_says_how_to_enable_it_and_nothing_is_built(
        no_buildkit: Path, tmp_path: Path, docker_host: str) -> None:
    client = docker.from_env()
    before = sorted(i.id for i in client.images.list(all=True))
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY Dockerfile /\n")
    with pytest.raises(EngineError) as err:
        Engine(client).build(ctx, target="t")
    text = str(err.value)
    assert "BuildKit is required" in text and str(no_buildkit / "docker") in text
    assert "docker-buildx" in text and "docker.io" in text and eng.CLI_OVERRIDE in text
    assert not (no_buildkit / "CALLED").exists()  # the classic builder was never asked
    assert sorted(i.id for i in client.images.list(all=True)) == before


def test_the_override_is_probed_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    fake = tmp_path / "old-docker"
    fake.write_text(NO_BUILDX)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(eng.CLI_OVERRIDE, str(fake))
    monkeypatch.setattr(eng, "_cli_cache", {})
    with pytest.raises(EngineError, match=f"from {eng.CLI_OVERRIDE}.*{fake}"):
        eng.find_buildkit_cli()


def test_a_buildkit_cli_is_found_here_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eng, "_cli_cache", {})
    try:
        cli = eng.find_buildkit_cli()
    except EngineError as exc:
        pytest.skip(f"no BuildKit-capable docker CLI on this machine: {exc}")
    assert cli.kind in ("buildx", "builtin")
    assert eng.find_buildkit_cli() is cli
    calls = []
    monkeypatch.setattr(eng, "_probe", lambda *a, **k: calls.append(a))
    assert eng.find_buildkit_cli() is cli and calls == []  # cached: no second probe


# ------------------------------------------------------------------ real builds


@pytest.fixture(scope="module")
def engine(docker_host: str) -> Engine:
    try:
        eng.find_buildkit_cli()
    except EngineError as exc:
        pytest.skip(str(exc))
    return Engine.connect()


def _context(tmp_path: Path, dockerfile: str) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


@pytest.mark.docker  # a real engine (the session's dockerd)
def test_mounts_secrets_progress_and_cache(engine: Engine, debian_base: str, tmp_path: Path
                                           ) -> None:
    ctx = _context(tmp_path, f"""FROM {debian_base}
RUN --mount=type=secret,id=token,required=true test "$(cat /run/secrets/token)" = s3cret \\
    && echo checked > /checked
RUN --mount=type=bind,source=data,target=/mnt/data --mount=type=cache,target=/var/cache/t \\
    cat /mnt/data/blob > /from-bind && cp /mnt/data/blob /var/cache/t/ && echo done
LABEL org.verl-env.test=buildkit
""")
    (ctx / "data").mkdir()
    (ctx / "data" / "blob").write_bytes(os.urandom(4096))
    secret = tmp_path / "token"
    secret.write_text("s3cret")
    events: list[str] = []
    first = engine.build(ctx, target="t", secrets={"token": secret},
                         on_event=lambda p, line: events.append(line))
    assert first.image_id.startswith("sha256:") and first.steps == 3 and first.cache_hits == 0
    assert [s["at"] for s in first.step_times] == ["1/3", "2/3", "3/3"]
    assert any(line.startswith("#") for line in events)
    image = engine.client.images.get(first.image_id)
    assert image.labels["org.verl-env.test"] == "buildkit" and image.tags == []
    out = engine.client.containers.run(first.image_id, ["sh", "-c",
                                       "cat /checked; ls /run/secrets /var/cache/t 2>&1; "
                                       "cmp /from-bind /from-bind && echo same"], remove=True,
                                       network_mode="none").decode()
    assert "checked" in out and "same" in out and "s3cret" not in out
    again = engine.build(ctx, target="t", secrets={"token": secret})
    assert again.image_id == first.image_id and again.cache_hits == again.steps - 1


@pytest.mark.docker  # a real engine (the session's dockerd)
def test_a_failing_step_is_named_with_its_log(engine: Engine, debian_base: str, tmp_path: Path
                                              ) -> None:
    before = sorted(i.id for i in engine.client.images.list(all=True))
    ctx = _context(tmp_path, f"FROM {debian_base}\nRUN echo first-line && echo "
                             "verl-env-marker >&2 && exit 7\n")
    with pytest.raises(EngineError) as err:
        engine.build(ctx, target="t")
    text = str(err.value)
    assert text.startswith("build: [t] build failed at step 2/2 (RUN echo first-line")
    assert "exit code: 7" in text and "verl-env-marker" in text
    assert sorted(i.id for i in engine.client.images.list(all=True)) == before


@pytest.mark.docker  # a real engine (the session's dockerd)
def test_a_missing_secret_file_is_refused_before_building(engine: Engine, tmp_path: Path) -> None:
    ctx = _context(tmp_path, "FROM scratch\n")
    with pytest.raises(EngineError, match="build secret site-ca: no such file"):
        engine.build(ctx, target="t", secrets={"site-ca": tmp_path / "missing.pem"})


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _sleepers(marker: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.docker  # a real engine (the session's dockerd)
def test_an_interrupt_kills_the_build_and_builds_nothing(engine: Engine, debian_base: str,
                                                         tmp_path: Path) -> None:
    marker = f"{os.getpid() % 1000 + 3000}.{int(time.time()) % 1000}"  # unique `sleep` argument
    ctx = _context(tmp_path, f"FROM {debian_base}\nRUN sleep {marker}\n")
    before = sorted(i.id for i in engine.client.images.list(all=True))
    cli_pids: list[int] = []

    def on_event(progress: BuildProgress, line: str) -> None:
        if line.startswith("#") and "RUN sleep" in line:
            deadline = time.monotonic() + 60
            while not _sleepers(f"sleep {marker}") and time.monotonic() < deadline:
                time.sleep(0.2)
            cli_pids.extend(_sleepers("--iidfile"))
            cli_pids[:] = [p for p in cli_pids if str(ctx) in _cmdline(p)]
            raise KeyboardInterrupt  # what interrupts_raise turns SIGINT/SIGTERM into

    with pytest.raises(KeyboardInterrupt):
        engine.build(ctx, target="t", on_event=on_event)
    assert cli_pids, "the build CLI was not seen running"
    deadline = time.monotonic() + 30
    while (_sleepers(f"sleep {marker}") or any(str(ctx) in _cmdline(p) for p in cli_pids)) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _sleepers(f"sleep {marker}") == [], "the RUN step outlived the cancelled build"
    assert not [p for p in cli_pids if str(ctx) in _cmdline(p)], "the build CLI outlived it"
    assert sorted(i.id for i in engine.client.images.list(all=True)) == before


# ------------------------------------------------------------------ dead bytes in layers


@pytest.mark.docker  # a real engine (the session's dockerd)
def test_the_layer_walk_sees_copy_then_delete(engine: Engine, debian_base: str, tmp_path: Path
                                              ) -> None:
    """The measuring stick itself: a file COPYed in and removed later is counted."""
    ctx = _context(tmp_path, f"FROM {debian_base}\nCOPY blob /tmp/blob\nCOPY keep /keep\n"
                             "RUN rm /tmp/blob && echo new >> /keep\n")
    (ctx / "blob").write_bytes(os.urandom(300_000))
    (ctx / "keep").write_bytes(b"old\n")
    built = engine.build(ctx, target="t")
    skip = len(engine.client.images.get(debian_base).attrs["RootFS"]["Layers"])
    layers = read_saved(engine.client.images.get(built.image_id).save())
    dead = dead_files(layers, skip)
    assert dead == {f"{skip}:/tmp/blob": 300_000, f"{skip + 1}:/keep": 4}
    engine.client.images.remove(built.image_id)


@pytest.mark.docker  # a real engine (the session's dockerd)
def test_the_fixture_image_has_no_dead_bytes(engine: Engine, debian_base: str, ca_bundle: Path,
                                             tmp_path: Path) -> None:
    """The CPU fixture as the pipeline builds it (same rendering, same engine call: with the
    session's cache this is the very image ``cpu_image`` got, without waiting on its gate)."""
    from builder.resolve.lock import lock_path
    from builder.resolve.metadata import load_snapshot
    from builder.render import render_context
    from builder.matrix.spec import load_matrix

    matrix = load_matrix(REPO / "tests/fixtures/cpu.yaml")
    target = matrix.target("cpu-x86_64")
    lock = lock_path(matrix.path, target)
    ctx = render_context(target, lock.read_text(), load_snapshot(
        matrix.path.parent / "metadata" / "pypi-snapshot.json"), tmp_path / "ctx",
        lock_file=lock, ca_bundle=ca_bundle)
    built = engine.build(ctx.path, target=target.name, platform=target.platform,
                         secrets=ctx.secrets)
    skip = len(engine.client.images.get(debian_base).attrs["RootFS"]["Layers"])
    layers = read_saved(engine.client.images.get(built.image_id).save())
    assert len(layers) > skip + 5
    own = sum(sum(layer.files.values()) for layer in layers[skip:])
    assert own > 500_000_000  # the walk really read the installed stack (torch, ray, ...)
    dead = dead_files(layers, skip)
    assert sum(dead.values()) == 0, sorted(dead.items(), key=lambda kv: -kv[1])[:20]


@pytest.mark.docker  # a real engine (the session's dockerd)
def test_the_site_index_secrets_reach_pip_and_uv_config_but_no_layer(
        engine: Engine, debian_base: str, tmp_path: Path) -> None:
    """The mounts render.py emits for --index-url, built for real: inside the step pip's and
    uv's system config files hold the site's index; the image holds neither file nor the URL."""
    from builder.render.write import site_index_secrets

    url = "https://builder:t0ken-456@pypi.mirror.example/simple"
    secrets = site_index_secrets(url)
    ctx = _context(tmp_path, f"""FROM {debian_base}
RUN --mount=type=secret,id=site-index-pip,target=/etc/pip.conf,required=true \\
    --mount=type=secret,id=site-index-uv,target=/etc/uv/uv.toml,required=true \\
    grep -q 'index-url = https://builder:' /etc/pip.conf \\
    && grep -q 'default = true' /etc/uv/uv.toml && echo seen > /seen
""")
    built = engine.build(ctx, target="t", secrets=secrets)
    out = engine.client.containers.run(built.image_id, ["sh", "-c", "cat /seen; ls /etc/pip.conf "
                                       "/etc/uv 2>&1; grep -rl t0ken-456 /etc 2>/dev/null | head -1"
                                       ], remove=True, network_mode="none").decode()
    assert "seen" in out and "No such file" in out and "t0ken-456" not in out
    history = json.dumps(engine.client.api.history(built.image_id))
    config = json.dumps(engine.client.images.get(built.image_id).attrs["Config"])
    assert "t0ken" not in history and "t0ken" not in config
