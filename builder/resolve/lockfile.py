"""A lock is what ``build-env lock`` wrote: its header records what its body was, so an edit
after the fact is found without resolving again.

``build-env lock`` writes, between the input hash and the ``regenerate`` line:

    # body-sha256: sha256:HEX          (over every byte after the header)
    # entries: NAME:D NAME:D ...       (D: 12 hex of sha256 over one entry's requirement and hashes)

``check --locked`` and ``render`` read a lock through :func:`problems`, which names what no
longer matches: a requirement line without a hash (file:line), a hash that is not a sha256, an
entry whose hashes differ from the ones recorded (edited), an entry the header lists but the body
lacks (a removed line), one it has but the header does not list (an added line), and a package
that other entries name in their ``# via`` but that has no line. Matrix pins (present, at their
version) are checked by the caller with :func:`pin_problems`.

The digests guard against edits, merges and truncation, not an adversary who recomputes them:
the review of the lock's diff and the gate inside the image do that.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

BODY_KEY = "# body-sha256: "
# Header lines the body digest covers as well (a lock resolved with a reviewed override,
# builder.matrix.overrides.LOCK_KEY: the same text): editing one is an edit of what was resolved.
COVERED_KEY = "# override: "
ENTRIES_KEY = "# entries: "
_REGENERATE = "# regenerate: "
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s\\]+)\s*(\\)?$")
_HASH = re.compile(r"^    --hash=(\S+?)\s*(\\)?$")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
# "# via -r requirements.in", "-c constraints.txt", "--override overrides.txt"
_NOT_PACKAGES = ("-r ", "-c ", "--override ")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Entry:
    """One locked requirement as it stands in the file: its line number, its hashes (with
    theirs) and the packages its ``# via`` names."""

    name: str
    extras: str  # "[email]": uv writes a package once per set of extras asked for
    version: str
    line: int
    text: str  # the requirement line and its hash lines, as written
    hashes: tuple[tuple[int, str], ...]
    via: tuple[str, ...]

    @property
    def key(self) -> str:
        return self.name + self.extras

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]


def split(text: str) -> tuple[str, str, int]:
    """(header, body, the body's first line number): the header runs to its ``# regenerate:``
    line (else over the leading comment lines)."""
    lines = text.splitlines(keepends=True)
    end = next((i + 1 for i, ln in enumerate(lines) if ln.startswith(_REGENERATE)), None)
    if end is None:
        end = next((i for i, ln in enumerate(lines) if not ln.startswith("#")), len(lines))
    return "".join(lines[:end]), "".join(lines[end:]), end + 1


def body_digest(body: str, covered: str = "") -> str:
    """sha256 over the covered header lines (none: the body alone) and the body."""
    return "sha256:" + hashlib.sha256((covered + body).encode()).hexdigest()


def covered_lines(header: str) -> str:
    """The header's lines that the body digest covers (``# override: ...``), in order."""
    return "".join(ln for ln in header.splitlines(keepends=True)
                   if ln.startswith(COVERED_KEY))


def parse(body: str, first: int = 1) -> tuple[list[Entry], list[tuple[int, int, str]]]:
    """The body's entries, and ``(first line, last line, the first one's text)`` for each run of
    lines that are neither a requirement, a hash of one, a ``# via`` note nor blank. Each body
    is read once per process (``check`` asks several times per lock); the lists are the
    caller's own."""
    entries, strays = _parse(body, first)
    return list(entries), list(strays)


@functools.lru_cache(maxsize=32)
def _parse(body: str, first: int) -> tuple[tuple[Entry, ...], tuple[tuple[int, int, str], ...]]:
    entries: list[Entry] = []
    strays: list[tuple[int, int, str]] = []
    current: dict | None = None
    in_via = False

    def flush() -> None:
        if current is not None:
            entries.append(Entry(current["name"], current["extras"], current["version"],
                                 current["line"],
                                 "".join(current["text"]), tuple(current["hashes"]),
                                 tuple(current["via"])))

    for n, raw in enumerate(body.splitlines(keepends=True), start=first):
        line = raw.rstrip("\n")
        req, hashed, stripped = _REQ.match(line), _HASH.match(line), line.strip()
        if req:
            flush()
            current = {"name": _canonical(req.group(1)),
                       "extras": (req.group(2) or "").replace(" ", ""),
                       "version": req.group(3), "line": n,
                       "text": [raw], "hashes": [], "via": []}
            in_via = False
        elif hashed and current is not None and not in_via:
            current["text"].append(raw)
            current["hashes"].append((n, hashed.group(1)))
        elif stripped.startswith("# via") and current is not None:
            in_via = True
            rest = stripped[len("# via"):].strip()
            current["via"] += [rest] if rest else []
        elif stripped.startswith("#   ") or (stripped.startswith("#") and in_via):
            if current is not None and stripped != "#":
                current["via"].append(stripped.lstrip("#").strip())
        elif stripped:
            if strays and strays[-1][1] == n - 1:  # one message per run of such lines
                strays[-1] = (strays[-1][0], n, strays[-1][2])
            else:
                strays.append((n, n, stripped[:60]))
    flush()
    return tuple(entries), tuple(strays)


