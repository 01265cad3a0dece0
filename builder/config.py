"""The site config file, ``build-env.toml`` beside the matrix (or in the working directory when
the shipped reference matrix is used): the defaults a site always passes. Flags given on the
command line win over it; it wins over the built-in defaults.

    tag_prefix = "registry.example/verl-env"   # --tag-prefix
    registry = "registry.example/verl-env"     # build --push, publish --registry
    sign_key = "keys/verl-env.key"             # --sign-key (relative to this file)
    index_url = "https://pypi.mirror.example/simple"   # --index-url
    ca_bundle = "/etc/ssl/certs/site-ca.pem"   # --ca-bundle
    require = "gpu"                            # --require: the verdict level a release needs
    [slurm]                                    # any `build-env slurm` option, by its name
    partition = "gpu"
    account = "rl-team"

Every value is checked against the option it sets, by that option's own definition (its type,
range, choices; a flag takes true or false; an option given several times takes a list), a
``[slurm]`` number also by the Slurm job's own bounds (``nodes`` 1 to 4096 ...), whatever the
command, and a bad one is refused naming file:line:key (:mod:`builder.commands._config`); the
lines are read from the TOML text (:func:`key_lines`), as tomllib tells none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.errors import SpecError

FILENAME = "build-env.toml"
# key -> (type, the option destinations it fills, whether it is a path)
KEYS: dict[str, tuple[type, tuple[str, ...], bool]] = {
    "tag_prefix": (str, ("tag_prefix",), False),
    "registry": (str, ("push", "registry"), False),
    "sign_key": (str, ("sign_key",), True),
    "index_url": (str, ("index_url",), False),
    "ca_bundle": (str, ("ca_bundle",), True),
    "require": (str, ("require",), False),
}
SECTIONS = {"slurm"}  # per-command tables: their keys are that command's option names


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    values: dict[str, Any] = field(default_factory=dict)  # option destination -> value
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)  # "key" or "section.key" -> its line

    def line(self, key: str) -> int | None:
        """The line ``key`` (``name`` or ``section.name``) is set on, when it can be told."""
        return self.lines.get(key)

    def for_command(self, command: str) -> dict[str, Any]:
        """dest -> value for ``command`` (its own table over the top-level keys)."""
        return {**self.values, **{k.replace("-", "_"): v
                                  for k, v in self.sections.get(command, {}).items()}}


def find(matrix: Path | None) -> Path | None:
    """``build-env.toml`` beside the site's matrix; without ``--matrix``, in the working
    directory (where ``./matrix.yaml`` would be)."""
    here = (Path(matrix).resolve().parent if matrix else Path.cwd()) / FILENAME
    return here if here.is_file() else None


_STRING = r"""(?:"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""  # a one-line basic or literal string
_PART = rf"(?:[A-Za-z0-9_-]+|{_STRING})"
_DOTTED = rf"{_PART}(?:\s*\.\s*{_PART})*"
_TABLE = re.compile(rf"^\s*\[\[?\s*({_DOTTED})\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(rf"^\s*({_DOTTED})\s*=\s*")
# inside an inline table: a key, a string value (skipped whole), a table opened or closed
_INLINE = re.compile(rf"({_DOTTED})\s*=|{_STRING}|(\{{)|(\}})")


def _parts(dotted: str) -> list[str]:
    """``a."b.c".d`` -> ``["a", "b.c", "d"]``."""
    return [p[1:-1] if p[:1] in "\"'" else p for p in re.findall(_PART, dotted)]


def _inline(body: str, prefix: str, number: int, lines: dict[str, int]) -> None:
    """The keys of an inline table (``slurm = { nodes = 2, x = { y = 1 } }``) on its line."""
    stack, last = [prefix], prefix
    for match in _INLINE.finditer(body):
        if match.group(1) is not None:
            last = stack[-1] + ".".join(_parts(match.group(1)))
            lines.setdefault(last, number)
        elif match.group(2) is not None:
            stack.append(last + ".")
        elif match.group(3) is not None and len(stack) > 1:
            stack.pop()


def key_lines(text: str) -> dict[str, int]:
    """Where each key of a (parsed, so valid) TOML text is set (tomllib tells no lines): ``key``
    or ``table.key`` -> its 1-based line, for ``[table]`` keys, dotted keys (``slurm.nodes =``),
    quoted ones and an inline table's (``slurm = {nodes = 2}``); the lines inside a multi-line
    string are no keys (the first assignment of a name wins)."""
    lines: dict[str, int] = {}
    table, closing = "", ""
    for number, line in enumerate(text.splitlines(), 1):
        if closing:  # inside a multi-line string: until its closing quotes
            if closing in line:
                closing = ""
            continue
        if (header := _TABLE.match(line)) is not None:
            table = ".".join(_parts(header.group(1))) + "."
        elif (key := _KEY.match(line)) is not None:
            name = table + ".".join(_parts(key.group(1)))
            lines.setdefault(name, number)
            value = line[key.end():]
            if value.startswith("{"):
                _inline(value[1:], name + ".", number, lines)
            for quotes in ('"""', "\'\'\'"):
                if value.startswith(quotes) and value.count(quotes) == 1:
                    closing = quotes
    return lines


def load(path: Path | None) -> Config:
    if path is None:
        return Config()
    import tomllib  # lazy: a site without a build-env.toml (most runs) never parses TOML
    file = str(path)
    try:
        text = path.read_bytes().decode("utf-8")
        data = tomllib.loads(text)
    except OSError as exc:
        raise SpecError(f"cannot read config: {exc.strerror}", file=file) from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"not UTF-8 text (byte {exc.start})", file=file) from None
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)  # Python 3.11's error has no lineno attribute: "... (at line N, ...)"
        found = re.search(r"\(at line (\d+), column \d+\)", text)
        raise SpecError(f"TOML syntax error: {re.sub(r' ?[(]at line .*[)]', '', text)}",
                        file=file, line=int(found.group(1)) if found else None) from None
    values: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    lines = key_lines(text)
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise SpecError(f"[{key}] must be a table", file=file, line=lines.get(key),
                                key=key)
            sections[key] = dict(value)
            continue
        if key not in KEYS:
            known = ", ".join(sorted({*KEYS, *SECTIONS}))
            raise SpecError(f"unknown key (known: {known})", file=file, line=lines.get(key),
                            key=key)
        kind, dests, is_path = KEYS[key]
        if not isinstance(value, kind):
            raise SpecError(f"expected a {kind.__name__}, got {value!r}", file=file,
                            line=lines.get(key), key=key)
        resolved: Any = (path.parent / str(value)).resolve() if is_path else value
        for dest in dests:
            values[dest] = resolved
    return Config(path, values, sections, lines)
