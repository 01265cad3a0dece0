"""Render a target into a complete, deterministic Docker build context (pure apart from file I/O).

Same inputs give byte-identical output: templates render with ``StrictUndefined``, every mapping
is sorted, nothing records the time or the host. Rendering first decides everything as a typed
context (:mod:`.context`, with the source builds of :mod:`.stages` and the per-package blocks of
:mod:`.blocks`), then renders the Dockerfile (:mod:`.dockerfile`) and writes the directory
(:mod:`.write`). What the image says about itself (manifest, labels) is :mod:`.baked`.
"""

from __future__ import annotations

from builder.render.write import BuildContext, render_context

__all__ = ["BuildContext", "render_context"]
