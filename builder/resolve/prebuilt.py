"""Prebuilt first: a package built from source (flash-attn: an hour of nvcc) may name hashed
prebuilt wheels, and ``lock`` takes one that fits the target before it plans a source build.

A package's ``prebuilt:`` list holds, in order of preference:

* ``{url: URL, sha256: HEX, python: "3.12", arch: x86_64}``: one wheel, for one python and arch;
* ``{wheelhouse: DIR_OR_URL}``: a site's wheelhouse, a find-links directory (every ``*.whl`` in
  it, hashed here) or a PEP 503 simple index (``URL/NAME/``, each link's ``#sha256=``).

A wheel fits when it is the pinned version of the package (a local label such as
``+cu130torch2.11`` allowed when the pin has none), its python tag is the target's
CPython (``cp312``, or ``py3``/``abi3``), and its platform is the target's arch (``linux_`` or
a ``manylinux_X_Y`` no newer than the base's glibc). ``lock`` records the choice and why in
``locks/T.prebuilt.json``; a hit is installed from that hashed wheel (fetched by the build host
into the context, sha256-checked), a miss is built from source, and the record says what was
tried. ``list`` and the image's manifest carry the record.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import urllib.parse
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from builder.resolve import records
from builder.errors import LockError, NetworkError, RenderError
from builder.files import sha256_file
from builder.matrix.spec import Package, Target

PREBUILT_SCHEMA = "verl-env/prebuilt/v1"
FETCH_TIMEOUT = 120
WAY_OUT = ("a wheelhouse directory on this host (prebuilt: [{wheelhouse: DIR}]), or drop the "
           "prebuilt entry to build from source")


@dataclass(frozen=True)
class Candidate:
    filename: str
    url: str  # http(s)://, file://, or a local path
    sha256: str  # hex, "" until known


def record_path(lock: Path) -> Path:
    return lock.with_name(lock.stem + ".prebuilt.json")


def with_prebuilt(target: Target) -> list[Package]:
    return [p for p in target.enabled_packages if p.build == "source" and p.prebuilt]


def fits(filename: str, p: Package, target: Target) -> str | None:
    """None when the wheel fits the target; else why not."""
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return "not a wheel file name"
    pin = Version(p.version)
    # a local label (2.8.3+cu130torch2.11: flash-attn's own wheels) is the pinned release when
    # the pin has none, as the gate holds it (versions.pin)
    if canonicalize_name(name) != p.name or (version != pin and (
            pin.local is not None or Version(version.public) != pin)):
        return f"{name} {version}, not {p.name} {p.version}"
    cp = "cp" + target.python.replace(".", "")
    glibc = Version(target.base.glibc or "2.34")
    for tag in tags:
        if tag.interpreter not in (cp, "py3") and not (tag.abi == "abi3"
                                                       and tag.interpreter.startswith("cp3")):
            continue
        plat = tag.platform
        if plat == f"linux_{target.arch}" or plat == "any":
            return None
        m = re.fullmatch(rf"manylinux_(\d+)_(\d+)_{target.arch}", plat)
        if m and Version(f"{m.group(1)}.{m.group(2)}") <= glibc:
            return None
        if plat == f"manylinux2014_{target.arch}":
            return None
    shown = ", ".join(sorted({f"{t.interpreter}-{t.platform}" for t in tags}))
    return f"built for {shown}, the target is {cp} on {target.arch} (glibc {glibc})"


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def _candidates(entry: dict[str, str], p: Package) -> list[Candidate]:
    """The wheels a wheelhouse offers for ``p`` (directory or PEP 503 index)."""
    where = entry["wheelhouse"]
    if "://" not in where or where.startswith("file://"):
        d = Path(urllib.parse.urlparse(where).path if where.startswith("file://") else where)
        if not d.is_dir():
            raise LockError(f"{p.name}: wheelhouse {where} is not a directory")
        return [Candidate(w.name, str(w), "") for w in sorted(d.glob("*.whl"))]
    page = where.rstrip("/") + f"/{p.name}/"
    try:
        with _urlopen(page) as r:
            html = r.read().decode("utf-8", "replace")
    except OSError as exc:
        raise NetworkError(page, f"{p.name}'s wheelhouse: {_why(exc)}",
                           way_out=WAY_OUT) from None
    parser = _Links()
    parser.feed(html)
    out = []
    for href in parser.links:
        url, _, frag = urllib.parse.urljoin(page, href).partition("#")
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        if name.endswith(".whl"):
            sha = frag[len("sha256="):] if frag.startswith("sha256=") else ""
            out.append(Candidate(name, url, sha))
    return out


def _sha256_of(c: Candidate) -> str:
    if "://" not in c.url:
        return sha256_file(Path(c.url)).split(":", 1)[1]
    h = hashlib.sha256()
    try:
        with _urlopen(c.url) as r:
            for chunk in iter(lambda: r.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise NetworkError(c.url, f"the prebuilt wheel: {_why(exc)}", way_out=WAY_OUT) from None
    return h.hexdigest()


def _urlopen(url: str) -> Any:
    """``url`` opened for reading, bounded by :data:`FETCH_TIMEOUT`."""
    import urllib.request  # lazy: only a fetch needs it (http.client, ssl), not `build-env check`
    return urllib.request.urlopen(url, timeout=FETCH_TIMEOUT)


def _why(exc: OSError) -> str:
    """One line for a failed fetch (a timeout names the bound)."""
    if isinstance(exc, TimeoutError) or "timed out" in str(exc):
        return f"no answer within {FETCH_TIMEOUT:g} s"
    return str(getattr(exc, "reason", None) or exc).splitlines()[0]


def choose(p: Package, target: Target) -> dict[str, Any]:
    """The record entry for ``p``: the first fitting hashed wheel, or a source build and why."""
    tried: list[str] = []
    for i, entry in enumerate(p.prebuilt):
        if "url" in entry:
            if entry["python"] != target.python or entry["arch"] != target.arch:
                tried.append(f"prebuilt[{i}] is for python {entry['python']} on "
                             f"{entry['arch']}")
                continue
            name = urllib.parse.unquote(entry["url"].split("#")[0].rsplit("/", 1)[-1])
            why = fits(name, p, target)
            if why:
                tried.append(f"prebuilt[{i}] {name}: {why}")
                continue
            return {"choice": "wheel", "filename": name, "url": entry["url"],
                    "sha256": entry["sha256"],
                    "why": f"prebuilt[{i}]: {name} fits python {target.python} on {target.arch}"}
        offered = _candidates(entry, p)
        mine = [c for c in offered if fits(c.filename, p, target) is None]
        if not mine:
            near = [c.filename for c in offered if c.filename.replace("_", "-").lower()
                    .startswith(p.name.replace("_", "-"))]
            tried.append(f"prebuilt[{i}] wheelhouse {entry['wheelhouse']}: no wheel of "
                         f"{p.name} {p.version} for cp{target.python.replace('.', '')} on "
                         f"{target.arch} among {len(near)} of the package"
                         + (f" ({', '.join(near[:4])})" if near else ""))
            continue
        c = mine[0]
        sha = c.sha256 or _sha256_of(c)
        return {"choice": "wheel", "filename": c.filename, "url": c.url, "sha256": sha,
                "why": f"prebuilt[{i}]: {c.filename} from the wheelhouse "
                       f"{entry['wheelhouse']} fits python {target.python} on {target.arch}"
                       + ("" if c.sha256 else " (hashed at lock time)")}
    return {"choice": "source", "why": "no prebuilt wheel fits: " + "; ".join(tried)}


def entries_hash(p: Package) -> str:
    """Over the package's version and ``prebuilt:`` entries: a record made from other entries
    is stale."""
    blob = json.dumps([p.version, list(p.prebuilt)], sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def lock_prebuilt(target: Target) -> dict[str, dict[str, Any]]:
    """Each package with ``prebuilt:`` decided: a hashed wheel, or a source build and why."""
    return {p.name: {**choose(p, target), "entries": entries_hash(p)}
            for p in with_prebuilt(target)}


def write_record(lock: Path, record: dict[str, dict[str, Any]]) -> None:
    records.write_packages(record_path(lock), PREBUILT_SCHEMA, record)


def load_record(lock: Path | None) -> dict[str, dict[str, Any]]:
    return {} if lock is None else records.read_packages(record_path(lock), PREBUILT_SCHEMA,
                                                           "prebuilt")


def record_problem(target: Target, lock: Path) -> str | None:
    """Why the prebuilt record does not answer for the target's packages (None: it does)."""
    try:
        record = load_record(lock)
    except LockError as exc:
        return str(exc)
    stale = sorted({p.name for p in with_prebuilt(target)
                    if record.get(p.name, {}).get("entries") != entries_hash(p)}
                   | (set(record) - {p.name for p in with_prebuilt(target)}))
    if stale:
        return (f"{record_path(lock)} has not decided prebuilt-or-source for the matrix's "
                f"{', '.join(stale)}: run `build-env lock --target {target.name}`")
    return None


