"""``build-env``: the command line. Thin: parse (one module per subcommand in
:mod:`builder.commands`), apply the site config, call, map errors to exit codes.

Exit codes: 0 ok, 1 a check failed (compatibility, verification, build), 2 bad input or usage,
130 interrupted (Ctrl-C or SIGTERM; children stopped, temporary files removed).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from builder import __version__, config
from builder.commands import BY_NAME, COMMANDS, completion
from builder.errors import BuildEnvError, SpecError
from builder.targets import default_matrix

SUBCOMMANDS = tuple(BY_NAME)

# One convention for every subcommand: --matrix/--snapshot name the site, --target a matrix
# target, --json prints one machine-readable document (with a "schema") on stdout, --quiet
# prints only errors, paths are options, not positionals (except the one thing a command acts
# on: `verify IMAGE`, `init DIR`).


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build-env", description="Build verl environments that are proven to work before "
        "they get a name: matrix -> lock -> render -> build -> verify -> tag.")
    parser.add_argument("--version", action="version", version=f"build-env {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_arguments(sub.add_parser(module.NAME, help=module.HELP))
    # `completion` walks the whole parser: it gets it here rather than importing this module
    sub.choices[completion.NAME].set_defaults(parser=parser)
    return parser


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    return any(a == o or a.startswith(o + "=") for a in argv for o in action.option_strings)


def apply_config(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 argv: Sequence[str]) -> None:
    """Fill what the command line left out from ``build-env.toml`` (flags win)."""
    cfg = config.load(config.find(getattr(args, "matrix", None)))
    if cfg.path is None:
        return
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in sub.choices[args.command]._actions if a.option_strings}
    section = cfg.sections.get(args.command, {})
    for dest, value in cfg.for_command(args.command).items():
        action = actions.get(dest)
        if action is None:
            if dest.replace("_", "-") in section or dest in section:
                raise SpecError(f"`build-env {args.command}` has no option --"
                                f"{dest.replace('_', '-')}", file=str(cfg.path),
                                key=f"{args.command}.{dest}")
            continue
        if _given(action, argv):
            continue
        if isinstance(value, str) and callable(action.type):
            try:
                value = action.type(value)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                raise SpecError(str(exc), file=str(cfg.path), key=dest) from None
        setattr(args, dest, value)


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM raises KeyboardInterrupt: children (uv, docker) are stopped and temporary files
    removed by the same code that handles Ctrl-C."""
    raise KeyboardInterrupt(f"signal {signum}")


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
    previous = signal.signal(signal.SIGTERM, _terminated)  # cleanup runs as for Ctrl-C
    try:
        apply_config(parser, args, argv)
        if getattr(args, "matrix", "unset") is None:  # commands that read it get the default
            args.matrix = default_matrix()
        if getattr(args, "index_url", None):  # the site's index: metadata, uv, image builds
            os.environ["VERL_ENV_INDEX_URL"] = os.environ["UV_DEFAULT_INDEX"] = args.index_url
        return BY_NAME[args.command].run(args)
    except BuildEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # an unwritable or missing path, a full disk: no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {args.command}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
