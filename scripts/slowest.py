#!/usr/bin/env python3
"""Write each CI group's slowest tests, as pytest printed them, into docs/testing.md.

``scripts/test.sh`` calls it after a whole run with ``GROUP=LOG`` pairs: from each log it takes
pytest's ``slowest N durations`` block and its final summary line (passed, skipped, wall), and
replaces what stands between the two marker lines of docs/testing.md (written atomically; the
rest of the file is kept). A log without the block (a group that crashed) is named as such.

``--cpu DIR``: the groups' CPU as tests/support/cpuacct.py measured it (``DIR/GROUP.json``, each
group in a cgroup of its own, its engines' containers and build steps included): each group's
total and its 15 costliest tests by CPU seconds are written beside the wall-clock list.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BEGIN = "<!-- slowest: written by scripts/slowest.py after each whole run -->"
END = "<!-- slowest: end -->"
_DURATION = re.compile(r"^\s*\d+\.\d+s (call|setup|teardown)\s+\S")
# pytest's last line: "==== 12 passed, 1 skipped in 3.40s (0:00:03) ====" (undecorated under -q)
_SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error)[^=]* in [\d.]+s[^=]*?)\s*=*$")


def cpu_section(name: str, cpu_dir: Path | None) -> list[str]:
    """The group's CPU total and its 15 costliest test phases, from cpuacct's JSON."""
    if cpu_dir is None:
        return []
    try:
        data = json.loads((cpu_dir / f"{name}.json").read_text())
    except (OSError, ValueError):
        return ["(no CPU figures for this group: its cgroup could not be made or read)", ""]
    rows = sorted(data["tests"], key=lambda r: -r["cpu_s"])[:15]
    return [f"CPU: {data['cpu_s']:.0f} s in {data['wall_s']:.0f} s of wall (its cgroup: the "
            "tests, their engines' containers and build steps, its daemons); the 15 costliest:",
            "", "```", *(f"{r['cpu_s']:8.1f} cpu-s {r['wall_s']:8.1f} s {r['when']:<8} "
                         f"{r['nodeid']}" for r in rows), "```", ""]


def group_section(name: str, text: str) -> list[str]:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if "slowest" in ln and "durations" in ln), None)
    summary = next((m.group(1) for ln in reversed(lines) if (m := _SUMMARY.match(ln))), None)
    out = [f"**{name}**: {summary or 'no pytest summary in its log (the group did not finish)'}",
           ""]
    if start is None:
        return out + ["(no durations block in its log)", ""]
    rows = [ln.strip() for ln in lines[start + 1:] if _DURATION.match(ln)][:15]
    return out + ["```", *rows, "```", ""]


def render(groups: list[tuple[str, str]], head: str, cpu_dir: Path | None = None) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [BEGIN, "", f"Written by the whole run of {when} at {head}; each group's 15 slowest",
            "tests as pytest timed them (wall seconds, all groups running side by side).", ""]
    if cpu_dir is not None:
        body[-1:-1] = ["Below each, the group's CPU and its 15 costliest tests by CPU seconds",
                       "(its own cgroup: no other group's work is in it, though on a loaded "
                       "machine the same work",
                       "takes more CPU-seconds than on a quiet one)."]
    for name, text in groups:
        body += group_section(name, text) + cpu_section(name, cpu_dir)
    return "\n".join([*body, END])


def main(argv: list[str]) -> int:
    doc = Path(__file__).resolve().parents[1] / "docs" / "testing.md"
    cpu_dir = None
    if argv[:1] == ["--cpu"] and len(argv) > 1:
        cpu_dir, argv = Path(argv[1]), argv[2:]
    groups = []
    for pair in argv:
        name, _, path = pair.partition("=")
        try:
            groups.append((name, Path(path).read_text(errors="replace")))
        except OSError as exc:
            groups.append((name, f"(log unreadable: {exc.strerror})"))
    head = subprocess.run(["git", "-C", str(doc.parent), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "an unknown commit"
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        print(f"slowest.py: {doc}: the marker lines are missing; nothing written", file=sys.stderr)
        return 1
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    new = before + render(groups, head, cpu_dir) + after
    fd, tmp = tempfile.mkstemp(dir=doc.parent, prefix=".testing.", suffix=".part")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
