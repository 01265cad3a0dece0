"""``build-env slurm``'s options that shape requeue and resume (docs/slurm.md, "Requeue and
resume"), parsed into a :class:`builder.cluster.requeue.Resilience`."""

from __future__ import annotations

import argparse

from builder.cluster.requeue import (DEFAULT_BISECT_SECONDS, DEFAULT_MAX_REQUEUES,
                                     DEFAULT_SIGNAL_SECONDS, Resilience, validate)


def _whole(option: str) -> object:
    def parse(text: str) -> int:
        try:
            return int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} takes a whole number, not {text!r}") \
                from None
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``build-env slurm`` that shape requeue and resume."""
    group = parser.add_argument_group(
        "surviving the cluster (Slurm requeue; docs/slurm.md 'Requeue and resume')")
    group.add_argument("--max-requeues", type=_whole("--max-requeues"),
                       default=DEFAULT_MAX_REQUEUES, metavar="N",
                       help="a node that fails its self-test or is lost before training is "
                            "excluded and the job requeues itself, at most N times in all "
                            f"(default {DEFAULT_MAX_REQUEUES}; 0: off, the job stops there)")
    group.add_argument("--requeue-signal-seconds", type=_whole("--requeue-signal-seconds"),
                       default=DEFAULT_SIGNAL_SECONDS, metavar="S",
                       help="Slurm signals the job S seconds before its time limit or a "
                            "preemption (#SBATCH --signal=B:USR1@S); the job lets verl finish "
                            "its checkpoint, stops and requeues itself, and the next attempt "
                            f"resumes (default {DEFAULT_SIGNAL_SECONDS}; 0: off)")
    group.add_argument("--bisect-seconds", type=_whole("--bisect-seconds"),
                       default=DEFAULT_BISECT_SECONDS, metavar="S",
                       help="when the cross-node collective fails and no node failed its own "
                            "checks, test node subsets for at most S seconds to find the node "
                            "to exclude (default "
                            f"{DEFAULT_BISECT_SECONDS}; 0: off)")


def from_args(args: argparse.Namespace) -> Resilience:
    """The :class:`Resilience` of parsed options (validated)."""
    return validate(Resilience(
        max_requeues=getattr(args, "max_requeues", DEFAULT_MAX_REQUEUES),
        signal_seconds=getattr(args, "requeue_signal_seconds", DEFAULT_SIGNAL_SECONDS),
        bisect_seconds=getattr(args, "bisect_seconds", DEFAULT_BISECT_SECONDS)))


__all__ = ["add_arguments", "from_args"]
