"""Reviewed YAML documents (the matrix, the upstream catalogue): read with every key's line, and
checked against their JSON Schema by :mod:`jsonschema`, each error naming ``file:line: key``.

One reader serves both, so a wrong type or an unknown key reads the same wherever a reviewed file
has it. Aliases and merge keys are expanded with a bound on the nodes (a "billion laughs" file
of a few hundred bytes would otherwise grow without bound); duplicate keys are errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from builder.errors import SpecError

MAX_NODES = 20_000  # the reference matrix has about 150

# how an error of this kind of document is made: (message, file, line, key) -> exception
ErrorMaker = Callable[..., Exception]


@dataclass(frozen=True)
class Doc:
    """A YAML document as plain data, with the line of every dotted key path."""

    file: str
    data: Any
    lines: dict[str, int] = field(default_factory=dict)

    def line(self, key: str) -> int | None:
        """The line of ``key``, else of the nearest key above it (a list item of a default)."""
        while key:
            if self.lines.get(key):
                return self.lines[key]
            key = re.sub(r"(\[[0-9]+\]|\.[^.\[]*)$", "", key) if key[-1] == "]" or "." in key \
                else ""
        return None


def read(path: str | Path, what: str, error: ErrorMaker = SpecError) -> Doc:
    """Read ``path`` (``what``: the document's name in messages, e.g. "matrix")."""
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror}", file=file) from None
    return parse(data, file, what, error)


def parse(data: bytes, file: str, what: str, error: ErrorMaker = SpecError) -> Doc:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise error(f"not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})",
                    file=file, line=line) from None
    node = compose(text, file, error)
    if node is None:
        raise error(f"empty {what} file", file=file)
    lines: dict[str, int] = {}
    return Doc(file, plain(node, "", lines, file, what, error), lines)


# libyaml's parser when PyYAML was built with it (20-40x faster on the shipped matrix); a text
# it refuses is parsed again by the pure-Python one, whose messages the errors below are made of.
FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def compose(text: str, file: str, error: ErrorMaker = SpecError) -> Any:
    try:
        return yaml.compose(text, Loader=FAST_LOADER)
    except yaml.YAMLError:
        pass
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise error(f"YAML syntax error: {exc.problem or exc}", file=file, line=line) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, BEL ...)
        line = text[:exc.position].count("\n") + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "?")
        raise error(f"YAML syntax error: character U+{code:04X} is not allowed in YAML "
                    f"(column {column})", file=file, line=line) from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise error(f"YAML error: {first}", file=file) from None


