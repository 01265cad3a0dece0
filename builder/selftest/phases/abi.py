"""ABI: will every shared object of the image's Python environment load? Needs no GPU and
imports nothing but the standard library: it reads the ELF files (:mod:`.elfdyn`), resolves
each ``DT_NEEDED`` library as the dynamic loader will (:mod:`.ldsearch`) in the process
``python`` builds after ``import torch`` (:mod:`.abimodel`), and checks every undefined
non-weak symbol a relocation names, with its version, against the symbols the libraries it
will see export.

What the image's packages load themselves (torch's CUDA preloads, a library a package loads
before its extension, alternatives of which it loads one, modules for another interpreter) is
:mod:`.abiload`'s; the matrix's reviewed ``abi_allow`` names objects that may not load (a system
library the image does not ship, for an optional path), each reported with its reason.

Checks: ``abi.scan`` (what was read, the loader's view, how long it took), ``abi.driver``
(the driver's libraries, ``libcuda.so.1`` and ``libnvidia-ml.so.1`` on cuda, the ROCm runtime
on rocm when the image does not ship it: resolved at run time by the driver, named, never
checked here), then one ``abi.<distribution>`` per distribution that owns shared objects:
fail naming the ``.so``, the symbol (demangled when the image has ``c++filt``) and the library
expected to provide it, a library the loader cannot find, or a version a library lacks.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from typing import Any

from ..elf import abiload
from ..manifest import PAYLOAD_LOADER_RULES, payload_file, read_payload
from . import allowpath, records
from ..elf.abimodel import Process, Unbound, bind, expected_provider, scope_name
from .coverage import UNOWNED, owners, shared_objects, site_dirs
from ..elf.elfdyn import SEP, DynInfo, relocated
from ..elf.elfread import DevcodeError, elf_header
from ..elf.ldsearch import Searcher, default_dirs, env_paths, load_cache
from ..phase import Run, Step
from ..report import FAIL, PASS, SKIP, WARN, Check

PHASE = "abi"
ET_DYN = 3
DRIVER_PREFIXES = ("cu", "nvml", "hip", "hsa", "amd", "drm", "__hip", "__cuda")
# The libraries the GPU driver brings into a container at run time (the NVIDIA container
# toolkit, apptainer --nv / --rocm), by family: an image must not ship them.
DRIVER_LIBS = {
    "cuda": ("libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so",
             "libnvidia-ptxjitcompiler.so.1", "libcudadebugger.so.1"),
    "rocm": ("libamdhip64.so.5", "libamdhip64.so.6", "libamdhip64.so.7",
             "libhsa-runtime64.so.1", "libdrm_amdgpu.so.1", "libdrm.so.2",
             "librocm_smi64.so.5", "librocm_smi64.so.6", "librocm_smi64.so.7"),
}
PAYLOAD = "self-test payload"
PAYLOAD_RULES = payload_file(PAYLOAD_LOADER_RULES)
FALLBACK_RULES = ("; the manifest carries no abi_loader rules (an image built before they "
                  "travelled with it, or not built by verl-env): the catalogue's rules shipped "
                  "with this self-test were used")
NO_LOADER_RULES = (
    "; the manifest carries no abi_loader rules (an image built before they travelled with it, "
    "or not built by verl-env): what packages load themselves (torch's CUDA preloads, a "
    "library loaded before an extension, alternatives of which one is taken) is not modelled, "
    "so an object that needs such a load may be reported as failing")
SHOWN = 8  # problems named in a check's reason (all of them are in its value)


@dataclass
class Problem:
    """One reason a shared object will not load."""

    library: str  # relative to its site directory
    kind: str  # symbol | missing | version | unreadable
    what: str  # the symbol (mangled), the library name, the version, or the error
    version: str | None = None
    expected: str | None = None
    expected_path: str | None = None
    demangled: str | None = None

    def text(self) -> str:
        """One line naming the .so, the symbol and the library."""
        if self.kind == "missing":
            return f"{self.library}: needs {self.what}, which the loader cannot find"
        if self.kind == "version":
            return (f"{self.library}: version {self.what} of {self.expected} not found "
                    f"({self.expected_path or 'not loaded'} does not define it)")
        if self.kind == "unreadable":
            return f"{self.library}: cannot be read: {self.what}"
        sym = self.demangled or self.what
        ver = f"@{self.version}" if self.version else ""
        raw = f" [{self.what}]" if self.demangled and self.demangled != self.what else ""
        where = (f", expected from {self.expected} ({self.expected_path or 'not loaded'})"
                 if self.expected else ", defined by no library it loads")
        return f"{self.library}: undefined symbol {sym}{ver}{raw}{where}"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class ObjectResult:
    """What checking one shared object found."""

    dist: str
    library: str
    refs: int = 0
    problems: list[Problem] = field(default_factory=list)
    driver: dict[str, int] = field(default_factory=dict)  # driver library -> symbols it owes
    allowed: str | None = None  # the matrix's reason when abi_allow names this object
    not_taken: str | None = None  # an alternative the package does not load here, and why


@dataclass
class Scan:
    """The whole phase's findings."""

    roots: list[str]
    results: list[ObjectResult] = field(default_factory=list)
    # ELF files the interpreter cannot dlopen: another class or machine, or not ET_DYN
    foreign: list[str] = field(default_factory=list)
    elf_files: int = 0
    loader: dict[str, Any] = field(default_factory=dict)
    # extension modules for another CPython (``.cpython-313-…so`` under 3.11): never imported
    other_interpreter: list[str] = field(default_factory=list)


