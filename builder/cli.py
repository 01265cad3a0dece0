"""``build-env``: the command line. Thin: parse, call a stage, print, map errors to exit codes.

Exit codes: 0 ok, 1 a check failed (compatibility, verification, build), 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder import __version__
from builder.errors import BuildEnvError, CompatError
from builder.targets import Site, default_matrix, init_site, open_site, resolve_target

if TYPE_CHECKING:
    from builder.pipeline import Outcome

SUBCOMMANDS = ("build", "init", "list", "check", "lock", "render", "verify", "sif", "publish",
               "slurm", "doctor", "trust", "cluster", "status")

# One convention for every subcommand: --matrix/--snapshot name the site, --target a matrix
# target, --json prints machine-readable output on stdout, paths are options, not positionals
# (except the one thing a command acts on: `verify IMAGE`, `init DIR`).


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", type=Path, default=None,
                   help="the compatibility matrix (default: ./matrix.yaml if present, else the "
                        "reference matrix shipped with build-env)")
    p.add_argument("--snapshot", type=Path, default=None,
                   help="package metadata snapshot (default: metadata/pypi-snapshot.json beside "
                        "the matrix)")


def _overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a pin for a local experiment (python=3.11, packages.verl=0.9.0, "
                        "packages.flash-attn.enabled=false); the result is labelled an override")
    p.add_argument("--base-image", default=None, metavar="REF",
                   help="build FROM this image instead of the matrix's base (an override)")


def _render_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ca-bundle", type=Path, default=os.environ.get("VERL_ENV_CA_BUNDLE") or None,
                   metavar="PATH", help="site CA bundle injected into the build (env "
                   "VERL_ENV_CA_BUNDLE); needed behind a TLS-intercepting proxy")
    p.add_argument("--templates", type=Path, default=None, metavar="DIR",
                   help="a site's Dockerfile templates (Dockerfile.j2, _macros.j2), searched "
                        "before the shipped ones")


def _build_options(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--target", dest="targets", action="append",
                       help="matrix target to build (repeat for several, built concurrently)")
    which.add_argument("--all", action="store_true", help="build every target of the matrix")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="targets built at once (default: all of them)")
    p.add_argument("--tag-prefix", default="verl-env", metavar="REPO",
                   help="repository for release tags (default: verl-env)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the context and report.json go (default: build/<target>; "
                        "DIR/<target> for several targets)")
    p.add_argument("--keep-candidate", action="store_true",
                   help="keep a failed image, tagged <prefix>:<target>-candidate")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="stream the build output")
    p.add_argument("--network", default="host",
                   help="network for build steps (default: host; 'default' for the daemon's)")
    p.add_argument("--verify-timeout", type=float, default=900)
    p.add_argument("--gpus", choices=["auto", "nvidia", "amd", "none"], default="auto",
                   help="GPUs handed to the verification container (auto: what the host has)")
    p.add_argument("--expect-gpus", type=int, default=None, metavar="N",
                   help="GPUs the gate must see (default: what the engine's host shows for the "
                        "target's family; 0 for an emulated build)")
    p.add_argument("--reverify", action="store_true",
                   help="run the gate again even when the content tag holds a release verdict")
    p.add_argument("--require", choices=("build", "gpu"), default=None,
                   help="the verdict level that unlocks tags, SIF and publish: build (default; "
                        "a GPU family's GPU phases may be pending) or gpu (they passed on GPUs); "
                        "env VERL_ENV_REQUIRE")
    p.add_argument("--sif", type=Path, default=None, metavar="PATH",
                   help="also convert the verified image to this .sif (a directory for several "
                        "targets: DIR/<target>.sif)")
    p.add_argument("--sign-key", type=Path, default=os.environ.get("VERL_ENV_SIGN_KEY") or None,
                   metavar="PATH", help="sign the SIF's attestations (verdict, SBOM, provenance) "
                   "with this ECDSA key (env VERL_ENV_SIGN_KEY; `build-env trust keygen`)")
    p.add_argument("--sign-pgp-key", type=Path,
                   default=os.environ.get("VERL_ENV_SIGN_PGP_KEY") or None, metavar="PATH",
                   help="also sign the SIF itself (apptainer verify) with this OpenPGP key "
                        "(env VERL_ENV_SIGN_PGP_KEY)")
    p.add_argument("--push", default=None, metavar="REGISTRY/REPO",
                   help="also publish the verified image (and the SIF) to this registry")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build-env", description="Build verl environments that are proven to work before "
        "they get a name: matrix -> lock -> render -> build -> verify -> tag.")
    parser.add_argument("--version", action="version", version=f"build-env {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    b = sub.add_parser("build", help="render, build, verify inside the image, tag on pass "
                       "(also: build-env --target T)")
    _common(b)
    _overrides(b)
    _render_options(b)
    _build_options(b)

    ini = sub.add_parser("init", help="write a starter site directory (matrix, snapshot, locks)")
    ini.add_argument("directory", type=Path, metavar="DIR")

    lst = sub.add_parser("list", help="targets and their pins")
    _common(lst)
    lst.add_argument("--json", action="store_true", help="machine-readable output")

    chk = sub.add_parser("check", help="validate the matrix, the pins' compatibility and locks")
    _common(chk)
    chk.add_argument("--target", help="check one target (default: all)")
    chk.add_argument("--online", action="store_true",
                     help="refresh the metadata snapshot from the package index first")

    lk = sub.add_parser("lock", help="resolve the full dependency lock (with hashes) for a target")
    _common(lk)
    lk.add_argument("--target", help="lock one target (default: all)")
    lk.add_argument("--probe", action="store_true",
                    help="vendor bases: inspect the base through the engine first and record "
                         "its interpreter and freeze in locks/T.base.json")
    lk.add_argument("--offline", action="store_true", help="resolve from uv's cache only")

    rd = sub.add_parser("render", help="write the build context without building")
    _common(rd)
    _overrides(rd)
    _render_options(rd)
    rd.add_argument("--target", required=True)
    rd.add_argument("--output", type=Path, default=None,
                    help="context directory (default: build/<target>)")

    from builder import verify as verify_mod

    vf = sub.add_parser("verify", help="run the in-image self-test on any image")
    _common(vf)
    verify_mod.add_arguments(vf)

    for name, module, helptext in (("sif", "builder.sif", "convert a verified image to .sif"),
                                   ("publish", "builder.publish", "push image and SIF"),
                                   ("slurm", "builder.slurm", "write an sbatch script"),
                                   ("doctor", "builder.doctor", "pre-flight a cluster node"),
                                   ("trust", "builder.trust.cli", "sign and check attestations"),
                                   ("cluster", "builder.cluster",
                                    "collect (and sign) a Slurm job's cluster verdict"),
                                   ("status", "builder.status",
                                    "every verdict that travels with a SIF, newest first")):
        mod = importlib.import_module(module)
        sp = sub.add_parser(name, help=helptext)
        if name in ("sif", "publish", "slurm"):
            _common(sp)
        if name == "slurm":
            sp.add_argument("--target", default=None,
                            help="matrix target (sets the accelerator family)")
        mod.add_arguments(sp)
    return parser


# --------------------------------------------------------------------------- commands


def _site(args: argparse.Namespace) -> Site:
    return open_site(args.matrix, args.snapshot)


def _vendor_note(site: Site, t: Any) -> str:
    """How far a vendor base is verified: declared (from published sources) or inspected."""
    from builder.lock import lock_path
    from builder.vendor import base_record_path

    if not t.base.vendor:
        return ""
    if base_record_path(lock_path(site.path, t)).is_file():
        return " (vendor base, inspected)"
    if t.base.vendor == "declared":
        return " (declared, not yet verified)"
    return " (vendor base, not yet probed)"


def _verdict_json(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    return {"image_id": v.image_id, "recorded_at": v.recorded_at, "overall": v.overall,
            "scope": v.scope, "level": v.level, "gpu": v.gpu.to_dict()}


def cmd_list(args: argparse.Namespace) -> int:
    from builder import verdicts

    site = _site(args)
    matrix = site.matrix
    latest = {n: verdicts.latest_for_target(n) for n in matrix.targets}
    if args.json:
        print(json.dumps({n: {**t.to_dict(), "entry_hash": t.entry_hash,
                              "verdict": _verdict_json(latest[n]),
                              **({"base_status": _vendor_note(site, t).strip(" ()")}
                                 if t.base.vendor else {})}
                          for n, t in matrix.targets.items()}, indent=2))
        return 0
    cols = ["target", "accel", "arch", "python", "torch", "engine", "ray", "transformers",
            "tensordict", "verl", "verdict", "base"]
    rows = []
    for t in matrix.targets.values():
        def v(name: str) -> str:
            p = t.package(name)
            if p is None:
                return "-"
            return p.version + ("*" if p in t.provided else "") + (
                "(src)" if p.build == "source" else "") + ("" if p.enabled else "(off)")
        eng = t.engine
        rows.append([t.name, t.accelerator + (f" {t.cuda or t.rocm}" if t.cuda or t.rocm else ""),
                     t.arch, t.python, v("torch"),
                     f"{eng.name} {v(eng.name)}" if eng else "-", v("ray"), v("transformers"),
                     v("tensordict"), v("verl"), verdicts.short(latest[t.name]),
                     t.base.image + _vendor_note(site, t)])
    widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]
    for r in [cols, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    print("\n* provided by the base image   (src) built from source   (off) disabled")
    print("verdict: the newest local one (build: every phase that runs without a GPU passed; "
          "gpu: the GPU phases too)")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from builder.compat import check_target, local_sources, pins_of
    from builder.lock import lock_path, stale_reason
    from builder.metadata import IndexClient, load_snapshot, refresh, save_snapshot

    site = _site(args)
    targets = site.targets([args.target] if args.target else None)
    if args.online:
        snapshot = load_snapshot(site.snapshot_file)
        pins = [pin for t in targets for pin in pins_of(t)]
        links = [link for t in targets for link in t.find_links]
        local = [n for t in targets for n in local_sources(t)]
        refresh(snapshot, pins, IndexClient(), links, local)
        save_snapshot(snapshot, site.snapshot_file)
        print(f"refreshed {site.snapshot_file} ({len(set(pins))} pinned releases)")
    snapshot = site.snapshot(targets)
    for w in site.matrix.warnings:
        if args.target is None or f"targets.{args.target}." in w:
            print(f"warning: {w}", file=sys.stderr)
    failed = 0
    for t in targets:
        problems = [str(p) for p in check_target(t, snapshot)]
        stale = stale_reason(t, snapshot, lock_path(site.path, t))
        if stale:
            problems.append(f"{t.where('')}: targets.{t.name}: {stale}")
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print(f"{t.name}: {'FAIL' if problems else 'ok'}")
        failed += bool(problems)
    return 1 if failed else 0


def _base_record(t: Any, lock_file: Path, probe: bool) -> dict[str, Any] | None:
    """The vendor base's record: probed now (``--probe``, through the engine) and written beside
    the lock, or the one already there (builder.vendor)."""
    from builder import vendor

    if not t.base.vendor:
        if probe:
            print(f"{t.name}: not a vendor base (base.vendor unset): nothing to probe")
        return None
    if not probe:
        return vendor.load_record(t, lock_file)
    from builder.engine import Engine

    record = vendor.probe(Engine.connect(), t)
    vendor.write_record(vendor.base_record_path(lock_file), record)
    print(f"{t.name}: base {record['image_id']} probed: {record['interpreter']} "
          f"({record['kind']}), {len(record['dists'])} distributions -> "
          f"{vendor.base_record_path(lock_file)}")
    for line in vendor.mismatches(t, record):
        print(f"warning: {t.name}: {line} (the gate will refuse the image)", file=sys.stderr)
    return record


def cmd_lock(args: argparse.Namespace) -> int:
    from builder.compat import check_target
    from builder.lock import compile_lock, lock_path, parse_lock

    site = _site(args)
    targets = site.targets([args.target] if args.target else None)
    snapshot = site.snapshot(targets)
    for t in targets:
        problems = check_target(t, snapshot)
        if problems:
            raise CompatError("; ".join(str(p) for p in problems), target=t.name)
        record = _base_record(t, lock_path(site.path, t), args.probe)
        lock = compile_lock(t, snapshot, lock_path(site.path, t), offline=args.offline,
                            record=record)
        print(f"{t.name}: {lock.path} ({len(parse_lock(lock.text))} packages, "
              f"{lock.seconds:.1f} s)")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from builder.lock import lock_for, lock_path
    from builder.vendor import load_record
    from builder.render import render_context

    site = _site(args)
    target = resolve_target(site, args.target, args.overrides, args.base_image)
    snapshot = site.snapshot([target])
    out = args.output or Path("build") / target.name
    lock_text, lock_file = lock_for(site.path, target, snapshot, out.parent)
    ctx = render_context(target, lock_text, snapshot, out, lock_file=lock_file,
                         ca_bundle=args.ca_bundle, templates=args.templates,
                         base_record=load_record(target, lock_path(site.path, target)))
    print(f"{target.name}: build context in {ctx.path} (lock {ctx.lock_hash[:19]})")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from builder.pipeline import BuildRequest, run_many

    from builder.verdicts import requirement

    names = list(_site(args).matrix.targets) if args.all else list(dict.fromkeys(args.targets))
    several = len(names) > 1
    require = requirement(args.require)

    def request(name: str) -> BuildRequest:
        return BuildRequest(
            target=name, matrix=args.matrix, snapshot=args.snapshot,
            overrides=tuple(args.overrides), base_image=args.base_image,
            ca_bundle=args.ca_bundle, templates=args.templates, tag_prefix=args.tag_prefix,
            workdir=(args.workdir / name if several else args.workdir) if args.workdir else None,
            keep_candidate=args.keep_candidate,
            network=None if args.network == "default" else args.network,
            verify_timeout=args.verify_timeout, gpus=args.gpus, expect_gpus=args.expect_gpus,
            reverify=args.reverify, require=require,
            sif=(args.sif / f"{name}.sif" if several else args.sif) if args.sif else None,
            sign_key=args.sign_key, sign_pgp_key=args.sign_pgp_key,
            push=args.push, verbose=args.verbose and not several, quiet=args.json)

    outcomes = run_many([request(n) for n in names], args.jobs or len(names))
    if args.json:
        reports = [json.loads(o.report.to_json()) if o.report else {"error": o.error}
                   for o in outcomes]
        print(json.dumps(reports[0] if not several else dict(zip(names, reports)), indent=2,
                         sort_keys=True))
    if several:
        _summary(names, outcomes)
    return max(o.exit_code for o in outcomes)


def _summary(names: list[str], outcomes: list[Outcome]) -> None:
    rows = [["target", "result", "image", "tags / error"]]
    for name, o in zip(names, outcomes):
        r = o.report
        result = r.result if r else "error"
        verify = (r.stages.get("verify") or {}) if r else {}
        if result == "pass" and verify.get("level"):
            result += f" ({verify['level']}" + (", gpu pending)" if verify.get("gpu") == "pending"
                                                else ")")
        detail = " ".join(r.tags) if r and r.tags else (r.error if r and r.error else o.error)
        rows.append([name, result, (r.image_id or "-")[7:19] if r else "-", detail or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3],
              file=sys.stderr)


def cmd_init(args: argparse.Namespace) -> int:
    written = init_site(args.directory)
    print(f"{args.directory}: verl-env site with {len(written)} files (matrix.yaml, metadata/, "
          f"locks/); next: cd {args.directory} && build-env check")
    return 0


def cmd_slurm(args: argparse.Namespace) -> int:
    """``build-env slurm``: the target's accelerator family comes from the matrix."""
    from builder import slurm

    if args.target and not args.family:
        args.family = _site(args).matrix.target(args.target).accelerator
    return slurm.run(args)


def _dispatch(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    table: dict[str, Callable[[argparse.Namespace], int]] = {
        "build": cmd_build, "init": cmd_init, "list": cmd_list, "check": cmd_check,
        "lock": cmd_lock, "render": cmd_render, "slurm": cmd_slurm,
    }
    if args.command in table:
        return table[args.command]
    run: Callable[[argparse.Namespace], int] = importlib.import_module(
        f"builder.{args.command}").run
    return run


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `build-env --target T [...]` is the main job: the same as `build-env build --target T`.
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv = ["build", *argv]
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if getattr(args, "matrix", "unset") is None:  # modules that read args.matrix get the default
        args.matrix = default_matrix()
    try:
        return _dispatch(args)(args)
    except BuildEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
