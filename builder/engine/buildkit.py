"""Builds through BuildKit and their progress.

The Dockerfile uses ``RUN --mount``, which the classic builder cannot parse, so builds are driven
by a docker CLI that can: ``docker buildx build`` or, with a CLI that has BuildKit built in
(Debian's 20.10 ``docker.io``), ``DOCKER_BUILDKIT=1 docker build``. Build output
(``--progress=plain``) is scanned line by line: steps, cache hits, per-step seconds and errors
are surfaced, never swallowed. The build process is always stopped, also on SIGINT/SIGTERM (see
:func:`builder.engine.signals.interrupts_raise`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors

from builder.engine.client import Daemon
from builder.engine.faults import data_root_full, engine_down, no_space
from builder.engine.platforms import EMULATION_PACKAGES, Platforms, platform_of
from builder.engine.results import BuildProgress, BuildResult
from builder.errors import EngineError


CLI_OVERRIDE = "VERL_ENV_DOCKER_CLI"  # a docker executable to build with (probed like the others)
# Tried after every `docker` on PATH: Debian's docker.io CLI, which has a BuildKit client built in.
FALLBACK_CLIS: tuple[str, ...] = ("/usr/bin/docker",)
_PROBE_TIMEOUT = 20


@dataclass(frozen=True)
class BuildKitCli:
    """How to start a BuildKit build: ``argv`` + options, with ``env`` added."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def kind(self) -> str:
        return "buildx" if "buildx" in self.argv else "builtin"

    def __str__(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env)
        return f"{env} {' '.join(self.argv)}".strip()


_cli_cache: dict[tuple[str, str], BuildKitCli] = {}