def interpreter_header(executable: str) -> Any:
    fd = os.open(os.path.realpath(executable), os.O_RDONLY)
    try:
        return elf_header(fd)
    finally:
        os.close(fd)


def torch_libs(roots: list[str]) -> tuple[str | None, list[str]]:
    """What ``import torch`` loads before anything else: ``libtorch_global_deps.so``
    (``RTLD_GLOBAL``) and ``torch/_C*.so`` (local); (None, []) without torch."""
    for root in roots:
        lib = os.path.join(root, "torch", "lib")
        if not os.path.isdir(lib):
            continue
        glob_deps = os.path.join(lib, "libtorch_global_deps.so")
        tdir = os.path.join(root, "torch")
        local = sorted(os.path.join(tdir, n) for n in os.listdir(tdir)
                       if n.startswith("_C.") and n.endswith(".so"))
        return (glob_deps if os.path.isfile(glob_deps) else None), local
    return None, []


def make_process(executable: str, roots: list[str], env: dict[str, str],
                 search: list[str] | None = None,
                 preload: abiload.Preload | None = None) -> tuple[Process, str]:
    """The interpreter's process after ``import torch`` (when torch is installed), and where
    the loader's cache came from. ``search``: the interpreter's ``sys.path``, along which torch
    looks for the CUDA libraries it preloads (default: ``roots`` then this ``sys.path``);
    ``preload``: the names of torch's preloading (none: no preloads modelled)."""
    header = interpreter_header(executable)
    if header is None:
        raise DevcodeError(f"{executable}: the interpreter is not an ELF file")
    cache, source = load_cache()
    searcher = Searcher(cache, env_paths(env.get("LD_LIBRARY_PATH")),
                        default_dirs(header.machine, header.cls64), lambda p: False)
    proc = Process(searcher, header)
    searcher.accept = proc.fits
    proc.start(executable)
    global_deps, local = torch_libs(roots)
    proc.torch_global, proc.torch_local = global_deps, list(local)
    if global_deps:
        proc.load(os.path.realpath(global_deps), True)
        # torch/__init__.py: preload only when libtorch_global_deps brought in libcudart
        if proc.mapped("libcudart.so"):
            paths = search if search is not None else roots + [
                p for p in sys.path if p not in roots]
            proc.preloaded, proc.preload_stop = abiload.torch_preloads(
                os.path.join(os.path.dirname(os.path.dirname(global_deps))), paths, preload)
            for lib in proc.preloaded:
                proc.load(lib, False)
    for path in local:
        proc.load(os.path.realpath(path), False)
    return proc, source


def driver_owes(key: bytes, missing: list[str], info: DynInfo) -> str | None:
    """The missing driver library a reference is for (its version names it, or its name
    has the driver's prefix), None when it is not the driver's."""
    file = info.ref_file.get(key)
    if file in missing:
        return file
    name = key.split(SEP, 1)[0].decode("latin-1")
    return missing[0] if missing and name.startswith(DRIVER_PREFIXES) else None