def record(body: str, covered: str = "") -> str:
    """The header lines ``build-env lock`` writes for ``body`` (``covered``: the header lines
    written above them that the digest covers too)."""
    entries, _ = parse(body)
    return (f"{BODY_KEY}{body_digest(body, covered)}\n"
            f"{ENTRIES_KEY}{' '.join(f'{e.key}:{e.digest}' for e in entries)}\n")


def _recorded(header: str) -> tuple[str | None, dict[str, str] | None]:
    body = entries = None
    for line in header.splitlines():
        if line.startswith(BODY_KEY):
            body = line[len(BODY_KEY):].strip()
        elif line.startswith(ENTRIES_KEY):
            entries = dict(item.rpartition(":")[::2] for item in line[len(ENTRIES_KEY):].split())
    return body, entries


def problems(path: Path, text: str, regenerate: str) -> list[str]:
    """What in the lock at ``path`` is not what ``build-env lock`` wrote, each as
    ``path:line: message`` (``regenerate``: the command that writes it again)."""
    header, body, first = split(text)
    entries, strays = parse(body, first)
    out = [f"{path}:{a}{f'-{b}' if b > a else ''}: not a requirement, a hash of one or a "
           f"`# via` note: {text!r}" for a, b, text in strays]
    for e in entries:
        if not e.hashes:
            out.append(f"{path}:{e.line}: {e.name}=={e.version} has no --hash: every requirement "
                       "of a lock is pinned by hash")
        out += [f"{path}:{n}: {e.name}=={e.version}: {h!r} is not a sha256 hash"
                for n, h in e.hashes if not _SHA256.fullmatch(h)]
    digest, recorded = _recorded(header)
    covered = covered_lines(header)
    if digest is not None and recorded is not None and digest == body_digest(body, covered):
        return out
    if (covered and digest is not None and recorded is not None
            and all(recorded.get(e.key) == e.digest for e in entries)
            and set(recorded) == {e.key for e in entries}):
        out.append(f"{path}: its `# override:` lines are not the ones `build-env lock` wrote "
                   f"(the body digest covers them): run `{regenerate}`, or undo the edit")
        return out
    if digest is None or recorded is None:
        out.append(f"{path}: its header records no body digest (written before build-env "
                   f"recorded one, or the line was removed): run `{regenerate}`")
    else:
        out += _edits(path, entries, recorded)
    out += _unlisted(path, entries, skip=set(recorded or ()))
    if not out:
        out.append(f"{path}: its body is not the one `build-env lock` wrote (its "
                   f"body-sha256 differs): run `{regenerate}`, or undo the edit")
    return out


def _unlisted(path: Path, entries: list[Entry], skip: set[str]) -> list[str]:
    """Packages other entries name in their ``# via`` that have no line of their own (those in
    ``skip`` are named already)."""
    names = {e.name for e in entries}
    needed: dict[str, list[str]] = {}
    for e in entries:
        for v in e.via:
            if not v.startswith(_NOT_PACKAGES) and _canonical(v) not in names | skip:
                needed.setdefault(_canonical(v), []).append(e.name)
    return [f"{path}: {name} has no line, but {', '.join(sorted(by)[:3])}"
            f"{' and more' if len(by) > 3 else ''} name it in their `# via`: a removed entry"
            for name, by in sorted(needed.items())]


def _edits(path: Path, entries: list[Entry], recorded: Mapping[str, str]) -> list[str]:
    """The entries whose text differs from what the header recorded, or that it lacks or adds."""
    out = []
    found = {e.key: e for e in entries}
    for e in entries:
        if e.key not in recorded:
            out.append(f"{path}:{e.line}: {e.key}=={e.version} was added after the lock was "
                       "written")
        elif recorded[e.key] != e.digest:
            out.append(f"{path}:{e.line}-{e.line + len(e.hashes)}: {e.key}=={e.version}: its "
                       "requirement or --hash lines were edited after the lock was written")
    removed = [name for name in recorded if name not in found]
    if removed:
        out.append(f"{path}: {', '.join(removed)} {'was' if len(removed) == 1 else 'were'} "
                   "removed after the lock was written (the header lists, the body lacks)")
    return out


def pin_problems(path: Path, text: str, pins: Iterable[tuple[str, str]]) -> list[str]:
    """Every ``(name, version)`` the lock must pin (the matrix's, resolved from the index):
    present, at that version."""
    _, body, first = split(text)
    entries = {e.name: e for e in parse(body, first)[0]}
    out = []
    for name, version in pins:
        e = entries.get(_canonical(name))
        if e is None:
            out.append(f"{path}: the matrix pins {name}=={version}, the lock has no line for it")
        elif e.version != version:
            out.append(f"{path}:{e.line}: pins {name} {e.version}, the matrix {version}")
    return out
