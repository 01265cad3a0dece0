"""The Dockerfile: ``Dockerfile.j2`` rendered from a :class:`RenderContext` with ``StrictUndefined``
(a variable the template reads and the context lacks is an error, never an empty string)."""

from __future__ import annotations

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
    return jinja2.Environment(loader=jinja2.ChoiceLoader(loaders),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


def render_dockerfile(ctx: RenderContext, templates: Path | None = None) -> str:
    """The Dockerfile of ``ctx``; ``templates``: a site's own template directory."""
    env = environment(templates)
    env.globals["site_index"] = ctx.site_index  # read by _macros.j2's ca_mount
    try:
        return env.get_template("Dockerfile.j2").render(**ctx.template_vars())
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc}", target=ctx.target.name) from None
