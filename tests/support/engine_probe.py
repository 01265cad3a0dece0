"""Looking behind the engine interface in tests: what build-env left in the engine.

The tool itself never lists its leftovers (a run removes its containers, and
:meth:`builder.engine.Engine.remove_orphans` those of runs that died); the tests that prove it ask
the SDK client behind the Docker engine directly.
"""

from __future__ import annotations

from builder.engine import OWNER_LABEL, Engine


def leftover_containers(engine: Engine) -> list[str]:
    """The names of the containers, running or not, that carry build-env's owner label."""
    return [c.name for c in engine.client.containers.list(all=True,
                                                          filters={"label": OWNER_LABEL})]
