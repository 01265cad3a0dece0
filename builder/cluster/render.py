"""Render sbatch scripts that run verl on several nodes from a verified image: a
:class:`~builder.cluster.job.SlurmJob` into shell text (jinja2, ``StrictUndefined``). What the
script does, stage by stage, is documented in ``docs/slurm.md`` and in the template's header.
The template is ``templates/job/main.j2`` with one include per stage and one per runtime
(``job/runtime/``)."""

from __future__ import annotations

import base64
import functools
import os
import shlex
from dataclasses import fields
from pathlib import Path

import jinja2

from builder.cluster.job import FAMILY_PROFILES, SlurmJob, training_command, validate
from builder.cluster.ports import port_span
from builder.cluster.requeue import Resilience, validate as validate_resilience
from builder.cluster.runtime import (CLEAN_START_NAMES, MIN_SLURM, PASSED_NAMES, PASSED_PREFIXES,
                                     RUNTIME_PARTS, job_devices, pyxis_image, sif_cache_name)
from builder.cluster.shell import escape, shell_word, train_argv
from builder.files import atomic_write_text
from builder.train.shapes import engine_args, train_shape

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE = "job/main.j2"


def sbatch_options(job: SlurmJob) -> list[tuple[str, str | None]]:
    """The #SBATCH lines beyond the tasks per node, only for what was asked."""
    out: list[tuple[str, str | None]] = []
    for option, value in (("nodes", job.nodes), ("cpus-per-task", job.cpus_per_task),
                          ("gpus-per-node", job.gpus_per_node), ("mem", job.mem),
                          ("partition", job.partition), ("account", job.account),
                          ("qos", job.qos), ("constraint", job.constraint),
                          ("reservation", job.reservation), ("time", job.time)):
        if value:
            out.append((option, str(value)))
    if job.exclusive:
        out.append(("exclusive", None))
    return out + resilience_of(job).sbatch_options()


def resilience_of(job: SlurmJob) -> Resilience:
    """The job's requeue and resume choices (the defaults when it carries none)."""
    value = getattr(job, "resilience", None)
    return validate_resilience(value if isinstance(value, Resilience) else Resilience())


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    """One environment per process: its templates are compiled once, not on every render
    (jinja checks each file's mtime, so an edited template is compiled again)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        comment_start_string="{##",  # bash's ${#array[@]} must not open a jinja comment
        comment_end_string="##}",
    )
    env.filters["sh"] = shell_word
    env.filters["lit"] = lambda text: '"' + escape(text) + '"'  # shown as is: no $VAR expansion
    return env


def render_sbatch(job: SlurmJob) -> str:
    """Return the sbatch script for ``job`` as text."""
    validate(job)
    values = {f.name: getattr(job, f.name) for f in fields(job)}
    values.update(
        env={k: v for k, v in sorted(job.env.items()) if v is not None},
        by_name=job.by_name,
        ports=job.ports,
        port_span=port_span(job),
        train_argv=train_argv(training_command(job)),
        profile=FAMILY_PROFILES[job.family],
        binds=job.inputs.all_binds(),
        path_checks=job.inputs.checks(),
        checkpoint_dir=job.inputs.checkpoint_dir,
        passed_prefixes=PASSED_PREFIXES,
        passed_names=PASSED_NAMES + (CLEAN_START_NAMES if job.runtime in ("pyxis", "ch-run")
                                     else ()),
        sbatch_options=sbatch_options(job),
        resilience=resilience_of(job),
        train_shape=train_shape(train_argv(training_command(job))),
        checker_b64=base64.b64encode(job.train_checker).decode(),
        checker_args=engine_args(),
        runtime_part=RUNTIME_PARTS[job.runtime],
        pyxis_image=pyxis_image(job.sif),
        devices=job_devices(job),
        min_slurm=MIN_SLURM,
        env_prefix="SINGULARITYENV_" if job.runtime == "singularity" else "APPTAINERENV_",
        selftest_argv=shlex.split(job.selftest_args),
        sif_name=None if job.runtime == "pyxis" else sif_cache_name(job.sif),
        generator="build-env slurm",
    )
    return _environment().get_template(TEMPLATE).render(**values)


def write_sbatch(job: SlurmJob, path: str | os.PathLike[str]) -> Path:
    """Write the script atomically (temp file in the same directory, then rename), mode 0755."""
    dest = Path(path)
    atomic_write_text(dest, render_sbatch(job), mode=0o755)
    return dest

