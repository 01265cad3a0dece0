"""Vendor bases, pure logic: the probe's record, the lock's constraints, what the layers leave
out, rendering into the base's own interpreter, the gate's decisions, declared bases, the ROCm
family's data (builder.resolve.vendor, builder.render, builder.selftest.phases.versions, builder.matrix.families)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builder.resolve import vendor
from builder.engine import ContainerEngine, RunResult
from builder.errors import LockError, SpecError
from builder.matrix.families import FAMILIES
from builder.resolve.lock import input_hash, lock_path, parse_lock
from builder.resolve.metadata import load_snapshot
from builder.render import render_context
from builder.selftest.phases.versions import decide_base_files, decide_pin
from builder.cluster.inputs import Inputs
from builder.cluster.job import SlurmJob, training_command
from builder.matrix.spec import Base, Package, load_matrix

REPO = Path(__file__).resolve().parents[2]
CPU = load_matrix(REPO / "tests" / "fixtures" / "cpu.yaml")
SNAP = load_snapshot(REPO / "tests" / "fixtures" / "metadata" / "pypi-snapshot.json")
LOCK = lock_path(CPU.path, CPU.target("cpu-x86_64"))


def _target(kind: str = "probe", torch: str = "2.13.0+cpu"):
    t = CPU.target("cpu-x86_64")
    return replace(t, name="vendor", base=Base("vendor/base:1", glibc="2.36", vendor=kind),
                   packages=tuple(p for p in t.packages if p.name != "torch"),
                   provided=(Package("torch", torch),), find_links=())


def _probe_output(venv: bool = True, **extra_dists: str) -> str:
    dists = {"torch": {"version": "2.13.0+cpu", "path": "/opt/venv/lib/python3.11/site-packages/"
                       "torch-2.13.0+cpu.dist-info", "record": "sha256:" + "a" * 64},
             "filelock": {"version": "4.2.11", "path": "/x/filelock-4.2.11.dist-info",
                          "record": "sha256:" + "b" * 64},
             "amdsmi": {"version": "26.0.0+rocm7", "path": "/x", "record": None},
             "uv": {"version": "0.1.0", "path": "/x", "record": None},
             **{n: {"version": v, "path": "/x", "record": None} for n, v in extra_dists.items()}}
    data = {"interpreter": "/opt/venv/bin/python3" if venv else "/usr/bin/python3",
            "python": "3.11.2", "prefix": "/opt/venv" if venv else "/usr", "venv": venv,
            "purelib": "/opt/venv/lib/python3.11/site-packages",
            "externally_managed": not venv,
            "env": {"PATH": "/opt/venv/bin:/usr/bin", "LD_LIBRARY_PATH": "/opt/rocm/lib"},
            "dists": dists}
    return "some log line\n" + json.dumps(data) + "\n"


def _record(venv: bool = True, **extra: str) -> dict:
    return vendor.parse_probe(_probe_output(venv, **extra), target=_target(),
                              image="vendor/base:1", image_id="sha256:" + "c" * 64)


def test_the_probe_output_becomes_the_base_record() -> None:
    rec = _record()
    assert rec["inspected"] and rec["kind"] == "venv" and not rec["externally_managed"]
    assert rec["interpreter"] == "/opt/venv/bin/python3"
    assert rec["env"]["LD_LIBRARY_PATH"] == "/opt/rocm/lib"
    assert rec["dists"]["torch"]["record"] == "sha256:" + "a" * 64
    system = _record(venv=False)
    assert system["kind"] == "system" and system["externally_managed"]
    with pytest.raises(LockError, match="runs python 3.11.2"):
        vendor.parse_probe(_probe_output(), target=replace(_target(), python="3.12"),
                           image="i", image_id="x")
    with pytest.raises(LockError, match="printed no record"):
        vendor.parse_probe("no python here", target=_target(), image="i", image_id="x")


def test_the_probe_script_runs_on_this_python() -> None:
    proc = subprocess.run(["python3", "-c", vendor.PROBE_PY], capture_output=True, text=True,
                          check=True)
    data = json.loads(proc.stdout)
    assert data["interpreter"] and data["dists"] and "PATH" in data["env"]
    some = next(iter(data["dists"].values()))
    assert set(some) == {"version", "path", "record"}


def test_the_freeze_constrains_the_lock_and_provided_packages_are_excluded() -> None:
    t = _target()
    rec = _record(transformers="4.0.0")
    constraints, excludes = vendor.resolution(t, rec)
    assert "filelock==4.2.11" in constraints
    # provided and local versions (not on any index) are excluded; tools and explicit pins
    # (a replacement of the base's transformers) are never constrained
    assert excludes == ["amdsmi", "torch"]
    assert not any(c.startswith(("uv==", "transformers==", "torch==")) for c in constraints)
    assert vendor.replaced(t, rec) == {"transformers": ("4.0.0", "5.9.0")}
    # without a record (a plain base; `check` refuses provided packages there) the provided
    # pins are constraints and excluded from the resolution
    plain = replace(CPU.target("cpu-x86_64"), provided=(Package("pip", "99.0"),))
    assert vendor.resolution(plain, None) == (["pip==99.0"], ["pip"])


def test_the_record_is_part_of_the_lock_input_hash() -> None:
    t = _target()
    a, b = _record(), _record(extra="1.0")
    assert input_hash(t, SNAP, a) != input_hash(t, SNAP, b) != input_hash(t, SNAP, None)
    plain = CPU.target("cpu-x86_64")
    assert input_hash(plain, SNAP) == input_hash(plain, SNAP, None)  # plain locks unchanged


def test_what_the_base_holds_is_left_out_of_the_layers(tmp_path: Path) -> None:
    rec = _record()
    locked = parse_lock(LOCK.read_text())
    assert vendor.already_there(locked, rec) == {"filelock", "torch"}
    ctx = render_context(_target(), LOCK.read_text(), SNAP, tmp_path / "ctx", base_record=rec)
    layers = "".join(p.read_text() for p in (ctx.path / "layers").iterdir())
    assert "\nfilelock==" not in layers and "\ntorch==" not in layers
    assert json.loads((ctx.path / "base.json").read_text()) == rec
    man = ctx.manifest["base"]
    assert man["inspected"] and man["provided"]["torch"]["record"] == "sha256:" + "a" * 64


def test_a_vendor_target_renders_into_the_base_interpreter(tmp_path: Path) -> None:
    venv = render_context(_target(), LOCK.read_text(), SNAP, tmp_path / "v",
                          base_record=_record()).dockerfile
    assert "python3 -m venv" not in venv and "PATH=" not in venv  # the base's PATH is kept
    assert ("/opt/venv/bin/python3 -m pip install --no-cache-dir --no-deps --require-hashes "
            "--target /opt/verl-env/tools -r") in venv
    assert "/opt/verl-env/tools/bin/uv pip install --python /opt/venv/bin/python3 " in venv
    assert "--break-system-packages" not in venv
    assert "command -v /opt/venv/bin/python3 > /opt/verl-env/interpreter" in venv
    system = render_context(_target(), LOCK.read_text(), SNAP, tmp_path / "s",
                            base_record=_record(venv=False)).dockerfile
    assert ("/opt/verl-env/tools/bin/uv pip install --python /usr/bin/python3 "
            "--break-system-packages") in system
    hadolint = shutil.which("hadolint")
    if hadolint:
        for d in (tmp_path / "v", tmp_path / "s"):
            proc = subprocess.run([hadolint, str(d / "Dockerfile")], capture_output=True,
                                  text=True)
            assert proc.returncode == 0, proc.stdout


def test_a_probe_target_without_a_record_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(LockError, match="build-env lock --probe --target vendor"):
        vendor.load_record(_target(), tmp_path / "locks" / "vendor.txt")
    rec = _record()
    vendor.write_record(vendor.base_record_path(tmp_path / "vendor.txt"), rec)
    assert (tmp_path / "vendor.base.json").is_file()
    assert vendor.load_record(_target(), tmp_path / "vendor.txt") == rec


def test_a_lying_provided_pin_is_named_early_and_refused_by_the_gate() -> None:
    lie = _target(torch="2.12.0")
    assert vendor.mismatches(lie, _record()) == [
        "torch: the matrix claims 2.12.0, vendor/base:1 holds 2.13.0+cpu"]
    assert vendor.mismatches(_target(), _record()) == []
    check = decide_pin("torch", "2.12.0", "2.13.0+cpu", "provided")
    assert check.status == "fail" and check.id == "versions.provided.torch"
    assert check.reason == ("torch: the matrix claims the base provides 2.12.0, the image holds "
                            "2.13.0+cpu")


def test_the_provided_files_must_be_the_bases() -> None:
    exp = {"version": "1", "path": "/opt/venv/x.dist-info", "record": "sha256:1"}
    assert decide_base_files("torch", exp, True, ("/opt/venv/x.dist-info", "sha256:1")
                             ).status == "pass"
    moved = decide_base_files("torch", exp, True, ("/usr/local/x.dist-info", "sha256:1"))
    assert moved.status == "fail" and "/usr/local/x.dist-info" in moved.reason
    changed = decide_base_files("torch", exp, True, ("/opt/venv/x.dist-info", "sha256:2"))
    assert changed.status == "fail" and "RECORD differs" in changed.reason
    gone = decide_base_files("torch", exp, True, (None, None))
    assert gone.status == "fail"
    declared = decide_base_files("torch", {"version": "1", "path": None}, False, (None, None))
    assert declared.status == "skip" and declared.required  # fails closed: no release


def test_rocm_mi300_is_a_declared_vendor_base(tmp_path: Path) -> None:
    m = load_matrix(REPO / "matrix.yaml")
    t = m.target("rocm-mi300")
    assert t.base.vendor == "declared" and t.base.digest and t.base.sources
    rec = vendor.load_record(t, lock_path(m.path, t))
    assert rec["inspected"] is False and rec["interpreter"] == "python3"
    assert {n: d["version"] for n, d in rec["dists"].items()} == {
        p.name: p.version for p in t.provided}
    dockerfile = (REPO / "tests" / "golden" / "rocm-mi300.Dockerfile").read_text()
    assert "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES=1" in dockerfile
    assert "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES=1" in dockerfile
    assert "/opt/venv" not in dockerfile and "PATH=" not in dockerfile  # /opt/rocm/bin kept
    assert "declared, not yet inspected" in dockerfile


def test_matrix_rules_for_vendor_bases(tmp_path: Path) -> None:
    def load(base: str, provided: str = 'provided: {torch: "2.12.0"}') -> None:
        f = tmp_path / "m.yaml"
        f.write_text(f"""schema: 1
