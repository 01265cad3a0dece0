"""``build-env``: the command line. Thin: parse, call a stage, print, map errors to exit codes.

Exit codes: 0 ok, 1 a check failed (compatibility, verification, build), 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from builder import __version__
from builder.errors import BuildEnvError, CompatError
from builder.metadata import Snapshot
from builder.spec import Matrix, Target, load_matrix

SUBCOMMANDS = ("build", "list", "check", "lock", "render", "verify", "sif", "publish", "slurm",
               "doctor")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", type=Path, default=Path("matrix.yaml"),
                   help="the compatibility matrix (default: ./matrix.yaml)")
    p.add_argument("--snapshot", type=Path, default=None,
                   help="package metadata snapshot (default: metadata/pypi-snapshot.json beside "
                        "the matrix)")


def _overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a pin for a local experiment (python=3.11, packages.verl=0.9.0, "
                        "packages.flash-attn.enabled=false); the result is labelled an override")
    p.add_argument("--base-image", default=None, metavar="REF",
                   help="build FROM this image instead of the matrix's base (an override)")


def _ca(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ca-bundle", type=Path, default=os.environ.get("VERL_ENV_CA_BUNDLE") or None,
                   metavar="PATH", help="site CA bundle injected into the build (env "
                   "VERL_ENV_CA_BUNDLE); needed behind a TLS-intercepting proxy")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build-env", description="Build verl environments that are proven to work before "
        "they get a name: matrix -> lock -> render -> build -> verify -> tag.")
    parser.add_argument("--version", action="version", version=f"build-env {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    from builder import pipeline

    b = sub.add_parser("build", help="render, build, verify inside the image, tag on pass "
                       "(also: build-env --target T)")
    _common(b)
    _overrides(b)
    _ca(b)
    pipeline.add_arguments(b)

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
    lk.add_argument("--offline", action="store_true", help="resolve from uv's cache only")

    rd = sub.add_parser("render", help="write the build context without building")
    _common(rd)
    _overrides(rd)
    _ca(rd)
    rd.add_argument("--target", required=True)
    rd.add_argument("--output", type=Path, default=None,
                    help="context directory (default: build/<target>)")

    vf = sub.add_parser("verify", help="run the in-image self-test on any image")
    from builder import verify as verify_mod

    verify_mod.add_arguments(vf)

    for name, module, helptext in (("sif", "builder.sif", "convert a verified image to .sif"),
                                   ("publish", "builder.publish", "push image and SIF"),
                                   ("slurm", "builder.slurm", "write an sbatch script"),
                                   ("doctor", "builder.doctor", "pre-flight a cluster node")):
        mod = _optional(module)
        if mod is not None:
            sp = sub.add_parser(name, help=helptext)
            if name in ("sif", "publish", "slurm"):
                _common(sp)
            if name == "slurm":
                sp.add_argument("--target", default=None,
                                help="matrix target (sets the accelerator family)")
            mod.add_arguments(sp)
    return parser


def _optional(module: str) -> ModuleType | None:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        return None


# --------------------------------------------------------------------------- commands


def snapshot_for(args: argparse.Namespace, matrix: Matrix) -> Snapshot:
    """The metadata snapshot: ``--snapshot``, else the one beside the matrix."""
    from builder.metadata import load_snapshot, snapshot_path

    return load_snapshot(args.snapshot or snapshot_path(matrix.path))


def _targets(matrix: Matrix, name: str | None) -> list[Target]:
    return [matrix.target(name)] if name else list(matrix.targets.values())


def cmd_list(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    if args.json:
        print(json.dumps({n: {**t.to_dict(), "entry_hash": t.entry_hash}
                          for n, t in matrix.targets.items()}, indent=2))
        return 0
    cols = ["target", "accel", "arch", "python", "torch", "engine", "ray", "transformers",
            "tensordict", "verl", "base"]
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
                     v("tensordict"), v("verl"), t.base.image])
    widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]
    for r in [cols, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    print("\n* provided by the base image   (src) built from source   (off) disabled")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from builder.compat import check_target, pins_of
    from builder.lock import lock_path, stale_reason
    from builder.metadata import IndexClient, refresh, save_snapshot, snapshot_path

    matrix = load_matrix(args.matrix)
    targets = _targets(matrix, args.target)
    snapshot = snapshot_for(args, matrix)
    if args.online:
        pins = [pin for t in targets for pin in pins_of(t)]
        links = [link for t in targets for link in t.find_links]
        refresh(snapshot, pins, IndexClient(), links)
        path = args.snapshot or snapshot_path(matrix.path)
        save_snapshot(snapshot, path)
        print(f"refreshed {path} ({len(set(pins))} pinned releases)")
    for w in matrix.warnings:
        if args.target is None or f"targets.{args.target}." in w:
            print(f"warning: {w}", file=sys.stderr)
    failed = 0
    for t in targets:
        problems = [str(p) for p in check_target(t, snapshot)]
        stale = stale_reason(t, snapshot, lock_path(matrix.path, t))
        if stale:
            problems.append(f"{t.where('')}: targets.{t.name}: {stale}")
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print(f"{t.name}: {'FAIL' if problems else 'ok'}")
        failed += bool(problems)
    return 1 if failed else 0


def cmd_lock(args: argparse.Namespace) -> int:
    from builder.compat import check_target
    from builder.lock import compile_lock, lock_path, parse_lock

    matrix = load_matrix(args.matrix)
    snapshot = snapshot_for(args, matrix)
    for t in _targets(matrix, args.target):
        problems = check_target(t, snapshot)
        if problems:
            raise CompatError("; ".join(str(p) for p in problems), target=t.name)
        lock = compile_lock(t, snapshot, lock_path(matrix.path, t), offline=args.offline)
        print(f"{t.name}: {lock.path} ({len(parse_lock(lock.text))} packages, "
              f"{lock.seconds:.1f} s)")
    return 0


def resolve_target(args: argparse.Namespace) -> tuple[Matrix, Target]:
    """The matrix target with ``--set``/``--base-image`` applied."""
    from builder.spec import apply_overrides

    matrix = load_matrix(args.matrix)
    target = apply_overrides(matrix.target(args.target), args.overrides,
                             base_image=args.base_image)
    return matrix, target


def cmd_render(args: argparse.Namespace) -> int:
    from builder.lock import lock_for
    from builder.render import render_context

    matrix, target = resolve_target(args)
    snapshot = snapshot_for(args, matrix)
    out = args.output or Path("build") / target.name
    lock_text, lock_file = lock_for(matrix.path, target, snapshot, out.parent)
    ctx = render_context(target, lock_text, snapshot, out, lock_file=lock_file,
                         ca_bundle=args.ca_bundle)
    print(f"{target.name}: build context in {ctx.path} (lock {ctx.lock_hash[:19]})")
    return 0


def cmd_slurm(args: argparse.Namespace) -> int:
    """``build-env slurm``: the target's accelerator family comes from the matrix."""
    from builder import slurm

    if args.target and not args.family:
        args.family = load_matrix(args.matrix).target(args.target).accelerator
    return slurm.run(args)


def _dispatch(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    from builder import pipeline, verify

    table: dict[str, Callable[[argparse.Namespace], int]] = {
        "build": pipeline.run, "list": cmd_list, "check": cmd_check, "lock": cmd_lock,
        "render": cmd_render, "verify": verify.run, "slurm": cmd_slurm,
    }
    if args.command in table:
        return table[args.command]
    mod = _optional(f"builder.{args.command}")
    assert mod is not None, args.command  # only parsers of importable modules exist
    run: Callable[[argparse.Namespace], int] = mod.run
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
    try:
        return _dispatch(args)(args)
    except BuildEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