def check_object(proc: Process, path: str, res: ObjectResult, drivers: tuple[str, ...],
                 loads: list[tuple[str, bool]] | None = None) -> None:
    """Fill ``res`` for the shared object at ``path`` (a realpath). ``loads``: what its package
    loads itself first (:func:`.abiload.package_loads`). An object already loaded (torch's
    own libraries) is judged in the scope of the load that brought it in."""
    info = proc.dyn(path)
    res.refs = len(info.refs)
    names, extra = proc.extra_scope(loads) if loads else (proc.loaded, [])
    c = proc.closure(path, names)
    missing_driver = []
    for name, _requester in c.missing:
        if name in drivers:
            missing_driver.append(name)
            res.driver[name] = res.driver.get(name, 0)
        elif not any(p.kind == "missing" and p.what == name for p in res.problems):
            res.problems.append(Problem(res.library, "missing", name))
    order: list[str] = []
    seen: set[str] = set()
    for p in (*proc.global_order, *extra, *proc.group.get(path, ()), *c.order):
        if p not in seen:
            seen.add(p)
            order.append(p)
    scope = [(p, proc.dyn(p)) for p in order]
    for need in info.verneed:
        lib_path = c.names.get(need.file)
        if need.weak or lib_path is None:
            continue
        lib = proc.dyn(lib_path)
        if lib.verdefs and need.version not in lib.verdefs:
            res.problems.append(Problem(res.library, "version", need.version,
                                        expected=need.file, expected_path=lib_path))
    for key in sorted(looked_up(path, bind(info.refs, [lib for _p, lib in scope]))):
        owed = driver_owes(key, missing_driver, info)
        if owed:
            res.driver[owed] = res.driver.get(owed, 0) + 1
            continue
        u = Unbound(key, *expected_provider(key, info, scope, c.names))
        res.problems.append(Problem(res.library, "symbol", u.name, u.version, u.expected,
                                    u.expected_path))


def looked_up(path: str, unbound: set[bytes]) -> set[bytes]:
    """The unbound references the loader will look up: those a relocation names."""
    if not unbound:
        return unbound
    names = relocated(path, {k.split(SEP, 1)[0] for k in unbound})
    return {k for k in unbound if k.split(SEP, 1)[0] in names}


def scan(roots: list[str], accelerator: str, executable: str = sys.executable,
         env: dict[str, str] | None = None, allow: dict[str, str] | None = None,
         soabi: str | None = None, rules: abiload.Rules = abiload.NO_RULES) -> Scan:
    """Check every ELF shared object under ``roots``. ``allow``: the matrix's ``abi_allow``
    (object glob -> reason); ``soabi``: the interpreter's ``SOABI`` (default: this one's);
    ``rules``: what the packages load themselves (the manifest's ``abi_loader``)."""
    env = dict(os.environ) if env is None else env
    soabi = soabi or sysconfig.get_config_var("SOABI")
    proc, source = make_process(executable, roots, env, preload=rules.preload)
    out = Scan(roots, loader=loader_facts(proc, env, source))
    drivers = DRIVER_LIBS.get(accelerator, ())
    seen: set[tuple[int, int]] = set()
    for root in roots:
        owned = owners(root)
        for path in shared_objects(root):
            rel = os.path.relpath(path, root)
            res = ObjectResult(owned.get(os.path.normpath(rel), UNOWNED), rel)
            try:
                st = os.stat(path)
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                real = os.path.realpath(path)
                if not _is_elf(real):
                    continue
                out.elf_files += 1
                if not proc.fits(real) or proc.dyn(real).header.type != ET_DYN:
                    out.foreign.append(rel)
                    continue
                if abiload.other_interpreter(os.path.basename(rel), soabi):
                    out.other_interpreter.append(rel)
                    continue
                check_object(proc, real, res, drivers,
                             abiload.package_loads(rel, roots, rules))
            except (OSError, DevcodeError, struct.error, ValueError) as e:
                res.problems.append(Problem(rel, "unreadable", str(e) or type(e).__name__))
            out.results.append(res)
    settle_alternatives(out.results, proc.torch_global, rules)
    for r in out.results:
        r.allowed = allowance(r.library, allow or {}) if r.problems else None
    demangle([p for r in out.results for p in r.problems if p.kind == "symbol"])
    return out


def allowance(path: str, allow: dict[str, str]) -> str | None:
    """The reason of the first ``abi_allow`` glob that matches the object's path (a glob's
    ``*`` stays within one path segment: :mod:`.allowpath`)."""
    return allowpath.reason(path, allow)


def decide_allowances(results: list[ObjectResult], allow: dict[str, str],
                      strict: bool) -> Check | None:
    """``abi.allowances``: every ``abi_allow`` entry must excuse an object that would fail
    here (one with problems); one that excuses none is stale: a warning naming it, a failure
    under ``--strict``. None when the matrix allows nothing."""
    return allowpath.decide(
        f"{PHASE}.allowances", "abi_allow", allow, [r.library for r in results if r.problems],
        "object that fails to load", "an object that would fail here", strict,
        {"excused": sorted(r.library for r in results if r.problems and r.allowed)})


