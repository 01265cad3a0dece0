"""The Dockerfile: ``Dockerfile.j2`` rendered from a :class:`RenderContext` with ``StrictUndefined``
(a variable the template reads and the context lacks is an error, never an empty string)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jinja2

from builder import shipped
from builder.errors import RenderError
from builder.render.context import RenderContext


def environment(templates: Path | None = None) -> jinja2.Environment:
    """Templates from ``dockerfiles/`` (shipped in the wheel: :mod:`builder.shipped`); a site's
    ``--templates DIR`` is searched first, falling back to the shipped ones per file."""
    loaders: list[jinja2.BaseLoader] = []
    if templates is not None:
        if not any((templates / name).is_file() for name in ("Dockerfile.j2", "_macros.j2")):
            raise RenderError(f"--templates {templates}: holds neither Dockerfile.j2 nor "
                              "_macros.j2")
        loaders.append(jinja2.FileSystemLoader(str(templates)))
    loaders.append(jinja2.FileSystemLoader(str(shipped.dockerfiles_dir())))
    env = jinja2.Environment(loader=jinja2.ChoiceLoader(loaders),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["sh"] = shell_word
    env.filters["dockerfile_string"] = dockerfile_string
    return env


def shell_word(value: object) -> str:
    """``value`` as one shell word (``shlex.quote``; a plain word stays as it is). A line break
    cannot be quoted into a Dockerfile line, so one is refused."""
    text = str(value)
    if any(c in text for c in "\n\r\x85\u2028\u2029"):
        raise RenderError(f"{text!r}: a line break cannot be written into a Dockerfile")
    return shlex.quote(text)


def dockerfile_string(value: object) -> str:
    """``value`` as one double-quoted Dockerfile word (LABEL, ENV): JSON escapes, and ``$``
    escaped so the Dockerfile's own variable expansion leaves it as written."""
    text = json.dumps(str(value), ensure_ascii=False).replace("$", "\\$")
    for sep in "\x85\u2028\u2029":  # JSON leaves them as they are; a Dockerfile line may not
        text = text.replace(sep, f"\\u{ord(sep):04x}")
    return text


def render_dockerfile(ctx: RenderContext, templates: Path | None = None) -> str:
    """The Dockerfile of ``ctx``; ``templates``: a site's own template directory."""
    env = environment(templates)
    env.globals["site_index"] = ctx.site_index  # read by _macros.j2's ca_mount
    try:
        return env.get_template("Dockerfile.j2").render(**ctx.template_vars())
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc}", target=ctx.target.name) from None
