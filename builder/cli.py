"""``build-env``: the command line. Thin: parse (one module per subcommand in
:mod:`builder.commands`), apply the site config, call, map errors to exit codes.

Exit codes (docs/commands.md): 0 pass, 1 a gate or check failed, 2 bad input or usage, 3 an
infrastructure or network error (:class:`~builder.errors.InfraError`: an engine that does not
answer, a registry or index that is down, a full disk), 130 interrupted by Ctrl-C, 143 by
SIGTERM (children stopped, temporary files removed either way), 141 when the reader of stdout
went away (``build-env list | head -1``: quiet, nothing printed about it).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import PurePath

from builder import __version__, argtypes
from builder.commands import BY_NAME, _config
from builder.engine import signals
from builder.errors import BuildEnvError, NetworkError, UsageError, redact
from builder.resolve.metadata import network_timeout
from builder.resolve.targets import default_matrix

SUBCOMMANDS = tuple(BY_NAME)

# One convention for every subcommand: --matrix/--snapshot name the site, --target a matrix
# target, --json prints one machine-readable document (with a "schema") on stdout, --quiet
# prints only errors, paths are options, not positionals (except the one thing a command acts
# on: `verify IMAGE`, `init DIR`).


def build_parser(names: Sequence[str] = SUBCOMMANDS) -> argparse.ArgumentParser:
    """The parser of the top level and the ``names`` commands (all by default): a command runs
    without importing every other command's modules."""
    parser = argparse.ArgumentParser(
        prog="build-env", description="Build verl environments that are proven to work before "
        "they get a name: matrix -> lock -> render -> build -> verify -> tag.")
    parser.add_argument("--version", action="version", version=f"build-env {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in names:
        module = BY_NAME[name]
        module.add_arguments(sub.add_parser(name, help=module.HELP))
    if "completion" in sub.choices:  # it walks the whole parser: gets it here, not by import
        sub.choices["completion"].set_defaults(parser=parser)
    return parser


def apply_config(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 argv: Sequence[str]) -> None:
    """Fill what the command line left out from ``build-env.toml`` (flags win); every key of
    the file is checked against the option it sets first (:mod:`builder.commands._config`)."""
    _config.apply(parser, args, argv, whole=build_parser)


# OSError numbers that say the machine failed, not the path the user gave: exit 3
INFRA_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE,
                          errno.ENFILE, errno.ETIMEDOUT, errno.ECONNREFUSED, errno.ECONNRESET,
                          errno.EHOSTUNREACH, errno.ENETUNREACH})
BROKEN_PIPE = 128 + signal.SIGPIPE


def unknown_command(word: str) -> UsageError:
    """``build-env chekc``: the unknown word named, with the nearest real command."""
    import difflib  # lazy: only a mistyped command needs it
    near = difflib.get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.5)
    hint = f"; did you mean `build-env {near[0]}`?" if near else ""
    return UsageError(f"unknown command {word!r}{hint} (commands: {', '.join(SUBCOMMANDS)}; "
                      "`build-env --target T` builds T)")


def os_error(command: str, exc: OSError) -> int:
    """An OSError as one line: exit 3 when the machine failed (a full disk, a dead peer), 2 when
    the path the user gave is wrong (missing, unwritable)."""
    where = f"{exc.filename}: " if exc.filename else ""
    print(f"error: {command}: {where}{exc.strerror or exc}", file=sys.stderr)
    infra = exc.errno in INFRA_ERRNOS or isinstance(exc, (ConnectionError, TimeoutError))
    return 3 if infra else 2


def quiet_stdout() -> int:
    """The reader of stdout went away: say nothing more, and let nothing at exit try again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return BROKEN_PIPE


def interrupted() -> int:
    code = signals.exit_code()
    print("terminated" if code == 128 + signal.SIGTERM else "interrupted", file=sys.stderr)
    return code


def parse(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and the parsed command line; ``build-env --target T [...]`` is ``build``."""
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "build")
    elif argv and argv[0] not in SUBCOMMANDS and not argv[0].startswith("-"):
        raise unknown_command(argv[0])
    parser = build_parser(_parsed_commands(argv))
    args = parser.parse_args(argv)
    if args.command:
        empty_arguments(parser, args)
    return parser, args


