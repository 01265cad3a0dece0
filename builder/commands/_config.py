"""The site config (``build-env.toml``, :mod:`builder.config`) applied to a parsed command line,
each value typed by the very option it sets: the argparse action's own ``type`` (with the range
checks of :mod:`builder.argtypes`), ``choices``, flag-ness (``store_true``/``store_false``:
true or false, never a string) and ``nargs``/``append`` (a list). Nothing here lists options by
hand, so it follows every command's options as they change. A bad value is a SpecError naming
file:line:key; flags given on the command line win over the file."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from builder import config
from builder.errors import SlurmError, SpecError

_FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
          argparse.BooleanOptionalAction)
_NAMES = {int: "an integer", float: "a number", str: "a string"}


class BadValue(ValueError):
    """A config value the option does not take (the message says why)."""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings}


def _scalar(action: argparse.Action, value: Any) -> Any:
    """One value as ``action`` would have parsed it from the command line."""
    if isinstance(value, bool):
        raise BadValue(f"expected {_expected(action)}, got {str(value).lower()} (a flag value)")
    if isinstance(value, (dict, list)):
        raise BadValue(f"expected {_expected(action)}, got {value!r}")
    kind = action.type
    if kind is None or kind is str:
        if not isinstance(value, str):
            raise BadValue(f"expected a string, got {value!r}")
        converted: Any = value
    else:
        assert callable(kind)
        try:
            converted = kind(str(value))
        except argparse.ArgumentTypeError as exc:
            raise BadValue(f"{exc} (got {value!r})") from None
        except (TypeError, ValueError):
            raise BadValue(f"expected {_expected(action)}, got {value!r}") from None
    if action.choices is not None and converted not in action.choices:
        shown = ", ".join(repr(c) for c in action.choices)
        raise BadValue(f"expected one of {shown}, got {value!r}")
    return converted


def _expected(action: argparse.Action) -> str:
    kind = action.type
    if kind in _NAMES:
        return _NAMES[kind]  # type: ignore[index]
    if action.metavar:
        return f"a {action.metavar}"
    return f"a value for --{action.dest.replace('_', '-')}"


def typed(action: argparse.Action, value: Any) -> Any:
    """``value`` (as TOML gave it) as the value ``action`` stores; raises :class:`BadValue`."""
    if isinstance(action, _FLAGS):
        if not isinstance(value, bool):
            raise BadValue(f"expected true or false, got {value!r}")
        if isinstance(action, argparse._StoreConstAction) and not isinstance(
                action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return action.const if value else action.default
        return value
    if isinstance(action, argparse._CountAction):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadValue(f"expected an integer >= 0, got {value!r}")
        return value
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*") or (
        isinstance(action.nargs, int) and action.nargs != 1 and action.nargs > 0)
    if many:
        items = value if isinstance(value, list) else [value]
        if action.nargs == "+" and not items:
            raise BadValue("expected at least one value, got []")
        return [_scalar(action, item) for item in items]
    return _scalar(action, value)


def _check(cfg: config.Config, key: str, action: argparse.Action, value: Any) -> Any:
    try:
        return typed(action, value)
    except BadValue as exc:
        raise SpecError(str(exc), file=str(cfg.path), line=cfg.line(key), key=key) from None


def _job_refusal(values: dict[str, Any]) -> tuple[str, str] | None:
    """(the key, why) of a ``[slurm]`` number the Slurm job model (:mod:`builder.cluster.job`,
    what ``build-env slurm`` makes of its options) refuses whatever the family: its range
    (``nodes`` 1 to 4096 ...). ``values``: key -> typed value; the numbers that fill a field of
    the job are held to it, together and each alone. What depends on the family or on other
    options (a cuda job's GPUs) is left to the job the command makes."""
    from builder.cluster import job  # the job model, only where a [slurm] table is given

    names = {f.name for f in fields(job.SlurmJob)}
    numbers = {key: (dest, value) for key, value in values.items()
               if (dest := key.rsplit(".", 1)[-1].replace("-", "_")) in names
               and isinstance(value, int) and not isinstance(value, bool)}

    def refused(given: dict[str, int]) -> str | None:
        reasons: list[str] = []
        for family in job.FAMILY_NAMES:
            try:
                job.SlurmJob(target="t", family=family, sif="/x.sif", train_cmd="true", **given)
                return None
            except SlurmError as exc:
                reasons.append(str(exc.args[0]))
        return reasons[0]

    if not numbers or refused(dict(numbers.values())) is None:
        return None
    for key, (dest, value) in numbers.items():
        if (why := refused({dest: value})) is not None:
            return key, why
    return None


def check(parser: argparse.ArgumentParser, cfg: config.Config) -> None:
    """Every key of ``cfg`` against the option it sets, whatever the command: a table's keys
    against that command's options (an unknown one is refused), a top-level key against the
    first command that takes it."""
    commands = _subparsers(parser)
    for section, table in cfg.sections.items():
        actions = _options(commands[section]) if section in commands else {}
        typed_values: dict[str, Any] = {}
        for name, value in table.items():
            key = f"{section}.{name}"
            action = actions.get(name.replace("-", "_"))
            if action is None:
                raise SpecError(f"`build-env {section}` has no option "
                                f"--{name.replace('_', '-')}", file=str(cfg.path),
                                line=cfg.line(key), key=key)
            typed_values[key] = _check(cfg, key, action, value)
        if section == "slurm" and (refusal := _job_refusal(typed_values)) is not None:
            key, why = refusal
            raise SpecError(why, file=str(cfg.path), line=cfg.line(key), key=key)
    for key, dests in config_dests().items():
        if not any(dest in cfg.values for dest in dests):
            continue
        for dest in dests:
            action = next((a for sub in commands.values()
                           if (a := _options(sub).get(dest)) is not None), None)
            if action is not None:
                _check(cfg, key, action, cfg.values[dest])
                break


def config_dests() -> dict[str, tuple[str, ...]]:
    """Top-level key -> the option destinations it fills."""
    return {key: dests for key, (_, dests, _) in config.KEYS.items()}


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    return any(a == o or a.startswith(o + "=") for a in argv for o in action.option_strings)


def apply(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str],
          whole: Callable[[], argparse.ArgumentParser] | None = None) -> None:
    """Check the whole ``build-env.toml`` of the site, then fill what the command line left out
    for this command (flags win). ``parser`` may hold only this command; ``whole`` makes the
    parser of every command, which the file's other tables are checked against."""
    cfg = config.load(config.find(getattr(args, "matrix", None)))
    if cfg.path is None:
        return
    check(whole() if whole is not None else parser, cfg)
    actions = _options(_subparsers(parser)[args.command])
    section = cfg.sections.get(args.command, {})
    keys = {name.replace("-", "_"): f"{args.command}.{name}" for name in section}
    for dest, value in cfg.for_command(args.command).items():
        action = actions.get(dest)
        if action is None or _given(action, argv):
            continue
        key = keys.get(dest) or next(k for k, d in config_dests().items() if dest in d)
        setattr(args, dest, _check(cfg, key, action, value))