targets:
  t:
    accelerator: cpu
    arch: x86_64
    python: "3.12"
    base: {base}
    {provided}
    packages: {{ray: "2.60.0", transformers: "5.9.0", tensordict: "0.10.0", verl: "0.9.1"}}
""")
        load_matrix(f)

    load('{image: i, vendor: probe}')
    load('{image: i, vendor: declared, interpreter: /opt/venv/bin/python, sources: [u]}')
    with pytest.raises(SpecError, match="vendor must be one of probe, declared"):
        load('{image: i, vendor: yes-please}')
    with pytest.raises(SpecError, match="interpreter is for a declared vendor base"):
        load('{image: i, vendor: probe, interpreter: /usr/bin/python3}')
    with pytest.raises(SpecError, match="needs the packages it provides"):
        load('{image: i, vendor: probe}', provided='provided: {}')
    with pytest.raises(SpecError, match=r"m.yaml:7: targets.t.base.bytecode_image: a vendor "
                                        r"base's packages are byte-compiled by its own"):
        load('{image: i, vendor: probe, bytecode_image: debian:bookworm}')


def test_the_rocm_family_data() -> None:
    rocm = FAMILIES["rocm"]
    assert rocm.image_env["RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"] == "1"
    assert rocm.collective_defaults["RCCL_MSCCL_ENABLE"] == "0"
    assert any("disable_custom_all_reduce=True" in o for o in rocm.trainer_overrides)
    inputs = Inputs.from_options(data="/d", model="/m")
    job = SlurmJob(target="rocm-mi300", family="rocm", sif="/x.sif", inputs=inputs)
    assert "engine_kwargs.vllm.disable_custom_all_reduce=True" in training_command(job)
    cuda = replace(job, family="cuda")
    assert "disable_custom_all_reduce" not in training_command(cuda)
    assert not FAMILIES["cuda"].image_env and not FAMILIES["cpu"].trainer_overrides


class _FakeEngine(ContainerEngine):
    """The engine interface's two calls the probe uses (the real one: tests/vendor)."""

    def __init__(self, logs: str, code: int = 0) -> None:
        self.logs, self.code = logs, code
        self.calls: list[tuple[str, list[str], dict[str, Any]]] = []

    def identity(self, ref: str) -> str:
        return "sha256:" + "d" * 64

    def run(self, image: str, command: Sequence[str], *, entrypoint: Sequence[str],
            timeout: float, network: str = "none", files: Mapping[str, bytes] | None = None,
            dirs: Sequence[str] = (), collect: Sequence[str] = (),
            environment: dict[str, str] | None = None, gpus: str | None = None,
            shm_size: str = "2g", role: str = "verify") -> RunResult:
        self.calls.append((image, list(command), {
            "entrypoint": list(entrypoint), "timeout": timeout, "network": network,
            "role": role}))
        return RunResult(self.code, self.logs, 0.0)


def test_the_first_build_of_a_declared_base_records_it_and_asks_for_a_relock(
        tmp_path: Path) -> None:
    declared = _target("declared", torch="2.12.0")
    engine = _FakeEngine(_probe_output())
    with pytest.raises(LockError) as err:
        vendor.first_inspection(engine, declared, tmp_path / "locks" / "vendor.txt")
    text = str(err.value)
    assert "was declared, not inspected" in text and "build-env lock --target vendor" in text
    assert "torch: the matrix claims 2.12.0, vendor/base:1 holds 2.13.0+cpu" in text
    rec = json.loads((tmp_path / "locks" / "vendor.base.json").read_text())
    assert rec["inspected"] and rec["image_id"] == "sha256:" + "d" * 64
    image, command, kw = engine.calls[0]
    assert kw["entrypoint"] == ["/bin/sh"] and command[-1] == vendor.PROBE_PY
    with pytest.raises(LockError, match="probe of vendor/base:1 failed"):
        vendor.probe(_FakeEngine("no python in the base", code=3), declared)
