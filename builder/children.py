"""A child process that never outlives the command that started it.

``subprocess.run`` kills its child when the wait is interrupted (Ctrl-C, or SIGTERM raised as
KeyboardInterrupt by :mod:`builder.engine.signals`) but, for KeyboardInterrupt, waits only a
quarter of a second for it to die: a child still in uninterruptible disk I/O is then left behind,
adopted by init, after ``build-env`` has said "terminated". :func:`run` kills and reaps it first.
Pure stdlib.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

#: How long a killed child may take to die (one that is writing to a slow disk finishes the
#: write first); past it the command goes on rather than hang.
REAP_S = 30.0


def run(cmd: Sequence[str], *, timeout: float | None = None, text: bool = True,
        **popen: object) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(cmd, capture_output=True, text=text, timeout=timeout, **popen)``, except
    that on a timeout or any interruption the child is killed and waited for before the
    exception goes on (``subprocess.TimeoutExpired`` stays what a timeout raises). ``text=False``
    gives the output as bytes (an archive)."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=text, **popen)  # type: ignore[call-overload]
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        try:
            proc.communicate(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            pass
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