def _probe(argv: list[str], env: dict[str, str] | None = None) -> str | None:
    """stdout+stderr of a quick local command (never reaches a daemon), or None if it failed."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT,
                              env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout + proc.stderr if proc.returncode == 0 else None


def _docker_candidates() -> list[str]:
    """Every distinct ``docker`` executable: the override, those on PATH, then the fallbacks."""
    found: list[str] = []
    override = os.environ.get(CLI_OVERRIDE)
    if override:
        return [shutil.which(override) or override]
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        exe = shutil.which("docker", path=d) if d else None
        if exe:
            found.append(exe)
    found += [f for f in FALLBACK_CLIS if os.access(f, os.X_OK)]
    unique: list[str] = []
    for exe in found:
        if os.path.realpath(exe) not in {os.path.realpath(u) for u in unique}:
            unique.append(exe)
    return unique


def find_buildkit_cli() -> BuildKitCli:
    """The first docker CLI that can drive a BuildKit build: ``buildx`` (any candidate), else a
    CLI with a built-in BuildKit client (``DOCKER_BUILDKIT=1 docker build`` knows ``--secret``;
    a 23+ CLI without buildx refuses even ``--help``). Cached per PATH and override."""
    key = (os.environ.get("PATH", ""), os.environ.get(CLI_OVERRIDE, ""))
    if key in _cli_cache:
        return _cli_cache[key]
    candidates = _docker_candidates()
    chosen: BuildKitCli | None = None
    for exe in candidates:
        if _probe([exe, "buildx", "version"]) is not None:
            chosen = BuildKitCli((exe, "buildx", "build", "--load"))
            break
    if chosen is None:
        for exe in candidates:
            out = _probe([exe, "build", "--help"], {"DOCKER_BUILDKIT": "1"})
            if out and "--secret" in out and "--iidfile" in out:
                chosen = BuildKitCli((exe, "build"), (("DOCKER_BUILDKIT", "1"),))
                break
    if chosen is None:
        tried = ", ".join(candidates) or "none (no `docker` on PATH)"
        where = f" (from {CLI_OVERRIDE})" if os.environ.get(CLI_OVERRIDE) else ""
        raise EngineError(
            "BuildKit is required (the Dockerfile uses RUN --mount, which the classic builder "
            f"cannot parse), but no docker CLI here can drive it; tried{where}: {tried} "
            "(no `docker buildx`, no built-in BuildKit client). Enable it: install the buildx "
            "plugin (Debian/Ubuntu: apt-get install docker-buildx; Docker's packages: "
            "docker-buildx-plugin), or Debian's docker.io CLI (built-in BuildKit client, "
            f"/usr/bin/docker), or set {CLI_OVERRIDE} to a docker CLI that has either.")
    _cli_cache[key] = chosen
    return chosen


# `#5 ERROR: ...`, `#5 0.532 <output of the step>`; internal vertices (`[internal] load ...`,
# `exporting to image`) are not steps.
_VERTEX = re.compile(r"^#(\d+) \[(?:(?P<stage>[^\]]*?)\s+)?(?P<x>\d+)/(?P<y>\d+)\] (?P<text>.*)$")
_STATE = re.compile(r"^#(\d+) (CACHED|DONE ([\d.]+)s|ERROR:? ?(.*)|CANCELED.*)$")
_OUTPUT = re.compile(r"^#(\d+) \d+\.\d+ (.*)$")


class PlainProgress:
    """Parses BuildKit's ``--progress=plain`` output into a :class:`BuildProgress`."""

    def __init__(self, progress: BuildProgress) -> None:
        self.progress = progress
        self.vertices: dict[str, dict[str, Any]] = {}  # vertex id -> its entry in progress.steps
        self.output: dict[str, deque[str]] = {}  # vertex id -> the tail of its log
        self.stage_totals: dict[str, int] = {}
        self.failed: list[tuple[dict[str, Any] | None, str]] = []
        self.other: deque[str] = deque(maxlen=30)  # lines outside any vertex (final errors)
        self.finished: set[int] = set()  # id() of the steps done, cached or failed
        self.texts: dict[int, str] = {}  # id() of a step -> its whole instruction

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")
        p = self.progress
        m = _VERTEX.match(line)
        if m:
            vid = m.group(1)
            if vid not in self.vertices:
                stage = (m.group("stage") or "").strip()
                self.stage_totals[stage] = int(m.group("y"))
                p.total = sum(self.stage_totals.values())
                p.step += 1
                p.instruction = m.group("text")
                entry: dict[str, Any] = {
                    "step": p.step, "stage": stage, "at": f"{m.group('x')}/{m.group('y')}",
                    "instruction": m.group("text")[:100], "cached": False, "seconds": 0.0}
                self.vertices[vid] = entry
                self.texts[id(entry)] = m.group("text")
                p.steps.append(entry)
            return
        m = _STATE.match(line)
        if m:
            vertex = self.vertices.get(m.group(1))
            state = m.group(2)
            if vertex is not None:
                self.finished.add(id(vertex))
            if state == "CACHED" and vertex is not None and not vertex["cached"]:
                vertex["cached"] = True
                # a base image is reported CACHED once any build used it: not a hit of ours
                p.cache_hits += not vertex["instruction"].startswith("FROM ")
            elif state.startswith("DONE") and vertex is not None:
                vertex["seconds"] = float(m.group(3))
            elif state.startswith("ERROR"):
                self.failed.append((vertex, m.group(4) or ""))
            return
        m = _OUTPUT.match(line)
        if m:
            self.output.setdefault(m.group(1), deque(maxlen=15)).append(m.group(2))
            return
        if line and not line.startswith("#"):
            self.other.append(line)

    def error(self) -> str:
        """The failed step, BuildKit's message and the tail of that step's log."""
        for entry, message in self.failed:
            if entry is None:
                continue
            vid = next(v for v, e in self.vertices.items() if e is entry)
            tail = "\n".join(self.output.get(vid, ()))
            where = f"{entry['stage']} {entry['at']}".strip()
            return (f"build failed at step {where} ({entry['instruction'][:120]}): "
                    f"{message.strip()}\n{tail}")
        detail = "\n".join(line for line in self.other if line.strip()) or "no output"
        last = self.current()
        if last is None:
            return f"build failed before any step ran:\n{detail}"
        return f"build failed after step {self.describe(last)} had started:\n{detail}"

    def current(self) -> dict[str, Any] | None:
        """The step under way (started, not yet done or cached), else the last one started."""
        for entry in reversed(self.progress.steps):
            if id(entry) not in self.finished:
                return entry
        return self.progress.steps[-1] if self.progress.steps else None

    def describe(self, entry: dict[str, Any]) -> str:
        """``stage-0 2/13 (RUN apt-get update ...)``: the command without its ``--mount``s, its
        head and tail when long (a layer's file name is at the end)."""
        where = f"{entry['stage']} {entry['at']}".strip()
        full = self.texts.get(id(entry), entry["instruction"])
        text = " ".join(re.sub(r"\s--mount=\S+", "", " " + full).split())
        if len(text) > 110:
            text = f"{text[:64]} ... {text[-42:]}"
        return f"{where} ({text})"


