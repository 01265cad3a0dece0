"""How a generated Slurm job survives the cluster (issue 39): a bad node routed around and a
preemption or time limit resumed, both through Slurm's own requeue.

* ``max_requeues``: when a node fails its self-test, is lost before training, or cannot run a
  step, the job names it, excludes it (``scontrol update JobId=… ExcNodeList=…``, keeping the
  nodes earlier attempts excluded) and requeues itself (``scontrol requeue``), at most this many
  times in all (Slurm's ``SLURM_RESTART_COUNT`` counts them). 0 turns it off: the job stops at
  the failing stage, naming the node, as before.
* ``signal_seconds``: ``#SBATCH --signal=B:USR1@SECONDS``: Slurm signals the batch script that
  many seconds before the time limit (and a site's preemption with a grace time does the same);
  the job stops the trainer once verl's next checkpoint is written (or the grace is spent) and
  requeues itself, so the next attempt resumes from verl's last checkpoint
  (``trainer.resume_mode=auto``). 0 turns it off.
* ``bisect_seconds``: when the cross-node collective fails (or falls far below its reference)
  and no node failed its own checks, the job runs the collective again on node subsets, an
  anchor node with half the suspects at a time, to find the one node that fails with every
  healthy partner, for at most this many seconds; that node is then routed around as above.
  0 turns it off (the job stops at the self-test, naming no node).

The options are parsed by :mod:`builder.commands._requeue`; the templates read a
:class:`Resilience` as ``resilience``.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.errors import SlurmError

DEFAULT_MAX_REQUEUES = 1
DEFAULT_SIGNAL_SECONDS = 300
DEFAULT_BISECT_SECONDS = 600
MAX_BISECT_SECONDS = 86400  # a typo guard: the bisection spends the allocation's time
MAX_SIGNAL_SECONDS = 65535  # Slurm's --signal takes 0..65535 seconds
MAX_REQUEUES_CEILING = 100  # a typo guard: every requeue waits in the queue again


@dataclass(frozen=True)
class Resilience:
    """What the job does about a bad node and about Slurm's warning signal."""

    max_requeues: int = DEFAULT_MAX_REQUEUES
    signal_seconds: int = DEFAULT_SIGNAL_SECONDS
    bisect_seconds: int = DEFAULT_BISECT_SECONDS

    @property
    def requeues(self) -> bool:
        """The job may requeue itself (for either reason): ``#SBATCH --requeue``."""
        return self.max_requeues > 0 or self.signal_seconds > 0

    def sbatch_options(self) -> list[tuple[str, str | None]]:
        """The #SBATCH lines these choices need. ``open-mode=append``: a requeued attempt
        writes after the earlier attempts' output instead of truncating it."""
        out: list[tuple[str, str | None]] = []
        if self.requeues:
            out += [("requeue", None), ("open-mode", "append")]
        if self.signal_seconds > 0:
            out.append(("signal", f"B:USR1@{self.signal_seconds}"))
        return out

    def stop_grace(self) -> int:
        """Seconds the job waits for verl's next checkpoint after the signal before it stops
        the trainer: most of the warning, leaving 30 s (at least 5) to stop and requeue."""
        return max(self.signal_seconds - max(30, self.signal_seconds // 5), 5) \
            if self.signal_seconds > 0 else 0


def validate(value: Resilience) -> Resilience:
    """Raise :class:`SlurmError` naming the option whose value cannot work."""
    if not isinstance(value.max_requeues, int) or isinstance(value.max_requeues, bool) or \
            not 0 <= value.max_requeues <= MAX_REQUEUES_CEILING:
        raise SlurmError(f"--max-requeues must be a whole number from 0 (off) to "
                         f"{MAX_REQUEUES_CEILING}, not {value.max_requeues!r}")
    if not isinstance(value.signal_seconds, int) or isinstance(value.signal_seconds, bool) or \
            not 0 <= value.signal_seconds <= MAX_SIGNAL_SECONDS:
        raise SlurmError(f"--requeue-signal-seconds must be a whole number of seconds from 0 "
                         f"(off) to {MAX_SIGNAL_SECONDS}, not {value.signal_seconds!r}")
    if not isinstance(value.bisect_seconds, int) or isinstance(value.bisect_seconds, bool) or \
            not 0 <= value.bisect_seconds <= MAX_BISECT_SECONDS:
        raise SlurmError(f"--bisect-seconds must be a whole number of seconds from 0 (off) to "
                         f"{MAX_BISECT_SECONDS}, not {value.bisect_seconds!r}")
    return value


__all__ = ["Resilience", "validate", "DEFAULT_BISECT_SECONDS", "DEFAULT_MAX_REQUEUES",
           "DEFAULT_SIGNAL_SECONDS"]
