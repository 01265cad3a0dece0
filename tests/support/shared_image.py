"""The CPU fixture image built once per whole run and handed to the other groups' engines.

``scripts/test.sh`` runs its groups side by side, each with an engine of its own, and three of
them (main, heavy, slurm) need the CPU fixture target built and gated: three identical builds
(about 125 CPU-seconds each, on a machine the run keeps busy). With ``VERL_ENV_TEST_SHARE=DIR``
the group named by ``VERL_ENV_TEST_SHARE_BUILDER`` builds it as before and then names its engine
and the image's content tag in DIR; every other group waits for that file, streams the image
from the builder's engine into its own (``docker save | docker load``: no copy of the 2 GB image
on the disk the groups share) and then runs the same ``build-env --target`` command as before,
which finds the content tag and **gates the image in that group's engine** before it tags it.
Only the build is shared: each group's image still passes its own gate, under its own verdict
records.

A builder whose build fails leaves a marker instead, and each waiting group then builds for
itself (so its own error is reported where it happens), as it does when the builder's engine
cannot send the image (gone with its group). Without the variables (a subset run, a bare
``pytest``) every group builds as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

SHARE_ENV = "VERL_ENV_TEST_SHARE"
BUILDER_ENV = "VERL_ENV_TEST_SHARE_BUILDER"
WAIT = 5400  # the builder's build under a whole run's load, with room to spare


def _group(config: pytest.Config) -> str:
    basetemp = config.getoption("basetemp", None)
    return Path(str(basetemp)).name if basetemp else ""


def _paths(name: str) -> tuple[Path, Path] | None:
    share = os.environ.get(SHARE_ENV)
    if not share:
        return None
    return Path(share) / f"{name}.ready", Path(share) / f"{name}.failed"


def is_builder(config: pytest.Config) -> bool:
    return _group(config) == os.environ.get(BUILDER_ENV, "")


def receive(config: pytest.Config, name: str, docker_host: str) -> str:
    """Before this group's build of ``name``: where another group builds it, wait for its image
    and load it into this group's engine. Returns what happened, for the test's output."""
    paths = _paths(name)
    if paths is None or is_builder(config) or not os.environ.get(BUILDER_ENV):
        return "built here"
    ready, failed = paths
    builder = os.environ[BUILDER_ENV]
    deadline = time.monotonic() + WAIT
    while not ready.exists():
        if failed.exists():
            return f"built here (the {builder} group's build failed)"
        if time.monotonic() > deadline:
            return f"built here (no image from the {builder} group in {WAIT} s)"
        time.sleep(2)
    offered = json.loads(ready.read_text())  # whole: the builder renames it into place
    save = subprocess.Popen(["docker", "-H", offered["host"], "save", offered["tag"]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert save.stdout is not None
    load = subprocess.run(["docker", "-H", docker_host, "load", "-q"], stdin=save.stdout,
                          capture_output=True, text=True)
    save.stdout.close()
    sent = save.wait()
    said = save.stderr.read().decode(errors="replace").strip() if save.stderr else ""
    if sent != 0:
        return f"built here (the {builder} group's engine could not send it: {said})"
    if load.returncode != 0:
        pytest.fail(f"docker load of the {name} image the {builder} group built failed: "
                    f"{load.stderr.strip()}", pytrace=False)
    return f"built by the {builder} group, loaded, gated here"


def offer(config: pytest.Config, name: str, docker_host: str, report: dict | None) -> None:
    """After the builder group's build of ``name``: name its engine and the image's content tag
    for the other groups, or leave the failure marker. Written whole, then renamed."""
    paths = _paths(name)
    if paths is None or not is_builder(config):
        return
    ready, failed = paths
    ready.parent.mkdir(parents=True, exist_ok=True)
    tag = None
    if report and report.get("result") == "pass":
        suffix = str(report.get("content_hash", ""))[7:19]  # the content tag ends with it
        tag = next((t for t in report.get("tags") or [] if suffix and t.endswith(suffix)), None)
    if tag is None:
        failed.write_text("the builder's build did not pass\n")
        return
    part = ready.with_suffix(".part")
    part.write_text(json.dumps({"host": docker_host, "tag": tag}))
    os.replace(part, ready)