# BuildKit's own gRPC stream to a step cut off (the step's command did not fail: that reads
# "executor failed running ...: exit code: N" or "did not complete successfully")
_BUILDKIT_EOF = re.compile(r"rpc error: code = (Internal|Unavailable) desc = "
                           r"(unexpected EOF|error reading from server: EOF|transport is closing)")
BUILD_ATTEMPTS = 2


class _BrokenOff(Exception):
    """The build ended with :data:`_BUILDKIT_EOF` at a step (``said``), not by the step."""

    def __init__(self, why: str, said: str) -> None:
        super().__init__(why)
        self.said = said


def broken_off(parser: PlainProgress) -> str | None:
    """BuildKit's message where it broke the build off at a step, else None."""
    for entry, message in parser.failed:
        m = _BUILDKIT_EOF.search(message)
        if entry is not None and m:
            return m.group(0)
    return None


def _stop_group(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    """Stop a build CLI and everything it started (its own process group): the daemon sees the
    session close and cancels the build."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class Builds:
    """BuildKit builds on the connected daemon (a part of :class:`builder.engine.Engine`): the
    build CLI is sent to the daemon the SDK talks to (:meth:`Daemon.cli_host`)."""

    def __init__(self, daemon: Daemon, platforms: Platforms) -> None:
        self.daemon = daemon
        self.platforms = platforms

    def build(self, context: Path, *, target: str, network: str | None = "host",
              platform: str | None = None, secrets: dict[str, Path] | None = None,
              on_event: Callable[[BuildProgress, str], None] | None = None,
              no_cache: bool = False) -> BuildResult:
        """Build ``context/Dockerfile`` with BuildKit (untagged) on this engine's daemon.

        ``network``: for RUN steps (``host``; None: the daemon's default). ``platform``: the
        target's arch or platform; ``--platform`` is passed only when it differs from the
        daemon's. ``secrets``: BuildKit secrets (id -> file), e.g. the site CA. Raises EngineError
        naming the failed step. ``no_cache``: no step is taken from the build cache (``--no-cache``;
        BuildKit still mounts the cache mounts, e.g. a source build's pip cache; uv's cache
        lives only inside each install step, so every wheel is fetched again and checked by
        ``--require-hashes``); on SIGINT/SIGTERM (KeyboardInterrupt, see interrupts_raise) the
        build process group is killed, which cancels the build: nothing is tagged.

        A build that BuildKit itself broke off at a step with its stream to the step cut
        (:data:`_BUILDKIT_EOF`: Engine 20.10's BuildKit does so now and then, moby/buildkit#1983)
        is started once more (``on_event`` hears it; the result's ``retried`` holds what BuildKit
        said); the steps it finished come from the build cache.
        """
        cli = find_buildkit_cli()
        cmd = [*cli.argv, "--progress=plain", "--file", str(Path(context) / "Dockerfile")]
        if network:
            cmd += ["--network", network]
        if no_cache:
            cmd.append("--no-cache")
        wanted = platform_of(platform) if platform else None
        if wanted and wanted != self.platforms.daemon_platform():
            self.platforms.require_emulation(wanted, target=target)
            cmd += ["--platform", wanted]
        for sid, src in sorted((secrets or {}).items()):
            if not Path(src).is_file():
                raise EngineError(f"build secret {sid}: no such file {src}", target=target)
            cmd.append(f"--secret=id={sid},src={Path(src).resolve()}")
        cmd.append(str(context))
        retried = ""
        for attempt in range(1, BUILD_ATTEMPTS + 1):
            try:
                return dataclasses.replace(self._attempt(cmd, cli, target, on_event),
                                           retried=retried)
            except _BrokenOff as exc:
                if attempt == BUILD_ATTEMPTS:
                    raise EngineError(str(exc), target=target) from None
                retried = exc.said
                if on_event:
                    on_event(BuildProgress(), f"BuildKit broke the build off ({exc.said}); "
                             "building once more (the steps it finished are cached)\n")
        raise AssertionError("unreachable")

    def _attempt(self, cmd: list[str], cli: BuildKitCli, target: str,
                 on_event: Callable[[BuildProgress, str], None] | None) -> BuildResult:
        """One run of the build CLI; its failure raised as EngineError (or _BrokenOff)."""
        progress = BuildProgress()
        parser = PlainProgress(progress)
        log: deque[str] = deque(maxlen=2000)
        with tempfile.TemporaryDirectory(prefix="verl-env-build-") as tmp:
            iidfile = Path(tmp) / "iid"
            # bytes, split at "\n" only: a step's progress bars ("\r") stay inside its lines
            proc = subprocess.Popen([*cmd[:-1], "--iidfile", str(iidfile), cmd[-1]],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self._cli_env(cli),
                                    start_new_session=True)
            try:
                assert proc.stdout is not None
                for raw in proc.stdout:
                    line = raw.decode("utf-8", "replace")
                    log.append(line)
                    parser.feed(line)
                    if on_event:
                        on_event(progress, line)
                code = proc.wait()
            finally:
                _stop_group(proc)
            if code != 0:
                self._engine_fault(parser, "".join(log), target)
                why = parser.error()
                if "exec format error" in "".join(log).lower():
                    why += (f" (exec format error: a foreign-architecture binary ran without QEMU "
                            f"emulation on the engine's host; install {EMULATION_PACKAGES} there)")
                said = broken_off(parser)
                if said:
                    raise _BrokenOff(why, said)
                raise EngineError(why, target=target)
            image_id = iidfile.read_text().strip() if iidfile.is_file() else ""
        if not image_id.startswith("sha256:"):
            raise EngineError(f"build ended without an image ID ({cli} wrote no --iidfile)",
                              target=target)
        return BuildResult(image_id, progress.total, progress.cache_hits, progress.elapsed,
                           "".join(log), tuple(progress.steps))

    def _engine_fault(self, parser: PlainProgress, log: str, target: str) -> None:
        """Raise an EngineFault when the build failed because the engine did: its data root is
        full, or it stopped answering (killed, restarted) in the middle of the build."""
        step = parser.current()
        what = f"the build, at step {parser.describe(step)}" if step else "the build"
        line = no_space(log)
        if line:
            raise data_root_full(self.daemon, stage="build", what=what, evidence=line,
                                 target=target)
        if not self.daemon.alive():
            last = [ln.strip() for ln in parser.other if ln.strip()][-1:]
            said = f" (the build client said: {last[0][:200]})" if last else ""
            raise engine_down(self.daemon, stage="build", what=what + said, target=target)

    def prune_build_cache(self) -> int:
        """Drop the whole BuildKit cache, cache mounts (the uv cache) included; bytes freed."""
        try:
            return int(self.daemon.client.api.prune_builds(all=True).get("SpaceReclaimed") or 0)
        except docker.errors.APIError as exc:
            raise EngineError(f"could not prune the build cache: {exc.explanation or exc}"
                              ) from None

    def _cli_env(self, cli: BuildKitCli) -> dict[str, str]:
        env = {**os.environ, **dict(cli.env)}
        host = self.daemon.cli_host()
        if host:
            env["DOCKER_HOST"] = host
            env.pop("DOCKER_CONTEXT", None)  # DOCKER_HOST wins anyway; say so
        return env
