"""The matrix's fields read one by one, each held to its grammar (builder.matrix.grammar): a
package pin, its source and prebuilt wheels, the base image. Every error names file:line:key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder import yamldoc
from builder.errors import SpecError
from builder.matrix import grammar
from builder.matrix.model import Base, Package, Source

GLIBC_FLOOR = Version("2.34")
# How a git source may be fetched (by the build host, at render time: builder.resolve.sources).
GIT_SCHEMES = ("git+https://", "git+ssh://", "git+git://", "git+file://")
# A distribution name (PEP 508 names), an extra, an importable module, a base's interpreter.
_DIST_NAME = re.compile(r"[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9]", re.ASCII)
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)
_INTERPRETER = re.compile(r"[A-Za-z0-9_./+-]+", re.ASCII)
PYTHON = re.compile(r"[0-9]+\.[0-9]+", re.ASCII)


class Ctx:
    """The file being read, the line of every key, and where a key a target reads was written
    (``written``: a key prefix as the target reads it -> (the key the file has it under, a note
    for the message)): a value inherited from ``defaults:`` or taken from a stack layer is
    named, in errors, by the key the user wrote and that key's line."""

    def __init__(self, file: str, lines: dict[str, int]) -> None:
        self.file, self.lines = file, lines
        self.written: dict[str, tuple[str, str]] = {}

    def where(self, key: str) -> tuple[str, str]:
        """(``key`` as written in the file, the note that says why it differs; '' if not)."""
        best = max((p for p in self.written if key == p or key.startswith((p + ".", p + "["))),
                   key=len, default=None)
        if best is None:
            return key, ""
        written, note = self.written[best]
        return written + key[len(best):], note

    def error(self, key: str, message: str, target: str | None = None,
              line: int | None = None) -> SpecError:
        written, note = self.where(key)
        # a key is shown on one line: a control character or separator in it is escaped
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in written)
        found = self.line(written) if written != key else None
        return SpecError(f"{message} ({note})" if note else message, file=self.file,
                         line=found or self.line(key) or line, key=shown or None, target=target)

    def maker(self, target: str | None = None) -> yamldoc.ErrorMaker:
        """An error maker for :func:`builder.yamldoc.validate` that names keys as written."""
        def make(message: str, *, file: str, line: int | None = None,
                 key: str | None = None) -> SpecError:
            del file  # this context's own
            return self.error(key or "", message, target, line)
        return make

    def line(self, key: str) -> int | None:
        """The line of ``key``, else of the nearest key above it (a list item of a default)."""
        return yamldoc.Doc(self.file, None, self.lines).line(key)

    def mapping(self, value: Any, key: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping, got {type(value).__name__}")
        for k in value:
            if k not in allowed:
                sub = f"{key}.{k}" if key else str(k)
                raise self.error(sub, f"unknown key {k!r} (allowed: {', '.join(sorted(allowed))})")
        return value

    def string(self, value: Any, key: str) -> str:
        if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
            raise self.error(key, f"expected a string, got {value!r}")
        if isinstance(value, float):
            # YAML reads 3.10 as 3.1: refuse rather than silently mangle a version.
            raise self.error(key, f"write versions as quoted strings (got the number {value!r})")
        return str(value)

    def checked(self, check: Any, value: Any, key: str, *args: Any) -> str:
        """``value`` as a string fitting ``check`` (a :mod:`builder.matrix.grammar` function), else a
        SpecError naming file:line:key and what the grammar expects."""
        text = self.string(value, key)
        try:
            return check(text, *args)
        except grammar.GrammarError as exc:
            raise self.error(key, str(exc)) from None

    def matching(self, pattern: re.Pattern[str], value: Any, key: str, what: str) -> str:
        """``value`` as a string that ``pattern`` matches whole, else a SpecError."""
        text = self.checked(grammar.plain, value, key)
        if not pattern.fullmatch(text):
            raise self.error(key, f"{text!r} is not {what}")
        return text

    def version(self, value: Any, key: str) -> str:
        text = self.string(value, key)
        try:
            return str(Version(grammar.pep440_version(text)))
        except (grammar.GrammarError, InvalidVersion):
            raise self.error(key, f"invalid version {text!r} (PEP 440)") from None


def _package(ctx: Ctx, name: str, value: Any, key: str) -> Package:
    ctx.matching(_DIST_NAME, name, key, "a distribution name (PEP 508: letters, digits, "
                 "'.', '_', '-', starting and ending with a letter or digit)")
    if isinstance(value, dict):
        # its shape (keys, types, build's kinds) is matrix.schema.json's, checked before
        extras = value.get("extras", [])
        for i, e in enumerate(extras):
            ctx.matching(_DIST_NAME, e, f"{key}.extras[{i}]", "an extra name (PEP 508)")
        if "import" in value:
            ctx.matching(_MODULE, value["import"], f"{key}.import", "a module name (dotted "
                         "Python identifiers)")
        build = value.get("build", "wheel")
        enabled = value.get("enabled", True)
        source = _source(ctx, value["source"], f"{key}.source") if value.get("source") else None
        if source and build != "source":
            raise ctx.error(f"{key}.source", "a source location needs build: source")
        prebuilt = _prebuilt(ctx, value.get("prebuilt", []), f"{key}.prebuilt")
        if prebuilt and build != "source":
            raise ctx.error(f"{key}.prebuilt", "prebuilt wheels are tried before a source build: "
                            "they need build: source (what a miss builds)")
        return Package(canonicalize_name(name), ctx.version(value["version"], f"{key}.version"),
                       tuple(sorted(canonicalize_name(e) for e in extras)), build, enabled,
                       str(value.get("import", "")), ctx.lines.get(key), source, prebuilt)
    if value is None:
        raise ctx.error(key, f"missing pin: {name} has no version")
    return Package(canonicalize_name(name), ctx.version(value, key), line=ctx.lines.get(key))


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _prebuilt(ctx: Ctx, value: Any, key: str) -> tuple[dict[str, str], ...]:
    """``[{url, sha256, python, arch} | {wheelhouse: DIR_OR_INDEX_URL}, ...]``; a relative
    wheelhouse directory is relative to the matrix file."""
    out = []
    for i, entry in enumerate(value):
        k = f"{key}[{i}]"
        if len({"url", "wheelhouse"} & set(entry)) != 1:
            raise ctx.error(k, "expected {url: WHEEL_URL, sha256: HEX, python: X.Y, arch: ARCH} "
                            "or {wheelhouse: DIR_OR_INDEX_URL}")
        if "wheelhouse" in entry:
            ctx.mapping(entry, k, {"wheelhouse"})
            where = ctx.checked(grammar.url if "://" in str(entry["wheelhouse"])
                                else grammar.path, entry["wheelhouse"], f"{k}.wheelhouse")
            if "://" not in where and not Path(where).is_absolute() and not ctx.file.startswith(
                    "--"):
                where = str((Path(ctx.file).parent / where).resolve())
            out.append({"wheelhouse": where})
            continue
        for req in ("sha256", "python", "arch"):
            if req not in entry:
                raise ctx.error(k, f"a prebuilt wheel url needs its {req}")
        sha = ctx.string(entry["sha256"], f"{k}.sha256").lower()
        if not _SHA256.fullmatch(sha):
            raise ctx.error(f"{k}.sha256", "expected 64 hex digits")
        arch = ctx.string(entry["arch"], f"{k}.arch")
        url = ctx.checked(grammar.url, entry["url"], f"{k}.url", ("https", "http", "file"))
        if not url.split("#")[0].endswith(".whl"):
            raise ctx.error(f"{k}.url", "expected the URL of a .whl file")
        python = ctx.matching(PYTHON, entry["python"], f"{k}.python", "a python version "
                              "MAJOR.MINOR")
        out.append({"url": url, "sha256": sha, "python": python, "arch": arch})
    return tuple(out)


def _source(ctx: Ctx, value: Any, key: str) -> Source:
    """``git+https://HOST/REPO@TAG``, a path string, ``{path: P[, sha256: H]}`` or
    ``{url: U, sha256: H}``; relative paths are relative to the matrix file."""
    if isinstance(value, str) and value.startswith("git+"):
        ctx.checked(grammar.url, value, key, tuple(s[:-3] for s in GIT_SCHEMES))
        rest = value.split("://", 1)[1] if "://" in value else ""
        ref = rest.rpartition("@")[2] if "@" in rest else ""
        if not value.startswith(GIT_SCHEMES) or not ref or "/" in ref:
            raise ctx.error(key, "expected git+https://HOST/REPO@TAG (or git+ssh://, git+git://, "
                            "git+file://), pinned to a commit by `build-env lock`")
        return Source("git", value)
    if isinstance(value, str):
        value = {"path": value}
    if len({"path", "url"} & set(value)) != 1:
        raise ctx.error(key, "expected git+https://HOST/REPO@TAG, {path: DIR_OR_ARCHIVE} or "
                        "{url: ARCHIVE_URL, sha256: HEX}")
    sha = str(value.get("sha256", "")).lower()
    if sha and not _SHA256.fullmatch(sha):
        raise ctx.error(f"{key}.sha256", "expected 64 hex digits")
    if "url" in value:
        url = ctx.checked(grammar.url, value["url"], f"{key}.url", ("https", "http", "file"))
        if not sha:
            raise ctx.error(f"{key}.sha256", "a source url needs its sha256")
        return Source("url", url, sha)
    raw = Path(ctx.checked(grammar.path, value["path"], f"{key}.path")).expanduser()
    where = raw if raw.is_absolute() or ctx.file.startswith("--") else (
        Path(ctx.file).parent / raw)
    if not where.exists():
        raise ctx.error(f"{key}.path", f"no such directory or archive: {where}")
    return Source("path", str(where.resolve()), sha, written=str(value["path"]))


def read_packages(ctx: Ctx, value: Any, key: str) -> tuple[Package, ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ctx.error(key, "expected a mapping of package name to version")
    return tuple(_package(ctx, str(n), v, f"{key}.{n}") for n, v in value.items())



def read_base(ctx: Ctx, t: dict[str, Any], key: str) -> Base:
    """The base image: every string against its grammar (an image reference, a digest, URLs);
    a digest named twice (in ``image`` and ``digest:``) must agree."""
    b = t["base"]  # its keys and their types: matrix.schema.json's, checked before
    digest = b.get("digest")
    if digest is not None and not (isinstance(digest, str) and digest.startswith("sha256:")
                                   and len(digest) == 71):
        raise ctx.error(f"{key}.base.digest", "expected sha256:<64 hex digits>")
    if digest is not None:
        ctx.checked(grammar.oci_digest, digest, f"{key}.base.digest")
    image = ctx.checked(grammar.oci_reference, b["image"], f"{key}.base.image")
    embedded = grammar.parse_oci_reference(image).digest
    if digest and embedded and digest != embedded:
        raise ctx.error(f"{key}.base.digest", f"the image names the digest {embedded} and "
                        f"digest: names {digest}: keep one")
    # the floor is vLLM's: its dependencies ship manylinux_2_34 wheels only
    glibc = ctx.version(b["glibc"], f"{key}.base.glibc") if "glibc" in b else None
    if glibc and Version(glibc) < GLIBC_FLOOR:
        raise ctx.error(f"{key}.base.glibc", f"glibc {glibc} is below {GLIBC_FLOOR}: the rollout "
                        "engine's dependencies need manylinux_2_34 wheels (llguidance, tilelang, "
                        "z3-solver)")
    vendor = ctx.string(b["vendor"], f"{key}.base.vendor") if "vendor" in b else None
    for k in ("interpreter", "sources"):
        if k in b and vendor != "declared":
            raise ctx.error(f"{key}.base.{k}", f"{k} is for a declared vendor base "
                            "(vendor: declared); a probed base records its own")
    sources = b.get("sources", [])
    for i, src in enumerate(sources):
        ctx.checked(grammar.plain, src, f"{key}.base.sources[{i}]")  # a citation: URL or title
    if vendor and not t.get("provided"):
        raise ctx.error(f"{key}.base.vendor", "a vendor base needs the packages it provides "
                        "under provided:")
    source_image = (ctx.checked(grammar.oci_reference, b["source_image"],
                                f"{key}.base.source_image") if "source_image" in b else None)
    interpreter = (ctx.matching(_INTERPRETER, b["interpreter"], f"{key}.base.interpreter",
                                "an interpreter (a command or path of letters, digits, ./+-_)")
                   if "interpreter" in b else None)
    bytecode_image = (ctx.checked(grammar.oci_reference, b["bytecode_image"],
                                  f"{key}.base.bytecode_image") if "bytecode_image" in b else None)
    if bytecode_image and vendor:
        raise ctx.error(f"{key}.base.bytecode_image", "a vendor base's packages are byte-compiled "
                        "by its own interpreter (bytecode_image is for the image's own venv)")
    return Base(image, digest, glibc, source_image, vendor, interpreter, tuple(sources),
                bytecode_image)
