"""The checker's command line (parsed by hand: an in-image program, stdlib only)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

MANIFEST = "/opt/verl-env/manifest.json"

USAGE = ("usage: incheck.pyz --nnodes N --gpus-per-node G [--json PATH] [--manifest PATH] "
         "[--engine NAME=MODULE]... -- OVERRIDE...")


@dataclass
class Args:
    """The command line (parsed by hand: an in-image program, no argparse in builder/ but the
    command layers)."""

    nnodes: int = 0
    gpus_per_node: int = 0
    json: str | None = None
    manifest: str = MANIFEST
    # rollout engines: verl's rollout.name -> the module that engine installs (the host passes
    # its catalogue's, builder.train.shapes.engine_args; a name not given is its own module)
    engines: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)


def parse(argv: list[str]) -> Args:
    """``--nnodes N --gpus-per-node G [--json PATH] [--manifest PATH] [--engine NAME=MODULE]...
    -- OVERRIDE...``;
    SystemExit(2) with the usage on anything else."""
    args, rest = Args(), list(argv)
    if "--" in rest:
        args.overrides, rest = rest[rest.index("--") + 1:], rest[:rest.index("--")]
    names = {"--nnodes": "nnodes", "--gpus-per-node": "gpus_per_node", "--json": "json",
             "--manifest": "manifest"}
    while rest:
        flag = rest.pop(0)
        if flag in ("-h", "--help"):
            print(USAGE + "\n\n" + (sys.modules[__package__].__doc__ or ""), file=sys.stderr)
            raise SystemExit(0)
        known = flag in names or flag == "--engine"
        if not known or not rest:
            _usage(f"{flag} needs a value" if known else f"unexpected {flag!r}")
        if flag == "--engine":
            name, eq, module = rest.pop(0).partition("=")
            if not (name and eq and module):
                _usage("--engine takes NAME=MODULE")
            args.engines[name] = module
            continue
        setattr(args, names[flag], rest.pop(0))
    try:
        args.nnodes, args.gpus_per_node = int(args.nnodes), int(args.gpus_per_node)
    except ValueError:
        _usage("--nnodes and --gpus-per-node take whole numbers")
    if args.nnodes < 1 or args.gpus_per_node < 1:
        _usage("--nnodes and --gpus-per-node are required, each >= 1")
    return args


def _usage(why: str) -> None:
    print(f"{USAGE}\nincheck.pyz: error: {why}", file=sys.stderr)
    raise SystemExit(2)
