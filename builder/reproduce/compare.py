"""Two images' file trees compared (pure): every path present in one and not the other, and every
path whose type, mode, owner, size, content digest, link target or device differs. The paths of
:data:`builder.reproduce.ignored.IGNORED` are not compared (each has its reason).

:func:`root_digest` is one SHA-256 over a tree's entries (sorted, canonical lines, ignored paths
left out): what the verdict records (:class:`builder.gate.record.FileTreeRecord`), so an image
pulled later can be checked against it without a rebuild.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from builder.engine.filetree import FileEntry
from builder.reproduce.ignored import IGNORED

TREE_SCHEMA = "verl-env/filetree/v1"
# what is compared, in the order a difference names them
FIELDS = (("type", "kind"), ("mode", "mode"), ("owner", "owner"), ("size", "size"),
          ("digest", "digest"), ("link", "link"), ("device", "device"))


def ignored_reason(path: str, patterns: Sequence[tuple[str, str]] = IGNORED) -> str | None:
    """Why ``path`` is not compared (None: it is)."""
    for pattern, reason in patterns:
        if pattern.endswith("/**"):
            if path.startswith(pattern[:-2]):
                return reason
        elif fnmatch.fnmatchcase(path, pattern):
            return reason
    return None


def compared(entries: Iterable[FileEntry],
             patterns: Sequence[tuple[str, str]] = IGNORED) -> dict[str, FileEntry]:
    """The entries that are compared, by path."""
    return {e.path: e for e in entries if ignored_reason(e.path, patterns) is None}


def _value(entry: FileEntry, attr: str) -> Any:
    if attr == "owner":
        return f"{entry.uid}:{entry.gid}"
    if attr == "mode":
        return f"{entry.mode:04o}"
    return getattr(entry, attr)


@dataclass(frozen=True)
class Difference:
    """One path that differs: ``what`` names each field, ``original -> rebuilt``; a path only
    one tree has says so."""

    path: str
    what: tuple[str, ...]

    def line(self) -> str:
        return f"{self.path}: " + "; ".join(self.what)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "differs": list(self.what)}


@dataclass(frozen=True)
class Comparison:
    """The result: ``files`` compared paths (the union of both trees), and the differences."""

    files: int
    differences: tuple[Difference, ...] = ()
    config: tuple[Difference, ...] = field(default_factory=tuple)

    @property
    def identical(self) -> bool:
        return not self.differences and not self.config

    def lines(self) -> list[str]:
        if self.identical:
            return [f"identical ({self.files} files)"]
        out = [d.line() for d in self.differences] + [d.line() for d in self.config]
        n = len(self.differences)
        out.append(f"differs: {n} of {self.files} files"
                   + (f", {len(self.config)} image settings" if self.config else ""))
        return out


def _entry_diff(a: FileEntry, b: FileEntry) -> tuple[str, ...]:
    out = []
    for name, attr in FIELDS:
        va, vb = _value(a, attr), _value(b, attr)
        if va != vb:
            if name == "digest":
                out.append(f"content {str(va)[7:19]} -> {str(vb)[7:19]}")
            else:
                out.append(f"{name} {va} -> {vb}")
    return tuple(out)


def compare(original: Iterable[FileEntry], rebuilt: Iterable[FileEntry], *,
            patterns: Sequence[tuple[str, str]] = IGNORED,
            original_config: Mapping[str, Any] | None = None,
            rebuilt_config: Mapping[str, Any] | None = None) -> Comparison:
    """Compare the original image's tree with the rebuilt one's (and, when given, the settings
    of both images' configs: environment, entrypoint, command, user, working directory,
    labels)."""
    a, b = compared(original, patterns), compared(rebuilt, patterns)
    diffs = []
    for path in sorted(a.keys() | b.keys()):
        if path not in b:
            diffs.append(Difference(path, ("only in the original",)))
        elif path not in a:
            diffs.append(Difference(path, ("only in the rebuilt image",)))
        else:
            what = _entry_diff(a[path], b[path])
            if what:
                diffs.append(Difference(path, what))
    config = config_diff(original_config or {}, rebuilt_config or {})
    return Comparison(len(a.keys() | b.keys()), tuple(diffs), config)


CONFIG_KEYS = ("Env", "Entrypoint", "Cmd", "User", "WorkingDir", "Labels", "ExposedPorts",
               "Volumes", "StopSignal", "Shell")


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[Difference, ...]:
    """The image settings that differ (``config:Labels.KEY``, ``config:Env``...)."""
    out = []
    for key in CONFIG_KEYS:
        va, vb = a.get(key), b.get(key)
        if key == "Labels" and isinstance(va or {}, dict) and isinstance(vb or {}, dict):
            la, lb = va or {}, vb or {}
            for label in sorted(la.keys() | lb.keys()):
                if la.get(label) != lb.get(label):
                    out.append(Difference(f"config:Labels.{label}",
                                          (f"{la.get(label)!r} -> {lb.get(label)!r}",)))
        elif va != vb:
            out.append(Difference(f"config:{key}", (f"{va!r} -> {vb!r}",)))
    return tuple(out)


def canonical_line(entry: FileEntry) -> str:
    """One entry as the root digest hashes it."""
    return "\t".join([entry.path, entry.kind, f"{entry.mode:04o}", f"{entry.uid}:{entry.gid}",
                      str(entry.size), entry.digest or "-", entry.link or "-",
                      entry.device or "-"]) + "\n"


def root_digest(entries: Iterable[FileEntry],
                patterns: Sequence[tuple[str, str]] = IGNORED) -> str:
    """SHA-256 over the canonical lines of the compared entries, sorted by path."""
    h = hashlib.sha256(f"{TREE_SCHEMA}\n".encode())
    kept = compared(entries, patterns)
    for path in sorted(kept):
        h.update(canonical_line(kept[path]).encode("utf-8", "surrogateescape"))
    return "sha256:" + h.hexdigest()


def tree_document(entries: Sequence[FileEntry], *, image: str,
                  patterns: Sequence[tuple[str, str]] = IGNORED) -> dict[str, Any]:
    """The per-file list (``--tree PATH``): every compared entry, the root digest, and the
    ignored patterns with their reasons."""
    kept = compared(entries, patterns)
    return {"schema": TREE_SCHEMA, "image": image, "root": root_digest(entries, patterns),
            "files": len(kept),
            "ignored": [{"pattern": p, "reason": r} for p, r in patterns],
            "entries": [kept[p].to_dict() for p in sorted(kept)]}
