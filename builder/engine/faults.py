"""When the engine itself fails: it stops answering (dockerd killed or restarted, its host gone)
or its data root fills up. Either becomes one error naming the stage, the engine (its address,
its data root) and what to do next; nothing above :mod:`builder.engine` sees a socket error.

A lost connection is told from a slow one by asking the engine again
(:meth:`~builder.engine.protocol.EngineHealth.alive`): a read timeout over a unix socket reaches
docker-py as a ``ConnectionError`` too. What is asked of the engine here is
:class:`~builder.engine.protocol.EngineHealth`, never the Docker implementation.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import docker.errors
import requests
import urllib3.exceptions

from builder.engine.protocol import EngineHealth
from builder.errors import BuildEnvError, EngineError, InfraError

# What BuildKit, runc, apt, pip and uv print when a write fails for want of space.
_NO_SPACE = re.compile(r"no space left on device|\bENOSPC\b|os error 28|errno 28|"
                       r"not enough free space|disk quota exceeded", re.IGNORECASE)


class EngineFault(InfraError, EngineError):
    """The engine failed as a whole (not one step or one container): the stage is the caller's.
    An infrastructure error (exit 3); a failed step of the user's Dockerfile stays an
    :class:`EngineError` (exit 1)."""

    def __init__(self, message: str, *, stage: str = "engine", target: str | None = None
                 ) -> None:
        super().__init__(message, target=target)
        self.stage = stage


class EngineDown(EngineFault):
    """The engine stopped answering in the middle of a stage."""


class DataRootFull(EngineFault):
    """The engine's data root has no space left for what the stage writes."""


class EngineUnreachable(EngineFault):
    """No engine answers where the environment points (DOCKER_HOST, the docker context, the
    default socket)."""


def no_space(text: str) -> str | None:
    """The line of ``text`` that says a write failed for want of space, or None."""
    for line in reversed(text.splitlines()):
        if _NO_SPACE.search(line):
            return line.strip()
    return None


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a broken or refused connection."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
                            urllib3.exceptions.ProtocolError,
                            urllib3.exceptions.NewConnectionError,
                            http.client.RemoteDisconnected, ConnectionError)):
            return True
        if isinstance(cur, FileNotFoundError) and "sock" in str(cur):
            return True  # the unix socket is gone
        if isinstance(cur, docker.errors.DockerException) and re.search(
                r"connection (refused|aborted|reset)|no such file or directory", str(cur), re.I):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def free_space(engine: EngineHealth, path: str) -> int | None:
    """Bytes free under ``path`` when the engine runs on this machine (else None: a remote
    engine's data root cannot be measured from here)."""
    if not path or not engine.is_local() or not os.path.isdir(path):
        return None
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def data_root_full(engine: EngineHealth, *, stage: str, what: str, evidence: str,
                   target: str | None = None) -> DataRootFull:
    """The error for a write that failed for want of space in the engine's data root: the data
    root, its free space (a local engine), the engine's own words and what can be freed."""
    root, cache = "", None
    try:
        root = engine.data_root()
        cache = engine.idle_build_cache()
    except Exception:  # noqa: BLE001 - best effort: the message is built either way
        pass
    free = free_space(engine, root)
    where = f"the data root {root}" if root else "its data root"
    facts = [f"{free and human(free) or '0 B'} free there now"] if free is not None else [
        "its free space cannot be measured from here (the engine is not on this machine)"]
    if cache:
        facts.append(f"{human(cache)} of build cache not in use (docker builder prune frees it)")
    said = "; ".join(facts)
    return DataRootFull(
        f"{engine.where} ran out of space in {where} during {what}; the engine said: "
        f"{evidence[:300]!r}. {said[:1].upper()}{said[1:]}. Nothing was tagged. Free space "
        "there or give the data root more room, then run the same command again: the steps "
        "that finished come from the build cache.", stage=stage, target=target)


def engine_down(engine: EngineHealth, *, stage: str, what: str, target: str | None = None,
                left: str = "") -> EngineDown:
    tail = f" {left}" if left else ""
    return EngineDown(
        f"{engine.where} stopped answering during {what}; no verdict was recorded and nothing "
        f"was tagged.{tail} Start the engine again and run the same command: it builds (the steps "
        "that finished come from the build cache) and verifies again.", stage=stage,
        target=target)


def translate(engine: EngineHealth, exc: BaseException, *, stage: str, what: str,
              target: str | None = None) -> EngineFault | None:
    """``exc`` as an :class:`EngineFault` of ``stage`` when the engine failed as a whole (an
    EngineFault raised below, relabelled; a lost connection the engine does not answer after);
    None for any other error."""
    if isinstance(exc, EngineFault):
        if exc.stage == "engine":
            exc.stage = stage
        if exc.target is None:
            exc.target = target
        return exc
    if isinstance(exc, BuildEnvError):
        if isinstance(exc, EngineError) and (line := no_space(str(exc))):
            return data_root_full(engine, stage=stage, what=what, evidence=line, target=target)
        return None
    if connection_lost(exc) and not engine.alive():
        return engine_down(engine, stage=stage, what=what, target=target)
    return None


@contextmanager
def stage(engine: EngineHealth, name: str, *, what: str, target: str | None = None
          ) -> Iterator[None]:
    """Run a block of engine calls as stage ``name``: the engine dying or filling up in it
    becomes an :class:`EngineFault` naming ``name``, the engine and ``what`` was under way."""
    try:
        yield
    except Exception as exc:
        fault = translate(engine, exc, stage=name, what=what, target=target)
        if fault is None or fault is exc:
            raise
        raise fault from None
