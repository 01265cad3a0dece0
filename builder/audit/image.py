"""The installed distributions of an image in the engine: :mod:`builder.audit.installed` runs in
a throw-away container of the image (no network, nothing mounted, so a remote engine works too)
under the image's own Python, and prints what it found. Only :mod:`builder.engine` speaks
Docker; this module asks it to run one command, as the SBOM inventory does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.audit import installed
from builder.engine import ContainerEngine
from builder.errors import BuildEnvError

# Runs under /bin/sh in the image: the first Python it has runs the reader ($0).
_LAUNCH = ('for PY in /opt/venv/bin/python /usr/local/bin/python3 /usr/bin/python3 python3 '
           'python; do if command -v "$PY" >/dev/null 2>&1; then exec "$PY" -c "$0"; fi; done; '
           'echo "no python in image" >&2; exit 3')


class AuditError(BuildEnvError):
    """The image's installed metadata could not be read (the container did not run the reader,
    or it printed nothing readable): exit 3, the audit could not run."""

    stage = "audit"
    exit_code = 3


def read_image(engine: ContainerEngine, image: str, *, timeout: float = 300) -> dict[str, Any]:
    """{interpreters, paths, distributions} of ``image`` (an ID or reference)."""
    script = Path(installed.__file__).read_text()
    result = engine.run(image, ["-c", _LAUNCH, script], entrypoint=["/bin/sh"], timeout=timeout,
                        network="none", shm_size="64m", role="audit")
    if result.exit_code != 0 or installed.MARKER not in result.logs:
        raise AuditError(f"{image[:19]}: reading the installed metadata failed (exit "
                         f"{result.exit_code}): {result.logs[-1500:].strip()}")
    try:
        data = json.loads(result.logs.split(installed.MARKER, 1)[1].strip().splitlines()[0])
    except (ValueError, IndexError) as exc:
        raise AuditError(f"{image[:19]}: the metadata reader printed no JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("distributions"), list):
        raise AuditError(f"{image[:19]}: the metadata reader printed no distribution list")
    return data
