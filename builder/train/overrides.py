"""Values in hydra's override grammar (hydra-core 1.3's ``OverrideLexer.g4``), without hydra:
:func:`quote` makes any text one string value hydra reads back as that text (single quotes,
``\\'`` and the backslashes before a quote doubled, when the text holds anything the unquoted
grammar does not take: a space, a comma, ``=``, a quote, a bracket, a non-ASCII letter, a shell
``$VAR`` whose value the nodes decide); :func:`unquote` and :func:`items` read such values back;
:func:`problem` says why a user's ``KEY=VALUE`` value is not one value hydra takes (a comma
outside quotes is a sweep, which ``verl.trainer.main_ppo`` refuses), or None.

Pure and standard-library only: build-env does not depend on hydra; tests/train/test_hydra.py
holds these to hydra's own parser where hydra-core is installed."""

from __future__ import annotations

import re

#: What an unquoted value may hold and still be one plain string (a subset of hydra's
#: ID/UNQUOTED_CHAR/COLON tokens: no whitespace, no interpolation).
_PLAIN = re.compile(r"[A-Za-z0-9_/.+@%:-]+")
#: Characters hydra's value lexer takes outside quotes (ASCII letters and digits, the
#: UNQUOTED_CHARs, ':', whitespace, the brackets and the list comma, ``\\`` escapes).
_UNQUOTED = re.compile(r"[A-Za-z0-9_/\-\\+.$%*@?|: \t\[\]{},]")
_VAR = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def quote(text: str) -> str:
    """``text`` as one hydra string value: as it is when the plain grammar holds it, else in
    single quotes. A ``$NAME``/``${NAME}`` (expanded by the job's shell before hydra reads the
    word) is quoted too: its value may hold anything."""
    if _PLAIN.fullmatch(text) and not _VAR.search(text):
        return text
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)
    return f"'{body}'"


def unquote(value: str) -> str:
    """One primitive value as hydra reads it: a quoted string's text (its escapes undone), or
    the unquoted text stripped of surrounding whitespace."""
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        q = text[0]
        return re.sub(r"(\\+)(" + q + "|$)",
                      lambda m: "\\" * (len(m.group(1)) // 2) + m.group(2), text[1:-1])
    return re.sub(r"\\([\\()\[\]{}:=, \t])", r"\1", text)


def _split(body: str) -> list[str]:
    """A list's body split at its top-level commas (quotes and nested brackets kept)."""
    out, depth, quote_char, start, i = [], 0, "", 0, 0
    while i < len(body):
        c = body[i]
        if quote_char:
            if c == "\\":
                i += 1
            elif c == quote_char:
                quote_char = ""
        elif c in "'\"":
            quote_char = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(body[start:i])
            start = i + 1
        i += 1
    out.append(body[start:])
    return out


def items(value: str) -> list[str]:
    """A value as the strings it names: a list ``[a,'b c']`` item by item, else the one value
    (each unquoted)."""
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        return [unquote(i) for i in _split(text[1:-1]) if i.strip()]
    return [unquote(text)]


def _scan(value: str) -> str | None:
    stack: list[str] = []
    i = 0
    while i < len(value):
        c = value[i]
        if c in "'\"":
            end = re.match(r"(?:[^\\%s]|\\.)*%s" % (c, c), value[i + 1:], re.S)
            if end is None:
                return f"an unterminated {c} quote"
            before, i = value[:i].rstrip(), i + 1 + end.end()
            after = value[i:].lstrip()
            if (before and before[-1] not in "[{,:") or (after and after[0] not in "]},:"):
                return "a quote inside a value (quote the whole value)"
            continue
        if c == "\\" and value[i + 1:i + 2] in tuple("\\()[]{}:=, \t"):
            i += 2
            continue
        if c == "$" and value[i + 1:i + 2] == "{":
            close = value.find("}", i)
            if close < 0:
                return "an unclosed ${"
            i = close + 1
            continue
        if not _UNQUOTED.fullmatch(c):
            return f"{c!r} outside quotes"
        if c in "[{" and value[:i].rstrip()[-1:] not in ("", "[", "{", ",", ":"):
            return f"a {c!r} inside a value (quote the whole value)"
        if c in "]}" and value[i + 1:].lstrip()[:1] not in ("", "]", "}", ","):
            return f"a {c!r} inside a value (quote the whole value)"
        if c in "[{":
            stack.append("]" if c == "[" else "}")
        elif c in "]}" and (not stack or stack.pop() != c):
            return f"a {c!r} without its opening bracket"
        if c == "," and not stack:
            return "a comma outside quotes or brackets (hydra reads a sweep, which verl refuses)"
        i += 1
    return "an unclosed bracket" if stack else None


def problem(value: str) -> str | None:
    """Why ``value`` (what follows ``KEY=``) is not one value hydra takes, or None. Checks what
    hydra's lexer and a plain (non-sweep) override need; a value it passes may still be one
    verl's configuration rejects (the train check runs verl's)."""
    if "=" in value.replace("\\=", "") and not value.lstrip().startswith(("[", "{", "'", '"')):
        return "an '=' outside quotes"
    if re.search(r"[()]", re.sub(r"'[^']*'|\"[^\"]*\"|\\.", "", value)):
        return "a parenthesis outside quotes (hydra reads a sweep function)"
    tail = value.rstrip()
    if value != tail and tail[-1:] in ("]", "}", "'", '"') and tail[-2:-1] != "\\":
        return "whitespace after the value"
    if re.search(r"[\[{,]\s*,|,\s*[\]}]", re.sub(r"'[^']*'|\"[^\"]*\"", "''", value)):
        return "an empty list item"
    return _scan(value)


def suggestion(key: str, value: str) -> str:
    """The override with ``value`` as one quoted string (what to type instead)."""
    text = unquote(value) if value[:1] in ("'", '"') else value
    return f"{key}={quote(text)}"
