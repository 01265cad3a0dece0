"""The command line's string types (builder.argtypes): what feeds the Dockerfile or the build's
configuration is refused by the parser in one line, exit 2, before anything runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from builder import argtypes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="build-env render", exit_on_error=True)
    p.add_argument("--base-image", type=argtypes.image_reference)
    p.add_argument("--set", type=argtypes.assignment, action="append", default=[])
    p.add_argument("--index-url", type=argtypes.index_url)
    p.add_argument("--ca-bundle", type=argtypes.file_path)
    return p


@pytest.mark.parametrize("argv", [
    ["--base-image", "nvidia/cuda:13.0.2-base-ubuntu24.04"],
    ["--base-image", "localhost:5000/x@sha256:" + "a" * 64],
    ["--set", "packages.verl=0.9.1", "--set", "gpus=sm_80,sm_90"],
    ["--index-url", "https://mirror.example/simple"],
    ["--ca-bundle", "/etc/ssl/site ca.pem"],
])
def test_good_values_pass_unchanged(argv: list[str]) -> None:
    ns = _parser().parse_args(argv)
    value = vars(ns)[argv[0][2:].replace("-", "_")]
    given = argv[1::2]
    assert value in (given[0], given, Path(given[0]))


@pytest.mark.parametrize("argv,needle", [
    (["--base-image", "ubuntu:24.04\nRUN id"], "is not an image reference"),
    (["--base-image", "ubuntu;id"], "is not an image reference"),
    (["--set", "python=3.12\nRUN id"], "python:"),
    (["--set", "packages.verl"], "expected KEY=VALUE"),
    (["--set", "a;b=1"], "expected KEY=VALUE"),
    (["--set", "description=a\u2028b"], "U+2028"),
    (["--index-url", "https://mirror/simple\n"], "U+000A"),
    (["--index-url", "ftp://mirror/simple"], "scheme"),
    (["--ca-bundle", "/etc/ssl/ca\x00.pem"], "U+0000"),
])
def test_bad_values_exit_2_in_one_line(argv: list[str], needle: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    message = err.strip().splitlines()[-1]
    assert message.startswith("build-env render: error: argument ")
    assert needle in message
