"""What a command imports before it does anything (issue 38: `build-env check` of the shipped
targets within 1 s, start-up included, scripts/bench-cli.py). The docker SDK and ``requests``
(with urllib3 under both) and the standard library's HTTP client (``urllib.request``) cost more
than a tenth of that and are needed only by the commands that meet an engine, a registry, the
package index or a wheelhouse: `check` without ``--online`` and ``--version`` import none of them.

Each case runs in a fresh interpreter, since this one has imported everything already.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MATRIX = str(REPO / "matrix.yaml")
HEAVY = ("docker", "requests", "urllib3", "http")

# main() in a fresh interpreter, its output swallowed; prints the heavy modules it imported
PROBE = """
import contextlib, io, sys
from builder.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # --version exits from argparse
        code = exc.code
print(code, sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r}))
"""


def imported_by(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=set(HEAVY)), *argv],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("argv", [("check", "--matrix", MATRIX), ("--version",)],
                         ids=["check", "version"])
def test_no_engine_or_http_client_at_start_up(argv: tuple[str, ...]) -> None:
    assert imported_by(*argv) == "0 []"


def test_the_probe_sees_what_a_command_imports() -> None:
    """The probe is not blind: importing the engine's names brings the docker SDK and
    ``requests`` in (so the cases above pass because check never imported them)."""
    proc = subprocess.run([sys.executable, "-c", "import sys; from builder.engine import Engine; "
                           f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted(HEAVY))


@pytest.mark.parametrize("module", ["builder.commands.lock", "builder.commands.check"])
def test_the_lock_and_check_commands_import_no_engine(module: str) -> None:
    """`lock` of unchanged inputs answers from the recorded inputs (goal 1 s): its module meets
    the engine only when a vendor base is probed (``--probe``), and imports it there."""
    proc = subprocess.run([sys.executable, "-c", f"import sys, {module}; "
                           f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
