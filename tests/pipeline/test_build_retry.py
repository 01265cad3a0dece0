"""A build BuildKit itself broke off is built once more; a step that failed is not.

Engine 20.10's BuildKit now and then ends a build at a step with its own gRPC stream cut
(``rpc error: code = Internal desc = unexpected EOF``; moby/buildkit#1983; seen in this
project's CI on a fresh engine's first multi-stage build). The step's command did not fail, so
the build is started once more: the steps it finished come from the build cache. A stand-in
docker CLI (a shell script speaking BuildKit's plain progress) plays the engine's part: the
real BuildKit does this too rarely to be asked for.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from builder.engine import buildkit as bk
from builder.errors import EngineError

CLI = """#!/bin/sh
# a docker CLI with a built-in BuildKit client; `build` answers what $FAKE_ANSWERS says, in turn
case "$1" in
  buildx) exit 1 ;;
  build)
    if [ "$2" = "--help" ]; then echo "--secret --iidfile"; exit 0; fi ;;
esac
n=$(cat "$FAKE_DIR/n" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$FAKE_DIR/n"
answer=$(echo "$FAKE_ANSWERS" | cut -d, -f"$n")
while [ $# -gt 0 ]; do [ "$1" = "--iidfile" ] && iid=$2; shift; done
echo "#5 [runtime 1/2] FROM docker.io/library/base"
echo "#5 DONE 0.0s"
echo "#6 [runtime 2/2] RUN apt-get update"
case "$answer" in
  eof) echo "#6 ERROR: rpc error: code = Internal desc = unexpected EOF"
       echo "failed to solve: rpc error: code = Internal desc = unexpected EOF"; exit 1 ;;
  fail) echo "#6 0.2 E: Unable to locate package no-such"
        echo "#6 ERROR: executor failed running [/bin/sh -c apt-get update]: exit code: 100"
        exit 1 ;;
  *) echo "#6 DONE 1.0s"; echo "sha256:$(printf '%064d' 7)" > "$iid" ;;
esac
"""


class Daemon:
    def alive(self) -> bool:
        return True

    def cli_host(self) -> str | None:
        return None


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    cli = tmp_path / "docker"
    cli.write_text(CLI)
    cli.chmod(cli.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(bk.CLI_OVERRIDE, str(cli))
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text("FROM base\n")
    heard: list[str] = []

    def build(answers: str):  # type: ignore[no-untyped-def]
        monkeypatch.setenv("FAKE_ANSWERS", answers)
        (tmp_path / "n").unlink(missing_ok=True)
        return bk.Builds(Daemon(), None).build(  # type: ignore[arg-type]
            tmp_path / "ctx", target="t", on_event=lambda progress, line: heard.append(line))

    build.heard = heard  # type: ignore[attr-defined]
    build.calls = lambda: int((tmp_path / "n").read_text())  # type: ignore[attr-defined]
    return build


def test_a_build_broken_off_by_buildkit_is_built_once_more(builds) -> None:  # type: ignore[no-untyped-def]
    result = builds("eof,ok")
    assert builds.calls() == 2
    assert result.image_id == "sha256:" + "0" * 63 + "7"
    assert result.retried == "rpc error: code = Internal desc = unexpected EOF"
    said = [line for line in builds.heard if line.startswith("BuildKit broke the build off")]
    assert said == ["BuildKit broke the build off (rpc error: code = Internal desc = unexpected "
                    "EOF); building once more (the steps it finished are cached)\n"]


def test_broken_off_twice_is_an_error_naming_the_step(builds) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(EngineError, match=r"build failed at step runtime 2/2 \(RUN apt-get "
                                          r"update\): rpc error: code = Internal"):
        builds("eof,eof,ok")
    assert builds.calls() == 2  # bounded: one more, never a third


def test_a_step_that_failed_is_not_built_again(builds) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(EngineError, match="exit code: 100") as err:
        builds("fail,ok")
    assert builds.calls() == 1 and "Unable to locate package no-such" in str(err.value)
    assert not any(line.startswith("BuildKit broke") for line in builds.heard)


def test_a_clean_build_says_it_was_not_retried(builds) -> None:  # type: ignore[no-untyped-def]
    assert builds("ok").retried == "" and builds.calls() == 1
