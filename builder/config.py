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
range, choices; a flag takes true or false; an option given several times takes a list), and a
bad one is refused naming file:line:key (:mod:`builder.commands._config`).
"""

from __future__ import annotations

import re
import tomllib
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


_TABLE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"^\s*([\"']?)([A-Za-z0-9_-]+)\1\s*=")


def key_lines(text: str) -> dict[str, int]:
    """Where each key of a (parsed, so valid) TOML text is set: ``key`` or ``table.key`` -> its
    1-based line (keys of multi-line values' continuation lines are not keys: the first
    assignment of a name in a table wins)."""
    lines: dict[str, int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        if (header := _TABLE.match(line)) is not None:
            table = header.group(1) + "."
        elif (key := _KEY.match(line)) is not None:
            lines.setdefault(table + key.group(2), number)
    return lines


def load(path: Path | None) -> Config:
    if path is None:
        return Config()
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
