"""Allowance patterns: the matrix's reviewed ``abi_allow``, ``coverage_allow`` and
``record_shared`` keys, each a path pattern under the site directory -> the reason. Stdlib only
(the self-test's matcher; ``check`` refuses what :func:`problem` refuses, so a pattern the image
carries was held to the same rule).

A pattern is anchored to one package's files: its first path segment is a package directory,
named literally (``PKG/libname*.so``); a pattern of one segment names a file
at the top of the site directory exactly, with no wildcard
(``_module.abi3.so``). ``*``, ``?`` and ``[...]`` match within one
path segment, never across ``/`` (``pkg/lib/*.so`` matches ``pkg/lib/a.so``, not
``pkg/lib/x/a.so``); ``**`` is refused. The last segment must name files: one that only
matches by a shared-object suffix (``pkg/*.so``, ``pkg/lib/*.so.*``) would swallow every
object of the directory.

An allowance that excuses nothing in the image is stale: :func:`stale` names them, and the
phases report them (a warning; a failure under ``--strict``).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Iterable, Mapping

from ..report import FAIL, PASS, WARN, Check

WILDCARDS = "*?["
_CLASS = re.compile(r"\[[^\]]*\]")
_SUFFIX = re.compile(r"\.so(?=\.|$)|\.abi3|\.cpython")


def problem(pattern: str) -> str | None:
    """Why ``pattern`` may not be an allowance (None: it is anchored to one package's files)."""
    if pattern.startswith("/") or "\\" in pattern:
        return "a pattern is a path under the site directory, with '/' between its segments"
    segments = pattern.split("/")
    if any(s in ("", ".", "..") for s in segments):
        return "a pattern has no empty, '.' or '..' path segment"
    first = segments[0]
    if any(c in first for c in WILDCARDS):
        return (f"{pattern!r} could match files of any package: start the pattern with the "
                "package directory, named literally (e.g. PKG/libname*.so), "
                "or name a top-level file exactly")
    if "**" in pattern:
        return ("'**' is not supported: name each directory ('*' matches within one path "
                "segment, never across '/')")
    last = segments[-1]
    if len(segments) > 1 and not _names_files(last):
        return (f"{pattern!r} would match every shared object under {'/'.join(segments[:-1])}/: "
                "name the files (e.g. libname*.so)")
    return None


def _names_files(segment: str) -> bool:
    """Whether a last segment says something beyond wildcards and shared-object suffixes."""
    literal = _SUFFIX.sub("", _CLASS.sub("", segment))
    return literal.strip("*?.-_0123456789") != ""


def matches(pattern: str, path: str) -> bool:
    """Whether ``path`` (relative to the site directory, '/'-separated) is one of the files
    ``pattern`` names: as many segments, each matched by its own (``*`` stays in a segment)."""
    pat, parts = pattern.split("/"), path.split("/")
    return len(pat) == len(parts) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pat))


def reason(path: str, allow: Mapping[str, str]) -> str | None:
    """The reason of the first allowance (in sorted order) that names ``path``."""
    return next((why for pattern, why in sorted(allow.items()) if matches(pattern, path)), None)


def stale(allow: Mapping[str, str], excused: Iterable[str]) -> list[str]:
    """The allowances that name none of the ``excused`` paths (the files that would have
    failed without an allowance), sorted."""
    paths = list(excused)
    return sorted(p for p in allow if not any(matches(p, f) for f in paths))


def stale_text(key: str, patterns: list[str], what: str) -> str:
    """One line naming stale allowances, for a check's reason."""
    return (f"stale {key}: {', '.join(patterns)} excuse{'s' if len(patterns) == 1 else ''} "
            f"no {what} in this image (remove {'it' if len(patterns) == 1 else 'them'} from "
            "the matrix, or fix the pattern)")


def decide(cid: str, key: str, allow: Mapping[str, str], failing: Iterable[str], what: str,
           used: str, strict: bool, value: Mapping[str, Any] | None = None) -> Check | None:
    """The ``PHASE.allowances`` check of one allowance key: pass when every entry names one of
    the ``failing`` paths (those that would fail without it; ``used`` says what an entry
    excuses), else the stale entries named (``what`` they excuse none of): a warning, a failure
    under ``--strict``. None when the matrix allows nothing."""
    if not allow:
        return None
    phase = cid.split(".", 1)[0]
    old = stale(allow, failing)
    out = {"allowances": len(allow), "stale": old, **(value or {})}
    if old:
        return Check(cid, phase, FAIL if strict else WARN, value=out,
                     reason=stale_text(key, old, what) + (" (--strict)" if strict else ""))
    return Check(cid, phase, PASS, value=out,
                 reason=f"{key}: {len(allow)} of {len(allow)} entries excuse {used}")