def wheels(target: Target, lock: Path | None) -> dict[str, dict[str, Any]]:
    """The packages ``lock`` chose a prebuilt wheel for (name -> record entry)."""
    record = load_record(lock)
    return {p.name: record[p.name] for p in with_prebuilt(target)
            if record.get(p.name, {}).get("choice") == "wheel"}


def fetch(target: Target, entry: dict[str, Any], dest: Path) -> Path:
    """The chosen wheel into ``dest`` (the context's ``wheels/``), its sha256 checked."""
    out = dest / entry["filename"]
    url = entry["url"]
    try:
        if "://" not in url:
            shutil.copyfile(url, out)
        else:
            with _urlopen(url) as r, open(out, "wb") as f:
                shutil.copyfileobj(r, f)
    except OSError as exc:
        if "://" not in url:
            raise RenderError(f"cannot copy the prebuilt wheel {url}: {exc}",
                              target=target.name) from None
        raise NetworkError(url, f"the prebuilt wheel: {_why(exc)}", way_out=WAY_OUT,
                           target=target.name) from None
    got = sha256_file(out).split(":", 1)[1]
    if got != entry["sha256"]:
        raise RenderError(f"the prebuilt wheel {url} has sha256 {got}, the lock recorded "
                          f"{entry['sha256']}", target=target.name)
    return out
