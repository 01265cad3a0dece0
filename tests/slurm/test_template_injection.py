"""Hostile values in every string field that reaches the sbatch template are refused, or leave
the script's command list unchanged (hypothesis property test).

The structure is read by bash itself: the rendered script is wrapped in a function and bash
prints the function back (``declare -f``), its own canonical form of what it parsed: comments
dropped, every command on its own line, quoting kept. Quoted strings are then masked (runs of
them collapse to one ``Q``, so a value that splits into more words of one array is the same
shape); what is left is the script's commands and operators as bash parsed them. A value that
escaped its quotes (``"; rm -rf ~; "``, a backtick, ``$(…)``, a newline ending a comment or a
line) adds a command or operator there. The ``#SBATCH`` lines, which bash reads as comments and
sbatch as options, are compared as (option, value-is-one-word) pairs.
"""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.errors import SlurmError
from builder.cluster.inputs import Bind, Inputs
from builder.cluster.job import SlurmJob
from builder.cluster.render import render_sbatch
from tests.slurm.test_render import ORAS

HOSTILE = ["\n", ";", "&&", "$(id)", "`id`", '"', "'", "\\", "\u2028", " ", "|", "$", "#",
           "${IFS}", ")", "(", "\r", "*", "~", "\t", "!", "{", "}", "<", ">"]

#: field -> a benign value of the same kind (the baseline) and how to set it on a job
FIELDS: dict[str, str] = {
    "target": "cuda-x86_64", "job_name": "verl-a", "partition": "gpu", "interface": "ib0",
    "account": "proj", "qos": "normal", "reservation": "r1", "constraint": "a100",
    "mem": "500G", "cpu_bind": "cores", "time": "10", "cluster": "site",
    "selftest_phases": "preflight", "selftest_args": "--strict", "train_cmd": "python3 t.py",
    "cache_dir": "/c", "hf_home": "/h", "ray_tmp_root": "/tmp", "job_dir": "/j",
    "verdict_sif": "/v.sif", "trust_key": "/k.pub", "sif": "/s.sif",
    "env_value": "x", "env_name": "SITE_X", "bind_src": "/b", "model": "/m",
    "data": "/d", "checkpoint_dir": "/ck",
}


def _job(field: str, value: str) -> SlurmJob:
    base = dict(target="cuda-x86_64", family="cuda", sif=ORAS, train_cmd="python3 t.py",
                inputs=Inputs.from_options(data="/d", model="/m", checkpoint_dir="/ck"))
    if field == "env_value":
        return SlurmJob(**base, env={"SITE_X": value})  # type: ignore[arg-type]
    if field == "env_name":
        return SlurmJob(**base, env={value: "1"})  # type: ignore[arg-type]
    if field in ("bind_src", "model", "data", "checkpoint_dir"):
        inputs = base.pop("inputs")
        if field == "bind_src":
            inputs = replace(inputs, binds=(Bind(value, "/mnt", True),))  # type: ignore[arg-type]
        else:
            inputs = replace(inputs, **{  # type: ignore[arg-type]
                "model": value} if field == "model" else {"checkpoint_dir": value} if
                field == "checkpoint_dir" else {"train_files": value + "/train.parquet",
                                                "val_files": value + "/test.parquet"})
        return SlurmJob(**base, inputs=inputs)  # type: ignore[arg-type]
    if field == "verdict_sif":
        return SlurmJob(**base, verdict_sif=value)  # type: ignore[arg-type]
    if field == "trust_key":
        return SlurmJob(**base, trust_key=value)  # type: ignore[arg-type]
    base[field] = value
    return SlurmJob(**base)  # type: ignore[arg-type]


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|\$\'(?:[^\'\\]|\\.)*\'')


def structure(script: str) -> tuple[list[str], list[tuple[str, bool]]]:
    """(bash's canonical command lines with quoted strings masked, the #SBATCH options)."""
    proc = subprocess.run(["bash", "-c", 'eval "verl_env_f() {\n$1\n}" && declare -f verl_env_f',
                           "bash", script], capture_output=True, text=True)
    assert proc.returncode == 0, f"bash cannot parse the script: {proc.stderr[-500:]}"
    lines = []
    for line in proc.stdout.split("\n"):  # bash breaks lines at \n only (not U+2028)
        masked = _QUOTED.sub("Q", line)
        masked = re.sub(r"Q(?:\s*Q)+", "Q", masked)
        lines.append(re.sub(r"(?<=[A-Za-z0-9_/.,:=-])Q|Q(?=[A-Za-z0-9_/.,:=-])", "Q", masked))
    sbatch = [(m.group(1), m.group(2) is None or " " not in m.group(2)) for m in re.finditer(
        r"^#SBATCH --([\w-]+)(?:=(.*))?$", script, re.M)]
    return lines, sbatch


def _masked_words(lines: list[str]) -> list[str]:
    """What may legitimately differ between two values of one field is only inside a masked
    string or the digits of a number; everything else must be equal."""
    return [re.sub(r"\bQ\b|[^\s;|&()<>`$]*Q[^\s;|&()<>`$]*", "Q", line) for line in lines]


@functools.cache
def baseline(field: str) -> tuple[list[str], list[tuple[str, bool]]]:
    """The structure of the script with the field's benign value: made when a test first needs
    it, not when the module is imported (every test group collects this module)."""
    return structure(render_sbatch(_job(field, FIELDS[field])))


@pytest.mark.parametrize("field", sorted(FIELDS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=4),
       prefix=st.sampled_from(["", "a", "/x/"]))
def test_hostile_values_are_refused_or_inert(field: str, pieces: list[str],
                                             prefix: str) -> None:
    benign = FIELDS[field]
    value = (benign if field not in ("env_name",) else "SITE_X") + prefix + "".join(pieces)
    try:
        job = _job(field, value)
        script = render_sbatch(job)
    except SlurmError:
        return  # refused, with one line naming the field
    lines, sbatch = structure(script)
    base_lines, base_sbatch = baseline(field)
    assert sbatch == base_sbatch, (field, value)
    assert _masked_words(lines) == _masked_words(base_lines), (field, value)


def test_the_structure_check_can_fail() -> None:
    """The comparison sees a value that escaped its quotes (what the property rules out)."""
    script = render_sbatch(_job("partition", "gpu"))
    escaped = script.replace('IFACE="ib0"', 'IFACE="ib0"; rm -rf "$HOME"', 1)
    assert _masked_words(structure(escaped)[0]) != _masked_words(structure(script)[0])
    comment = script.replace("# Regenerate it", "\nrm -rf /tmp/x # Regenerate it", 1)
    assert _masked_words(structure(comment)[0]) != _masked_words(structure(script)[0])
    sbatch = script.replace("#SBATCH --exclusive", "#SBATCH --exclusive\n#SBATCH --wrap=x", 1)
    assert structure(sbatch)[1] != structure(script)[1]
