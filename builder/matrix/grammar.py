"""The grammar of every string that reaches a template (Dockerfile, sbatch script, shell line).

Each function returns its argument unchanged when it fits the grammar and otherwise raises
:class:`GrammarError` with one line saying what the grammar expects (the value shown with
``repr``, so a newline or U+2028 in it is visible and never breaks the line). Callers add where
the value came from (file:line:key, or the command-line option).

Pure: the standard library and ``packaging`` only.

Decisions, documented here and in docs/matrix.md:

* :func:`oci_reference` is the distribution reference grammar (the one ``docker pull`` parses):
  ``[domain[:port]/]path[:tag][@algorithm:hex]``, lower-case path components, a tag of at most
  128 word characters, a name of at most 255 characters; a ``sha256`` digest has exactly 64
  lower-case hex digits.
* :func:`debian_package` is a Debian policy 5.6.1 package name (``[a-z0-9][a-z0-9+.-]+``),
  optionally followed by ``:arch`` and then ``=version`` as ``apt-get install`` accepts them
  (``libnuma1:arm64=2.0.18-1``). A version is policy 5.6.12's ``[epoch:]upstream[-revision]``.
  apt's ``/release`` suffix and its ``+``/``-`` action suffixes are refused: a matrix pins a
  package, it does not ask apt to remove one.
* :func:`pep440_version` and :func:`pep508_requirement` parse with ``packaging`` and refuse the
  surrounding whitespace that ``packaging`` itself tolerates.
* :func:`url` needs a scheme from ``schemes``, a host, and only RFC 3986 characters (no space,
  quote, backslash, backtick, ``<>{}|^``).
* :func:`path` and :func:`plain` refuse control characters (Unicode Cc, which holds NUL, newline,
  carriage return and NEL), format characters (Cf: bidirectional overrides, zero-width marks) and
  the Unicode line and paragraph separators U+2028/U+2029.
"""

from __future__ import annotations

import re
import unicodedata
from typing import NamedTuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

__all__ = [
    "GrammarError", "OciReference", "debian_package", "env_name", "oci_digest", "oci_reference",
    "parse_oci_reference", "path", "pep440_version", "pep508_requirement", "plain", "url",
]


class GrammarError(ValueError):
    """A string does not fit its grammar; the message is one line."""


_SHOW = 60


def _show(s: object) -> str:
    text = repr(s)
    return text if len(text) <= _SHOW else text[:_SHOW - 4] + "...'"


def _string(s: object, what: str) -> str:
    if not isinstance(s, str):
        raise GrammarError(f"{_show(s)} is not {what}: expected a string, "
                           f"got {type(s).__name__}")
    return s


_BAD_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _bad_char(s: str) -> str | None:
    """The first control, format or line-separator character in ``s``, if any."""
    for ch in s:
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            return ch
    return None


def _refuse_bad_chars(s: str, what: str) -> None:
    ch = _bad_char(s)
    if ch is not None:
        raise GrammarError(f"{_show(s)} is not {what}: it holds the control or line-separator "
                           f"character U+{ord(ch):04X}")


# --- OCI / distribution reference -------------------------------------------------------------

_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEP}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = (rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
           r"(?::[0-9]+)?")
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?",
                        re.ASCII)
_DIGEST_RE = re.compile(_DIGEST, re.ASCII)
_HEX_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
_NAME_MAX = 255
_OCI_EXPECT = "an image reference: expected [registry[:port]/]name[:tag][@sha256:<64 hex>]"


class OciReference(NamedTuple):
    """The parts of an image reference: ``name`` (with its registry), ``tag`` and ``digest``
    (``None`` when absent)."""

    name: str
    tag: str | None
    digest: str | None


def _check_digest(s: str, digest: str, what: str) -> None:
    algorithm, _, hexpart = digest.partition(":")
    want = _HEX_LENGTHS.get(algorithm)
    if want is not None and not re.fullmatch(rf"[0-9a-f]{{{want}}}", hexpart):
        raise GrammarError(f"{_show(s)} is not {what}: expected {want} lower-case hex "
                           f"digits after {algorithm}:")


def parse_oci_reference(s: str) -> OciReference:
    """Split an image reference into name, tag and digest, or raise :class:`GrammarError`."""
    _string(s, "an image reference")
    m = _REFERENCE.fullmatch(s)
    if m is None:
        _refuse_bad_chars(s, "an image reference")
        raise GrammarError(f"{_show(s)} is not {_OCI_EXPECT}")
    if len(m["name"]) > _NAME_MAX:
        raise GrammarError(f"{_show(s)} is not an image reference: the name is longer than "
                           f"{_NAME_MAX} characters")
    if m["digest"]:
        _check_digest(s, m["digest"], "an image reference")
    return OciReference(m["name"], m["tag"], m["digest"])