def plain(node: Any, path: str, lines: dict[str, int], file: str, what: str = "matrix",
          error: ErrorMaker = SpecError) -> Any:
    """Turn a composed node into plain python, recording each key's line under its dotted path.
    Aliases are expanded, at most ``MAX_NODES`` nodes in all."""
    lines[path] = node.start_mark.line + 1
    if len(lines) > MAX_NODES:
        raise error(f"the {what} expands to more than {MAX_NODES} YAML nodes (aliases "
                    "referring to aliases?)", file=file, line=node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        explicit = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
        loader = yaml.SafeLoader("")
        try:
            loader.flatten_mapping(node)  # YAML merge keys (<<: *anchor) keep their own lines
        except yaml.MarkedYAMLError as exc:
            line = exc.problem_mark.line + 1 if exc.problem_mark else None
            raise error(f"YAML merge error: {exc.problem}", file=file, line=line) from None
        finally:
            loader.dispose()
        merged = len(node.value) - explicit  # flatten_mapping puts merged pairs first
        out: dict[str, Any] = {}
        written: set[str] = set()  # keys written in this mapping itself (not merged in)
        for i, (knode, vnode) in enumerate(node.value):
            key = str(knode.value)
            sub = f"{path}.{key}" if path else key
            if key in written:
                raise error("duplicate key", file=file, line=knode.start_mark.line + 1, key=sub)
            if i >= merged:
                written.add(key)
            out.pop(key, None)  # an explicit key overrides a merged one
            out[key] = plain(vnode, sub, lines, file, what, error)
            lines[sub] = knode.start_mark.line + 1  # the key's line, not its value's
        return out
    if isinstance(node, yaml.SequenceNode):
        return [plain(v, f"{path}[{i}]", lines, file, what, error)
                for i, v in enumerate(node.value)]
    # Scalars: resolve with the safe constructor so 2.60 stays a float we can report on.
    return scalar(node)


def scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


# --------------------------------------------------------------------------- JSON Schema


def key_path(path: Iterator[Any] | Any) -> str:
    """A jsonschema error's absolute path as the dotted key the reader records."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _missing(err: jsonschema.ValidationError) -> str:
    """The first required property a ``required`` error's instance lacks."""
    if err.validator != "required" or not isinstance(err.instance, dict):
        return ""
    return next((str(k) for k in err.validator_value if k not in err.instance), "")


def _kind(value: Any) -> str:
    """The JSON type of a YAML value (``number`` for a float: YAML reads 3.10 as 3.1)."""
    for kind, types in (("boolean", bool), ("integer", int), ("number", float), ("string", str),
                        ("array", list), ("object", dict)):
        if isinstance(value, types):
            return kind
    return "null"


def _own_words(err: jsonschema.ValidationError) -> str | None:
    """The message the schema gives for this keyword (``x-messages: {KEYWORD: TEXT}`` beside it,
    or ``KEYWORD:KIND`` for an instance of one JSON type, e.g. ``type:number``), TEXT formatted with ``instance``, ``type`` (its python type's name), ``name`` (the last key)
    and ``missing`` (a ``required`` error's absent property)."""
    words = err.schema.get("x-messages", {}) if isinstance(err.schema, dict) else {}
    if not isinstance(words, dict):
        return None
    text = words.get(f"{err.validator}:{_kind(err.instance)}", words.get(str(err.validator)))
    if not isinstance(text, str):
        return None
    path = list(err.absolute_path)
    fields = {"instance": err.instance, "type": type(err.instance).__name__,
              "name": path[-1] if path else "", "missing": _missing(err)}
    # only these fields are replaced: other braces are the message's own text ({url, sha256})
    return _FIELD.sub(lambda m: repr(fields[m.group(1)]) if m.group(2) == "!r"
                      else str(fields[m.group(1)]), text)


_FIELD = re.compile(r"\{(instance|type|name|missing)(![rs])?\}")


def describe(err: jsonschema.ValidationError) -> tuple[str, str]:
    """(key, message) of one schema error, in the words a reviewer reads: the schema's own
    (``x-messages``) where it gives them."""
    key = key_path(err.absolute_path)
    v = err.validator
    own = _own_words(err)
    if own is not None:
        return key, own
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in allowed] if isinstance(err.instance, dict) \
            else []
        if extra:
            sub = f"{key}.{extra[0]}" if key else str(extra[0])
            return sub, f"unknown key {extra[0]!r} (allowed: {', '.join(allowed)})"
    if v == "required":
        return key, err.message.replace("is a required property", "is missing")
    if v == "type" and isinstance(err.instance, float) and "string" in err.validator_value:
        # YAML reads 3.10 as the number 3.1: refuse rather than silently mangle a version
        return key, f"write versions as quoted strings (got the number {err.instance!r})"
    if v == "type":
        want = err.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        word = {"object": "a mapping", "array": "a list", "string": "a string",
                "boolean": "true or false", "integer": "an integer"}.get(str(want), str(want))
        return key, f"expected {word}, got {err.instance!r}"
    if v == "enum":
        return key, f"must be one of {', '.join(map(str, err.validator_value))} " \
                    f"(got {err.instance!r})"
    return key, err.message


def validate(doc: Doc, schema: dict[str, Any], error: ErrorMaker = SpecError, at: str = ""
             ) -> None:
    """Raise ``error`` for the first (by position in the file) schema violation of ``doc``.
    ``at``: the dotted key ``doc.data`` sits at in its file (a part checked on its own, e.g. one
    entry once merged with its defaults): keys and lines are found below it."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = list(validator.iter_errors(doc.data))
    # a mapping with an unknown key and a missing one: the unknown key is named (often the
    # missing one misspelt)
    unknown = {tuple(e.absolute_path) for e in errors if e.validator == "additionalProperties"}
    errors = [e for e in errors if not (e.validator == "required"
                                        and tuple(e.absolute_path) in unknown)]
    if not errors:
        return

    def under(key: str) -> str:
        return key if not at else at + (key if key.startswith("[") else f".{key}" if key else "")

    found = [(doc.line(under(k)) or 0, under(k), m) for k, m in map(describe, errors)]
    line, key, message = min(found, key=lambda e: (e[0], -len(e[1])))
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in key)
    raise error(message, file=doc.file, line=line or None, key=shown or None)
