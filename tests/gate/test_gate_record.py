"""The gate's typed record (builder.gate.record): one serialisation, the keys the image gate and
the SIF gate write (in their order), and records of any age read back."""

from __future__ import annotations

import json

from builder.gate.record import HOST, NODE, UNCOUNTED, GateRecord, ImageRun, SifRun

IMAGE_GATE = {
    "schema": "verl-env/gate/v1", "family": "cpu",
    "phases": ["preflight", "env", "imports", "versions", "coverage", "cpu", "gpu", "collective",
               "ray"],
    "required_phases": ["preflight", "env", "imports", "versions", "cpu", "ray"],
    "selftest_args": [], "entrypoint": ["/bin/sh", "-c"], "bind_mounts": [],
    "arch": {"image": "amd64", "target": "amd64", "engine_host": "amd64", "emulated": False,
             "emulation_factor": 1.0, "refused": None},
    "scope": "release", "partial_reason": None,
    "selftest_argv": ["--json", "/verl-env-out/report.json", "--expect-gpus", "0"],
    "gpus": {"expected": 0, "source": "cpu target", "reason": "target family cpu has no GPUs",
             "vendor": None, "host_count": None, "dev_root": None, "narrowed": None,
             "host_devices": [], "handed": None,
             "in_image": {"count": None, "reason": "not measured: GPU checks were not expected"}}}
SIF_GATE = {
    "schema": "verl-env/gate/v1",
    "subject": {"sif": "/x/cuda.sif", "digest": "sha256:" + "1" * 64, "target": "cuda-x86_64"},
    "family": "cuda", "phases": ["preflight"], "required_phases": ["preflight", "gpu"],
    "selftest_args": ["--phases", "preflight"], "runtime": "apptainer", "runtime_flags": ["--nv"],
    "passed_env": ["CUDA_VISIBLE_DEVICES"],
    "gpus": {"vendor": "nvidia", "dev_root": "/dev", "node_count": 4, "node_source": "slurm",
             "expected": 2, "source": "--expect-gpus", "reason": "--expect-gpus 2",
             "narrowed": "--expect-gpus 2 while Slurm gave 4",
             "in_image": {"count": 2, "reason": "GPUs torch sees inside the container"}},
    "scope": "partial", "partial_reason": "phases gpu not run", "command": ["apptainer", "exec"]}


def test_image_and_sif_records_round_trip_key_for_key_in_order() -> None:
    for written in (IMAGE_GATE, SIF_GATE):
        record = GateRecord.from_dict(written)
        assert json.dumps(record.to_dict()) == json.dumps(written)
    image = GateRecord.from_dict(IMAGE_GATE)
    assert isinstance(image.run, ImageRun) and image.arch is not None and not image.arch.emulated
    assert image.gpus is not None and image.gpus.counted == HOST and image.gpus.expected == 0
    sif = GateRecord.from_dict(SIF_GATE)
    assert isinstance(sif.run, SifRun) and sif.subject is not None
    assert sif.subject.target == "cuda-x86_64" and sif.run.runtime_flags == ("--nv",)
    assert sif.gpus is not None and sif.gpus.counted == NODE and sif.gpus.node_count == 4


def test_a_refused_or_uncounted_run_writes_what_it_knew() -> None:
    refused = {k: v for k, v in IMAGE_GATE.items() if k not in ("selftest_argv", "gpus")}
    assert json.dumps(GateRecord.from_dict(refused).to_dict()) == json.dumps(refused)
    uncounted = {**refused, "gpus": {"expected": None, "reason": "could not count"}}
    record = GateRecord.from_dict(uncounted)
    assert record.gpus is not None and record.gpus.counted == UNCOUNTED
    assert json.dumps(record.to_dict()) == json.dumps(uncounted)


def test_old_and_malformed_records_still_load() -> None:
    old = GateRecord.from_dict({"family": "cuda", "phases": ["gpu"], "gpus": {"expected": 1}})
    assert old.scope is None and old.run is None and old.phases == ("gpu",)
    assert old.gpus is not None and old.gpus.expected == 1 and old.gpus.reason is None
    junk = GateRecord.from_dict({"family": 3, "phases": "gpu", "gpus": [], "arch": 1,
                                 "entrypoint": None, "later": {"x": 1}})
    assert junk.family is None and junk.phases == () and junk.gpus is not None
    assert junk.gpus.expected is None and junk.extra == {"later": {"x": 1}}
    assert GateRecord.from_dict(None).family is None
