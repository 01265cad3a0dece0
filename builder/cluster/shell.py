"""Shell text for the job script: a word quoted so that only ``$NAME``/``${NAME}`` expand
(:func:`shell_word`), a command word kept as one (:func:`quote_keep_vars`), and a training
command split like a shell would (:func:`train_argv`)."""

from __future__ import annotations

import re
import shlex

from builder.errors import SlurmError

_VAR_REF = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def quote_keep_vars(word: str) -> str:
    """shlex-quote ``word`` for train_argv() while keeping it one word; ``$VAR`` survives since
    shell_word() re-opens those references."""
    return shlex.quote(word) if re.search(r"[^\w@%+=:,./${}-]", word) else word


def shell_word(text: str) -> str:
    """Quote ``text`` as one double-quoted shell word in which only ``$NAME`` and ``${NAME}``
    expand; every other ``$``, backquote, backslash and quote is literal. Raises ValueError on
    control characters."""
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"{text!r} contains control characters")
    out, pos = [], 0
    for match in _VAR_REF.finditer(text):
        out.append(escape(text[pos:match.start()]))
        out.append(match.group(0))
        pos = match.end()
    out.append(escape(text[pos:]))
    return '"' + "".join(out) + '"'


def escape(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def train_argv(cmd: str) -> list[str]:
    """Split the training command like a shell would (no pipes, redirections or ``$(...)``)."""
    try:
        argv = shlex.split(cmd)
    except ValueError as exc:
        raise SlurmError(f"cannot split the training command: {exc}") from None
    if any(tok in {"|", "||", "&&", ";", "&", ">", "<"} for tok in argv):
        raise SlurmError("the training command must be one command; wrap pipelines in "
                         "`bash -c '...'` inside the image")
    return argv