def settle_alternatives(results: list[ObjectResult], torch_global: str | None,
                        rules: abiload.Rules) -> None:
    """Of each set of alternatives (``rules.alternatives``), only what the package
    loads here is judged: the variant(s) it picks (from torch's version), or, when it takes the
    first that loads, every variant that loads; the others are named as not taken. When no
    variant loads, every variant keeps its problems."""
    torch_dir = os.path.dirname(os.path.dirname(torch_global)) if torch_global else None
    groups: dict[abiload.Alternatives, dict[str, list[ObjectResult]]] = {}
    for r in results:
        hit = abiload.alternative(r.library, rules)
        if hit:
            groups.setdefault(hit[0], {}).setdefault(hit[1], []).append(r)
    for alt, variants in groups.items():
        loads = {v for v, rs in variants.items() if not any(r.problems for r in rs)}
        pick = abiload.picked(alt, torch_dir)
        taken = pick if pick is not None else (loads or set(variants))
        for v, rs in variants.items():
            if v in taken:
                continue
            why = (f"alternative not taken ({alt.how}; this image takes "
                   f"{', '.join(sorted(taken & set(variants))) or 'none of them'})")
            for r in rs:
                r.not_taken, r.problems, r.driver = why, [], {}


def _is_elf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def loader_facts(proc: Process, env: dict[str, str], source: str) -> dict[str, Any]:
    """The loader's view, for the report."""
    return {"cache": source,
            "ld_library_path": env_paths(env.get("LD_LIBRARY_PATH")),
            "default_dirs": proc.searcher.defaults,
            "global": [scope_name(p, proc.loaded) for p in proc.global_order],
            "torch_global": proc.torch_global, "torch_local": proc.torch_local,
            "torch_preloaded": [scope_name(p, proc.loaded) for p in proc.preloaded],
            "torch_preload_stop": proc.preload_stop}


def demangle(problems: list[Problem]) -> None:
    """Demangle the C++ symbols of ``problems`` with the image's ``c++filt`` (one call)."""
    mangled = sorted({p.what for p in problems if p.what.startswith("_Z")})
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return
    try:
        proc = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return
    lines = proc.stdout.splitlines()
    if len(lines) != len(mangled):
        return
    names = dict(zip(mangled, lines))
    for p in problems:
        p.demangled = names.get(p.what)


def decide_dist(dist: str, results: list[ObjectResult]) -> Check:
    """One distribution's check: fail naming every problem (the first few in the reason),
    a required skip when a file could not be read and nothing failed, else pass. An object the
    matrix allows (``abi_allow``) is named with its reason, not failed; an alternative the
    package does not load here is named, not judged."""
    cid = f"{PHASE}.{dist}"
    judged = [r for r in results if not r.allowed]
    problems = [p for r in judged for p in r.problems]
    broken = [p for p in problems if p.kind != "unreadable"]
    unread = [p for p in problems if p.kind == "unreadable"]
    refs = sum(r.refs for r in results)
    value: dict[str, Any] = {"objects": len(results), "symbols": refs,
                             "problems": [p.to_dict() for p in problems]}
    allowed = [r for r in results if r.allowed]
    if allowed:
        value["allowed"] = {r.library: {"reason": r.allowed, "problems": [
            p.to_dict() for p in r.problems]} for r in allowed}
    skipped = [r for r in results if r.not_taken]
    if skipped:
        value["not_taken"] = {r.library: r.not_taken for r in skipped}
    notes = _notes(allowed, skipped)
    shown = broken or unread
    text = "; ".join(p.text() for p in shown[:SHOWN])
    if len(shown) > SHOWN:
        text += f"; and {len(shown) - SHOWN} more (in the value)"
    if broken:
        return Check(cid, PHASE, FAIL, value=value, reason=f"{dist}: {text}{notes}")
    if unread:
        return Check(cid, PHASE, SKIP, value=value, required=True,
                     reason=f"{dist}: {text}{notes}")
    but = ", but for the allowed objects below" if allowed else ""
    return Check(cid, PHASE, PASS, value=value,
                 reason=f"{dist}: {_n(len(results), 'shared object')}, "
                        f"{_n(refs, 'undefined symbol')}, all defined where they load{but}"
                        f"{notes}")


def _notes(allowed: list[ObjectResult], skipped: list[ObjectResult]) -> str:
    """The allowed objects (first problem and the matrix's reason) and the alternatives not
    taken, for a check's reason."""
    out = ""
    for r in allowed[:SHOWN]:
        more = f" (+{len(r.problems) - 1} more)" if len(r.problems) > 1 else ""
        out += f"; (allowed) {r.problems[0].text()}{more} (matrix abi_allow: {r.allowed})"
    if len(allowed) > SHOWN:
        out += f"; and {len(allowed) - SHOWN} more allowed (in the value)"
    by_why: dict[str, list[str]] = {}
    for r in skipped:
        by_why.setdefault(r.not_taken or "", []).append(os.path.basename(r.library))
    for why, libs in sorted(by_why.items()):
        out += f"; {', '.join(sorted(libs))}: {why}"
    return out