def _parsed_commands(argv: Sequence[str]) -> Sequence[str]:
    """The commands whose options ``argv`` needs parsed: the one it names, none for a bare
    ``--version``, all for ``--help`` and for ``completion`` (which prints them all)."""
    if argv and argv[0] in SUBCOMMANDS and argv[0] != "completion":
        return (argv[0],)
    return () if list(argv) == ["--version"] else SUBCOMMANDS


def empty_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """An empty string where the command wants a thing to act on (``verify ''``, ``init ''``)
    names nothing: refused before anything runs."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices[args.command]._actions:
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        if not action.option_strings and any(isinstance(v, (str, PurePath)) and not
                                             str(v).strip() for v in values):
            name = action.metavar or action.dest.upper()
            raise UsageError(f"{args.command}: {name} is empty: name what to act on")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser, args = parse(argv)
    except UsageError as exc:
        print(f"build-env: error: {exc.args[0]}", file=sys.stderr)
        return exc.exit_code
    if not args.command:
        parser.print_help()
        return 2
    previous = signal.signal(signal.SIGTERM, signals.terminated)  # cleanup as for Ctrl-C
    try:
        code = run(parser, args, argv)
        sys.stdout.flush()  # a closed stdout shows here, not at exit
        return 128 + signal.SIGTERM if code == 130 and signals.received() else code
    except BrokenPipeError:
        return quiet_stdout()
    except KeyboardInterrupt:
        return interrupted()
    except OSError as exc:  # an unwritable or missing path, a full disk: no traceback
        return os_error(args.command, exc)
    finally:
        signal.signal(signal.SIGTERM, previous)


def request_errors() -> tuple[type[BaseException], ...]:
    """``requests``' errors, when a command imported it: a command that never did (``check``
    without ``--online``) cannot have raised one, and start-up does not pay for importing it."""
    module = sys.modules.get("requests")
    return (module.RequestException,) if module is not None else ()


def _check_env_index() -> None:
    """``VERL_ENV_INDEX_URL`` reaches uv, the metadata client and image builds: held to the
    same grammar as ``--index-url`` (exit 2, naming the variable)."""
    value = os.environ.get("VERL_ENV_INDEX_URL")
    if value:
        try:
            argtypes.index_url(value)
        except argparse.ArgumentTypeError as exc:
            raise BuildEnvError(f"VERL_ENV_INDEX_URL: {exc}") from None


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]) -> int:
    """The command, its errors as one line each with their exit code."""
    try:
        apply_config(parser, args, argv)
        if getattr(args, "matrix", "unset") is None:  # commands that read it get the default
            args.matrix = default_matrix()
        if getattr(args, "index_url", None):  # the site's index: metadata, uv, image builds
            os.environ["VERL_ENV_INDEX_URL"] = os.environ["UV_DEFAULT_INDEX"] = args.index_url
        _check_env_index()
        network_timeout()  # VERL_ENV_NETWORK_TIMEOUT held to its grammar by every command
        return BY_NAME[args.command].run(args)
    except BuildEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except request_errors() as exc:  # a call the module below did not name itself
        url = str(getattr(getattr(exc, "request", None), "url", None) or "the network")
        reason = exc.__class__.__name__ + (f": {exc.args[0]}" if exc.args else "")
        print(f"error: {NetworkError(url, redact(reason))}", file=sys.stderr)
        return NetworkError.exit_code
    except subprocess.TimeoutExpired as exc:  # a child (git, uv) that never answered
        command = " ".join(str(a) for a in exc.cmd[:3]) if isinstance(exc.cmd, list) else exc.cmd
        print(f"error: {args.command}: `{command}` did not finish in {exc.timeout:g} s",
              file=sys.stderr)
        return 3
