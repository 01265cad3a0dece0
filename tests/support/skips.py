"""The run's skips held against a reviewed list of expected ones (``tests/expected-skips.txt``).

A skip says a check did not run. ``scripts/test.sh`` passes ``--expected-skips FILE``; the hooks
in ``tests/conftest.py`` record every skipped test (and skipped module), and at the end of the
session each skip that no entry of the list covers fails the run, one line per skip naming the
test and its reason.

The list, one entry a line (a line starting with ``#`` is a comment)::

    WHEN | TEST | REASON

* WHEN: when the skip is expected on this host: ``always``, ``no-gpu`` (this host shows no
  GPU), ``fewer-than-2-gpus``, ``no-apptainer`` (neither ``apptainer`` nor ``singularity`` on
  PATH). An entry whose condition does not hold here covers nothing: on a host with a GPU, a
  GPU test that skips fails the run.
* TEST: a node id, ``*`` and ``?`` as in shell patterns (``tests/selftest/test_gpu.py::*``).
* REASON: a regular expression searched in the skip's reason (it may hold ``|``).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

# host GPU device nodes: NVIDIA's /dev/nvidiaN (not nvidiactl, nvidia-uvm...); AMD's compute
# driver /dev/kfd with one render node per GPU
_NVIDIA = re.compile(r"nvidia\d+")
_RENDER = re.compile(r"renderD\d+")


HOST_DEV_ENV = "VERL_ENV_HOST_DEV"  # where the host's device nodes are, as for the gate


def host_gpus(dev: Path | None = None) -> int:
    """How many GPUs this host shows in ``dev`` (default ``$VERL_ENV_HOST_DEV``, else /dev):
    NVIDIA device nodes, else AMD render nodes behind ``kfd``."""
    dev = dev or Path(os.environ.get(HOST_DEV_ENV) or "/dev")
    try:
        nvidia = sum(1 for p in dev.iterdir() if _NVIDIA.fullmatch(p.name))
    except OSError:
        return 0
    if nvidia:
        return nvidia
    if not (dev / "kfd").exists():
        return 0
    try:
        return sum(1 for p in (dev / "dri").iterdir() if _RENDER.fullmatch(p.name))
    except OSError:
        return 0


def _no_apptainer() -> bool:
    return not (shutil.which("apptainer") or shutil.which("singularity"))


CONDITIONS = {
    "always": lambda: True,
    "no-gpu": lambda: host_gpus() == 0,
    "fewer-than-2-gpus": lambda: host_gpus() < 2,
    "no-apptainer": _no_apptainer,
}


class ListError(ValueError):
    """The expected-skips list cannot be read: ``file:line: what``."""


@dataclass(frozen=True)
class Expected:
    when: str
    test: str
    reason: re.Pattern[str]
    where: str  # file:line

    def covers(self, nodeid: str, reason: str) -> bool:
        return fnmatch.fnmatchcase(nodeid, self.test) and bool(self.reason.search(reason))


@dataclass(frozen=True)
class Skip:
    nodeid: str
    reason: str


def parse(path: Path) -> list[Expected]:
    """The entries of the list at ``path``; :class:`ListError` naming file:line when bad."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ListError(f"{path}: cannot read the expected skips: {exc.strerror}") from exc
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        where = f"{path}:{n}"
        parts = [p.strip() for p in body.split("|", 2)]
        if len(parts) != 3 or not all(parts):
            raise ListError(f"{where}: want 'WHEN | TEST | REASON', got {body!r}")
        when, test, reason = parts
        if when not in CONDITIONS:
            raise ListError(f"{where}: unknown WHEN {when!r} (one of {', '.join(CONDITIONS)})")
        try:
            pattern = re.compile(reason)
        except re.error as exc:
            raise ListError(f"{where}: REASON is not a regular expression: {exc}") from exc
        entries.append(Expected(when, test, pattern, where))
    return entries


def holding(entries: list[Expected]) -> list[Expected]:
    """The entries whose condition holds on this host."""
    return [e for e in entries if CONDITIONS[e.when]()]


def unexpected(skips: list[Skip], entries: list[Expected]) -> list[Skip]:
    """The skips no entry covers (``entries`` already filtered by :func:`holding`)."""
    return [s for s in skips if not any(e.covers(s.nodeid, s.reason) for e in entries)]


def reason_of(longrepr: object) -> str:
    """The reason of a skip report (pytest keeps ``(path, line, "Skipped: reason")``)."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    text = str(text)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def lines(found: list[Skip], path: Path) -> list[str]:
    """One line per unexpected skip, then what to do."""
    out = [f"unexpected skip: {s.nodeid}: {s.reason}" for s in found]
    out.append(f"{len(found)} skip(s) not in {path}: make the test run here, or add a "
               f"reviewed entry with its reason")
    return out


class Checker:
    """The pytest plugin ``tests/conftest.py`` registers for ``--expected-skips FILE``: records
    every skip, and at the end fails the session for each one the list does not cover."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.expected = holding(parse(path))
        self.skipped: list[Skip] = []
        self.found: list[Skip] = []

    def _record(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.append(Skip(report.nodeid, reason_of(report.longrepr)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """A run that passed (or collected nothing) fails; one that failed anyway stays so."""
        self.found = unexpected(self.skipped, self.expected)
        if self.found and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)  # last before the final counts, after -rs and durations
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.found:
            terminalreporter.section("unexpected skips", red=True)
            for line in lines(self.found, self.path):
                terminalreporter.write_line(line, red=True)


def add_option(parser: pytest.Parser) -> None:
    parser.addoption("--expected-skips", metavar="FILE", default=None,
                     help="fail the run for every skip this reviewed list does not name "
                          "(tests/expected-skips.txt; format in tests/support/skips.py)")


def configure(config: pytest.Config) -> None:
    """Register the :class:`Checker` when ``--expected-skips`` names a list; a list that cannot
    be read is a usage error naming file:line."""
    given = config.getoption("--expected-skips")
    if given:
        try:
            checker = Checker(Path(given))
        except ListError as exc:
            raise pytest.UsageError(str(exc)) from None
        config.pluginmanager.register(checker, "verl-env-expected-skips")
