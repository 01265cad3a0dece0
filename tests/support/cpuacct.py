"""Where a test group's CPU goes, test by test: the group in a cgroup of its own.

With ``VERL_ENV_TEST_CPU=DIR`` (``scripts/test.sh`` sets it for a whole run), the pytest process
of a group moves itself into a CPU-accounting cgroup of its own before any test starts. Every
process it starts inherits it: the engines, the registries, the Slurm daemons and their job
steps, and, through dockerd's ``--cgroup-parent`` (:data:`PARENT_ENV`, read by
``tests/support/dockerd.py``), the containers and build steps of its engines, which dockerd
would otherwise account at the top of the hierarchy. Each test's setup, call and teardown is
charged with what the group's cgroup used over that time (a session fixture's work goes to the
first test that needs it, as pytest's durations do), and ``DIR/GROUP.json`` holds the group's
total and every test's figures at the end. Groups running side by side do not bleed into each
other: each cgroup counts only its own processes, whatever the machine's load.

Where no cgroup can be made (not root, no cpuacct hierarchy), nothing is measured and the run
goes on as before; the figures are for docs/testing.md (``scripts/slowest.py``), never asserted.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CPU_ENV = "VERL_ENV_TEST_CPU"
PARENT_ENV = "VERL_ENV_TEST_CGROUP_PARENT"


class Cgroup:
    """One cgroup under a cpuacct (v1) or unified (v2) hierarchy, by its path from the root."""

    def __init__(self, root: Path, rel: str, v2: bool) -> None:
        self.root, self.rel, self.v2 = root, rel, v2
        self.path = root / rel.lstrip("/")

    def usage(self) -> float:
        """CPU seconds used by the cgroup and all below it."""
        if self.v2:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return 0.0
        return int((self.path / "cpuacct.usage").read_text()) / 1e9


def _hierarchy() -> tuple[Path, bool] | None:
    """The cpuacct v1 mount, else the unified v2 mount of a pure-v2 host."""
    v2 = None
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup" and "cpuacct" in fields[3].split(","):
            return Path(fields[1]), False
        if fields[2] == "cgroup2":
            v2 = Path(fields[1])
    if v2 is not None and (v2 / "cgroup.controllers").is_file() \
            and (v2 / "cgroup.procs").is_file():
        return v2, True
    return None


def _own(v2: bool) -> str:
    """This process's cgroup path in the hierarchy (to return to at the end)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v2 and controllers == "") or (not v2 and "cpuacct" in controllers.split(",")):
            return path
    return "/"


def enter(group: str) -> tuple[Cgroup, str] | None:
    """Make ``/verl-env-test/GROUP-PID`` and move this process into it; None where it cannot."""
    found = _hierarchy()
    if found is None:
        return None
    root, v2 = found
    home = _own(v2)
    cg = Cgroup(root, f"/verl-env-test/{group}-{os.getpid()}", v2)
    try:
        cg.path.mkdir(parents=True, exist_ok=True)
        (cg.path / "cgroup.procs").write_text(str(os.getpid()))
        cg.usage()
    except OSError:
        return None
    return cg, home


def leave(cg: Cgroup, home: str) -> None:
    """Back to the cgroup this process came from; remove the group's cgroups that are empty."""
    try:
        (cg.root / home.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return
    # under v1 dockerd's runc made the same path in every hierarchy, not only cpuacct's, and in
    # the unified (v2) one of a hybrid host too
    roots = [cg.root] if cg.v2 else [Path(f.split()[1]) for f in Path("/proc/mounts").read_text(
        ).splitlines() if f.split()[2:3] in (["cgroup"], ["cgroup2"])]
    for root in roots:
        top = root / cg.rel.lstrip("/")
        below = sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True)
        for path in [*below, top, top.parent]:  # the parent: when no other group is in it
            try:
                path.rmdir()
            except OSError:
                pass


class Recorder:
    """The pytest plugin: each test phase charged with the group cgroup's CPU."""

    def __init__(self, out: Path, group: str, cg: Cgroup, home: str) -> None:
        self.out, self.group, self.cg, self.home = out, group, cg, home
        self.start_cpu, self.start_wall = cg.usage(), time.monotonic()
        self.rows: list[dict[str, object]] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        yield from self._charge(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        yield from self._charge(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        yield from self._charge(item, "teardown")

    def _charge(self, item: pytest.Item, when: str) -> Iterator[None]:
        cpu, wall = self.cg.usage(), time.monotonic()
        yield
        used = self.cg.usage() - cpu
        if used >= 0.05:
            self.rows.append({"nodeid": item.nodeid, "when": when, "cpu_s": round(used, 2),
                              "wall_s": round(time.monotonic() - wall, 2)})

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        total = {"group": self.group, "cpu_s": round(self.cg.usage() - self.start_cpu, 1),
                 "wall_s": round(time.monotonic() - self.start_wall, 1),
                 "cgroup": self.cg.rel, "tests": self.rows}
        leave(self.cg, self.home)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / f"{self.group}.json").write_text(json.dumps(total, indent=1) + "\n")
        except OSError:
            pass


def configure(config: pytest.Config) -> None:
    """Register the recorder when ``VERL_ENV_TEST_CPU`` names a directory and a cgroup can be
    made; the group is named by the last part of ``--basetemp`` (as scripts/test.sh runs them)."""
    # a pytest that a test starts (tests/suite) measures nothing of its own: its CPU stays the
    # group's, in the group's cgroup, and it writes no figures over the group's
    out = os.environ.pop(CPU_ENV, None)
    if not out or hasattr(config, "workerinput"):
        return
    basetemp = config.getoption("basetemp", None)
    group = Path(str(basetemp)).name if basetemp else "session"
    entered = enter(group)
    if entered is None:
        return
    cg, home = entered
    os.environ[PARENT_ENV] = f"{cg.rel}/docker"
    config.pluginmanager.register(Recorder(Path(out), group, cg, home), "verl-env-cpuacct")