def decide_driver(results: list[ObjectResult]) -> Check | None:
    """The driver's libraries the environment needs: named, never checked (skip, cannot
    apply in an image); None when nothing needs one."""
    needs: dict[str, list[str]] = {}
    for r in results:
        for lib in r.driver:
            needs.setdefault(lib, []).append(r.library)
    if not needs:
        return None
    parts = []
    for lib, objs in sorted(needs.items()):
        more = f" and {len(objs) - 3} more" if len(objs) > 3 else ""
        parts.append(f"{lib} (needed by {', '.join(objs[:3])}{more})")
    value = {lib: sorted(objs) for lib, objs in needs.items()}
    return Check(f"{PHASE}.driver", PHASE, SKIP, required=False, applies=False, value=value,
                 reason="resolved at run time by the driver: " + "; ".join(parts))


def loader_rules(manifest: dict[str, Any]) -> tuple[abiload.Rules, str | None]:
    """The loader rules the phase uses and where they came from: the manifest's, else the
    catalogue's copy this self-test was shipped with (``loader_rules.json`` beside the package;
    absent when it runs from a source tree), else none."""
    rules = abiload.rules(manifest)
    if rules.present:
        return rules, "manifest"
    copy = read_payload(PAYLOAD_RULES)
    if copy is None:
        return rules, None
    shipped = abiload.rules({"abi_loader": copy})
    return (shipped, PAYLOAD) if shipped.present else (rules, None)


def check_abi(run: Run, roots: list[str] | None = None) -> list[Check]:
    """The phase's one step: scan, then one check per distribution."""
    roots = roots if roots is not None else (run.options.get("abi_roots") or site_dirs())
    t0 = time.monotonic()
    rules, source = loader_rules(run.manifest)
    found = scan(roots, run.accelerator, allow=run.manifest.get("abi_allow") or {}, rules=rules)
    elapsed = time.monotonic() - t0
    dists = sorted({r.dist for r in found.results})
    refs = sum(r.refs for r in found.results)
    value = {"roots": roots, "elf_files": found.elf_files, "objects": len(found.results),
             "distributions": len(dists), "symbols": refs, "foreign": found.foreign,
             "seconds": round(elapsed, 3),
             "other_interpreter": found.other_interpreter, "loader": found.loader,
             "loader_rules": source or False}
    reason = (f"{_n(found.elf_files, 'ELF file')}, {len(found.results)} shared objects of "
              f"{_n(len(dists), 'distribution')} checked, {_n(refs, 'undefined symbol')}, "
              f"in {elapsed:.2f} s")
    if found.foreign:
        reason += (f"; {len(found.foreign)} not loadable here (another machine, or not a "
                   "shared object) and not checked")
    if found.other_interpreter:
        reason += (f"; {len(found.other_interpreter)} built for another Python, never "
                   f"imported by this one, not checked: {', '.join(found.other_interpreter)}")
    if found.loader.get("torch_local"):
        reason += "; torch loaded first"
    if found.loader.get("torch_preloaded"):
        reason += f" with {len(found.loader['torch_preloaded'])} CUDA libraries it preloads"
    if found.loader.get("torch_preload_stop"):
        reason += (f" (torch stops preloading at {found.loader['torch_preload_stop']}, which it "
                   "does not find)")
    if source == PAYLOAD:
        reason += FALLBACK_RULES
    elif not rules.present:
        reason += NO_LOADER_RULES
    checks = [Check(f"{PHASE}.scan", PHASE, PASS if found.results else WARN, value=value,
                    duration_s=elapsed, reason=reason if found.results else
                    reason + f"; no shared object under {', '.join(roots) or 'no root'}")]
    driver = decide_driver(found.results)
    checks += [driver] if driver else []
    checks += [decide_dist(d, [r for r in found.results if r.dist == d]) for d in dists]
    allowances = decide_allowances(found.results, run.manifest.get("abi_allow") or {},
                                   bool(run.options.get("strict")))
    return checks + ([allowances] if allowances else [])


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def plan(run: Run) -> list[Step]:
    """Two steps, required on every family (a CPU torch has extensions too): the scan, and
    one owner per file (:mod:`.records`)."""
    return [Step((f"{PHASE}.scan",), check_abi), Step((records.CHECK,), records.check_records)]
