"""How ``builder.cli`` maps what a command raises to the documented exit code (docs/commands.md,
"Exit codes"): one line on stderr, never a traceback. The errors are raised by a stand-in
command (the mapping is pure logic); tests/cli/test_exit_codes.py holds the installed command
line to the same contract end to end."""

from __future__ import annotations

import errno
import subprocess

import pytest
import requests

from builder import cli
from builder.commands import BY_NAME
from builder.engine.faults import DataRootFull, EngineDown, EngineUnreachable
from builder.errors import (CompatError, EngineError, InfraError, NetworkError, NoSuchImage,
                            SpecError, UsageError)

RAISED = [
    ("a failed Dockerfile step", EngineError("step 3/9 failed: exit code 100"), 1),
    ("a failed check", CompatError("torch does not fit"), 1),
    ("bad matrix", SpecError("bad", file="m.yaml", line=3, key="k"), 2),
    ("empty argument", UsageError("IMAGE is empty"), 2),
    ("missing image", NoSuchImage("no such image: x"), 2),
    ("infrastructure", InfraError("the registry answered 503"), 3),
    ("network", NetworkError("https://u:p@idx.example/simple", "timed out",
                             way_out="--index-url"), 3),
    ("engine unreachable", EngineUnreachable("cannot reach the Docker Engine"), 3),
    ("engine died", EngineDown("stopped answering"), 3),
    ("data root full", DataRootFull("ran out of space"), 3),
    ("disk full", OSError(errno.ENOSPC, "No space left on device", "/x"), 3),
    ("unwritable path", PermissionError(errno.EACCES, "Permission denied", "/x"), 2),
    ("missing path", FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"), 2),
    ("index down", requests.ConnectionError(
        "refused", request=requests.Request("GET", "https://u:p@idx.example/").prepare()), 3),
    ("child timed out", subprocess.TimeoutExpired(["git", "ls-remote", "https://x"], 120), 3),
    ("ctrl-c", KeyboardInterrupt(), 130),
]


@pytest.mark.parametrize("name,exc,code", RAISED, ids=[r[0] for r in RAISED])
def test_what_a_command_raises_maps_to_its_exit_code(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str],
                                                     name: str, exc: BaseException,
                                                     code: int) -> None:
    def raising(args: object) -> int:
        raise exc

    monkeypatch.setattr(BY_NAME["list"], "run", raising)
    assert cli.main(["list"]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "u:p@" not in err  # credentials never reach a message


def test_a_build_interrupted_by_sigterm_exits_143(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The pipeline catches the interrupt itself and returns 130: SIGTERM still gives 143."""
    def terminated(args: object) -> int:
        try:
            cli.signals.terminated(15, None)
        except KeyboardInterrupt:
            return 130  # what pipeline.run returns after its cleanup
        return 0

    monkeypatch.setattr(cli.signals, "_RECEIVED", [])
    monkeypatch.setattr(BY_NAME["list"], "run", terminated)
    assert cli.main(["list"]) == 143


def test_an_error_type_is_its_code() -> None:
    assert issubclass(EngineUnreachable, InfraError) and issubclass(EngineUnreachable, EngineError)
    assert EngineError("x").exit_code == 1 and EngineDown("x").exit_code == 3


def test_a_registry_that_stays_down_is_an_infrastructure_error() -> None:
    """`publish` retries a registry that is down or answers 5xx; when every try failed the error
    is exit 3 (still a PublishError, naming the stage), a refusal stays exit 1."""
    from builder.publish import push as publish
    from builder.errors import PublishError
    from builder.registry.api import Transient

    def down() -> None:
        raise Transient("GET /v2/: ConnectionError")

    with pytest.raises(PublishError, match="still failing after 1 attempts") as caught:
        publish.retrying(down, "API check", 1)
    assert caught.value.exit_code == 3 and isinstance(caught.value, InfraError)
    assert PublishError("push refused: denied").exit_code == 1