def oci_reference(s: str) -> str:
    """``s`` if it is a distribution image reference (``name[:tag][@digest]``)."""
    parse_oci_reference(s)
    return s


def oci_digest(s: str) -> str:
    """``s`` if it is a content digest (``algorithm:hex``, ``sha256:`` + 64 lower-case hex)."""
    what = "an image digest"
    _string(s, what)
    if not _DIGEST_RE.fullmatch(s):
        _refuse_bad_chars(s, what)
        raise GrammarError(f"{_show(s)} is not {what}: expected sha256:<64 hex>")
    _check_digest(s, s, what)
    return s


# --- Debian package ---------------------------------------------------------------------------

_DEB_NAME = r"[a-z0-9][a-z0-9+.-]+"
_DEB_ARCH = r"[a-z0-9][a-z0-9-]*"
_DEB_VERSION = r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*"
_DEB_PACKAGE = re.compile(rf"{_DEB_NAME}(?::{_DEB_ARCH})?(?:={_DEB_VERSION})?", re.ASCII)


def debian_package(s: str) -> str:
    """``s`` if it is a Debian package name (policy 5.6.1), optionally ``:arch`` and
    ``=version`` as ``apt-get install`` accepts them."""
    what = "a Debian package"
    _string(s, what)
    if not _DEB_PACKAGE.fullmatch(s):
        _refuse_bad_chars(s, what)
        raise GrammarError(f"{_show(s)} is not {what}: expected a name [a-z0-9][a-z0-9+.-]+ "
                           f"(Debian policy 5.6.1), optionally :arch and =version")
    return s


# --- Python packaging -------------------------------------------------------------------------


def _no_outer_space(s: str, what: str) -> None:
    _refuse_bad_chars(s, what)
    if s != s.strip():
        raise GrammarError(f"{_show(s)} is not {what}: leading or trailing whitespace")


def pep440_version(s: str) -> str:
    """``s`` if it is a PEP 440 version (``2.11.0``, ``2.9.1.dev20251204+rocm7.0.2``)."""
    what = "a PEP 440 version"
    _string(s, what)
    _no_outer_space(s, what)
    try:
        Version(s)
    except InvalidVersion:
        raise GrammarError(f"{_show(s)} is not {what}: expected e.g. 2.11.0, 1.0rc1, "
                           f"2.9.1+cu130") from None
    return s


def pep508_requirement(s: str) -> str:
    """``s`` if it is a PEP 508 requirement (``name[extras] specifier ; marker`` or
    ``name @ url``)."""
    what = "a PEP 508 requirement"
    _string(s, what)
    _no_outer_space(s, what)
    try:
        Requirement(s)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "unparsable"
        raise GrammarError(f"{_show(s)} is not {what}: {reason}") from None
    return s


# --- URL, path, names, text -------------------------------------------------------------------

_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+", re.ASCII)
_URL_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):", re.ASCII)


def url(s: str, schemes: tuple[str, ...] = ("https", "http")) -> str:
    """``s`` if it is a URL with a scheme from ``schemes``, a host (except ``file:``), and only
    RFC 3986 characters."""
    want = "/".join(schemes)
    what = f"a {want} URL"
    _string(s, what)
    _refuse_bad_chars(s, what)
    if not _URL_CHARS.fullmatch(s):
        raise GrammarError(f"{_show(s)} is not {what}: it holds a character a URL cannot hold "
                           f"(space, quote, backslash, backtick, <>{{}}|^ or non-ASCII)")
    m = _URL_SCHEME.match(s)
    scheme = m.group(1).lower() if m else ""
    if scheme not in schemes:
        raise GrammarError(f"{_show(s)} is not {what}: expected a scheme of {want}")
    rest = s[m.end():] if m else s
    if not scheme.endswith("file") and not re.match(r"//[^/?#]+", rest):
        raise GrammarError(f"{_show(s)} is not {what}: expected {scheme}://HOST/...")
    return s


def path(s: str) -> str:
    """``s`` if it is a non-empty file-system path (relative or absolute) with no control
    characters (NUL, newline, NEL, ...) and no Unicode line separators."""
    what = "a path"
    _string(s, what)
    if not s:
        raise GrammarError("'' is not a path: expected a non-empty path")
    _refuse_bad_chars(s, what)
    return s


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def env_name(s: str) -> str:
    """``s`` if it is a POSIX environment variable name (``[A-Za-z_][A-Za-z0-9_]*``)."""
    what = "an environment variable name"
    _string(s, what)
    if not _ENV_NAME.fullmatch(s):
        raise GrammarError(f"{_show(s)} is not {what}: expected [A-Za-z_][A-Za-z0-9_]*")
    return s


def plain(s: str) -> str:
    """``s`` if it is printable single-line text: no control characters (Cc), no format
    characters (Cf), no Unicode line or paragraph separators. The empty string is plain."""
    _string(s, "plain text")
    _refuse_bad_chars(s, "plain single-line text")
    return s
