"""SIF layout and generated metadata, without Docker: the struct writer against the reference
``siftool``, the exact formats of the env script, runscript, definition and JSON objects, and
the runscript's run semantics executed by the host's /bin/sh."""

from __future__ import annotations

import datetime
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from builder.sif import format as sif_format
from builder.sif import meta as sif_meta
from builder.sif.checks import parse_siftool_list
from tests.sif.conftest import need_tools

WHEN = datetime.datetime(2026, 11, 22, 9, 5, 7, tzinfo=datetime.timezone.utc)


def _squashfs(path: Path) -> bytes:
    """A tiny real squashfs (mksquashfs from a tar on stdin)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("hello")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"hello\n"))
    subprocess.run(["mksquashfs", "-", str(path), "-tar", "-noappend", "-quiet", "-no-progress"],
                   input=buf.getvalue(), check=True)
    return path.read_bytes()


def _objects() -> list[sif_format.DataObject]:
    obj, js = sif_format.DataObject, sif_format.DATA_GENERIC_JSON
    return [obj(sif_format.DATA_DEFFILE, b"bootstrap: docker-daemon\nfrom: x:y\n\n"),
            obj(js, b'{"data":{}}', "inspect-metadata.json"), obj(js, b"{}", "oci-config.json")]


def _write(path: Path, squash: bytes, objects: list[sif_format.DataObject]) -> sif_format.Layout:
    layout = sif_format.plan(objects)
    with open(path, "wb") as f:
        f.seek(layout.partition_offset)
        f.write(squash)
    sif_format.write_head(path, layout, partition_size=len(squash), arch="amd64")
    return layout


def test_struct_writer_matches_siftool_byte_for_byte(tmp_path: Path) -> None:
    """Same inputs through `siftool new/add` and through our writer: identical files except
    the launch script (siftool cannot set one), the UUID and the timestamps."""
    need_tools("siftool", "mksquashfs")
    squash = _squashfs(tmp_path / "p.sqfs")
    objs = _objects()
    names = ["def.txt", "inspect-metadata.json", "oci-config.json"]
    for obj, name in zip(objs, names):
        (tmp_path / name).write_bytes(obj.data)
    ref = tmp_path / "ref.sif"
    run = lambda *a: subprocess.run(["siftool", *a], check=True, capture_output=True)  # noqa: E731
    run("new", str(ref))
    run("add", str(ref), str(tmp_path / "def.txt"), "--datatype", "1", "--groupid", "1")
    for name in names[1:]:
        run("add", str(ref), str(tmp_path / name), "--datatype", "6", "--groupid", "1",
            "--filename", name)
    run("add", str(ref), str(tmp_path / "p.sqfs"), "--datatype", "4", "--parttype", "2",
        "--partfs", "1", "--partarch", "2", "--groupid", "1")
    mine = tmp_path / "mine.sif"
    _write(mine, squash, objs)
    a, b = ref.read_bytes(), mine.read_bytes()
    assert len(a) == len(b)
    volatile = set(range(0, 32)) | set(range(48, 80))  # launch script, UUID, created/modified
    for i in range(4):  # per-descriptor created/modified times
        base = sif_format.DESCRIPTORS_OFFSET + i * sif_format.DESCRIPTOR.size
        volatile |= set(range(base + 41, base + 57))
    diffs = [i for i in range(len(a)) if a[i] != b[i] and i not in volatile]
    assert diffs == []
    assert b[:32] == sif_format.LAUNCH_SCRIPT + b"\0"
    assert sif_format.read_info(ref).descriptors == sif_format.read_info(mine).descriptors


def test_layout_and_reader(tmp_path: Path) -> None:
    squash = b"hsqs" + bytes(4092)
    layout = _write(tmp_path / "x.sif", squash, _objects())
    info = sif_format.read_info(tmp_path / "x.sif")
    assert info.launch_script == "#!/usr/bin/env run-singularity\n"
    assert (info.version, info.arch, info.descriptors_free) == ("01", "amd64", 44)
    assert info.data_offset == 32176 and layout.partition_offset == 32768
    assert [(d.type_name, d.name, d.group) for d in info.descriptors] == [
        ("Def.FILE", "", 1), ("JSON.Generic", "inspect-metadata.json", 1),
        ("JSON.Generic", "oci-config.json", 1), ("FS", "", 1)]
    part = info.primary_partition()
    assert part is not None and (part.fstype, part.parttype, part.arch) == (1, 2, "amd64")
    assert part.size_with_padding == part.size + (32768 - (32176 + 36 + 11 + 2))
    assert info.data_size == part.offset + part.size - 32176
    assert sif_format.read_object(tmp_path / "x.sif", info.descriptors[2]) == b"{}"
    assert sif_format.is_sif(tmp_path / "x.sif") and not sif_format.is_sif(tmp_path)


def test_siftool_list_parser() -> None:
    text = ("ID   |GROUP   |LINK    |SIF POSITION (start-end)  |TYPE\n"
            "1    |1       |NONE    |32176-32230               |Def.FILE\n"
            "4    |1       |NONE    |36864-91688960            |FS (Squashfs/*System/amd64)\n")
    rows = parse_siftool_list(text)
    assert [(r["id"], r["group"], r["link"], r["type"]) for r in rows] == [
        ("1", "1", "NONE", "Def.FILE"), ("4", "1", "NONE", "FS (Squashfs/*System/amd64)")]


# --------------------------------------------------------------------------- generated content


def test_env_script_exact() -> None:
    env = ["PATH=/opt/venv/bin:/usr/bin", 'GREETING=hello "world" $HOME `x`', "NOVALUE",
           "1BAD=x", "EMPTY="]
    assert sif_meta.env_script(env) == (
        "#!/bin/sh\n"
        'export PATH="/opt/venv/bin:/usr/bin"\n'
        'export GREETING="${GREETING:-"hello \\"world\\" \\$HOME \\`x\\`"}"\n'
        'export NOVALUE="${NOVALUE:-}"\n'
        'export EMPTY="${EMPTY:-""}"\n')
    assert sif_meta.env_script([]) == "#!/bin/sh\n"


def test_runscript_header_and_marker() -> None:
    text = sif_meta.runscript(["/bin/echo"], ["default arg", "it's"])
    lines = text.splitlines()
    assert lines[:3] == ["#!/bin/sh", "OCI_ENTRYPOINT='\"/bin/echo\"'",
                         "OCI_CMD='\"default arg\" \"it'\"'\"'s\"'"]
    assert 'eval "set ${SINGULARITY_OCI_RUN}"' in lines  # exact, unindented: the runtime's marker
    empty = sif_meta.runscript(None, None).splitlines()
    assert empty[1:3] == ["OCI_ENTRYPOINT=''", "OCI_CMD=''"]


@pytest.mark.parametrize("entrypoint,cmd,args,no_eval,expected", [
    (["printf", "%s|"], ["a b", "it's"], [], False, "a b|it's|"),
    (["printf", "%s|"], ["a b"], ["x y", "$HOME"], False, "x y|/nonexistent-home|"),
    (["printf", "%s|"], ["a b"], ["$HOME"], True, "$HOME|"),
    (None, ["printf", "%s|", "c"], [], False, "c|"),
    (None, ["printf", "%s|", "c"], ["printf", "%s-", "z"], False, "z-"),
    (["printf", "%s|"], None, [], True, "|"),
    (["printf", "%s|", "e"], None, ["q"], True, "e|q|"),
    (None, ["printf", "%s|", "'q'"], [], True, "'q'|"),
])
def test_runscript_semantics(tmp_path: Path, entrypoint, cmd, args, no_eval, expected) -> None:
    """Docker semantics through /bin/sh: no args -> ENTRYPOINT+CMD, args replace CMD; the
    historic mode re-evaluates words ($HOME expands), --no-eval passes them on untouched."""
    script = tmp_path / "runscript"
    script.write_text(sif_meta.runscript(entrypoint, cmd))
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home"}
    if no_eval:
        env["SINGULARITY_NO_EVAL"] = "1"
    out = subprocess.run(["/bin/sh", str(script), *args], env=env, capture_output=True,
                         text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected


def test_go_json_and_labels() -> None:
    assert sif_meta.go_json({"a": "<b>&", "z": [1, "\u2028"]}) == \
        '{"a":"\\u003cb\\u003e\\u0026","z":[1,"\\u2028"]}'
    assert sif_meta.go_json_indent({"b": "1", "a": "x"}) == '{\n\t"a": "x",\n\t"b": "1"\n}'
    labels = sif_meta.build_labels({"org.label-schema.build-arch": "image", "mine": "1"},
                                   bootstrap="docker-daemon", source="r:t", arch="amd64",
                                   when=WHEN)
    assert labels["mine"] == "1" and labels["org.label-schema.build-arch"] == "amd64"
    assert labels["org.label-schema.build-date"] == "Sunday_22_November_2026_9:5:7_UTC"
    assert labels["org.opencontainers.image.created"] == "2026-11-22T09:05:07Z"
    assert "org.label-schema.usage.apptainer.version" not in labels  # we are not apptainer


def test_oci_config_order_and_empty_values() -> None:
    config: dict[str, object] = {
        "Hostname": "", "User": "", "Env": ["A=1"], "Cmd": ["sh"], "Image": "", "Volumes": None,
        "WorkingDir": "/w", "Entrypoint": None, "OnBuild": None, "Labels": {"z": "1", "a": "2"},
        "AttachStdin": False, "ExposedPorts": {"80/tcp": {}}}
    assert sif_meta.go_json(sif_meta.oci_config(config)) == (
        '{"Cmd":["sh"],"Env":["A=1"],"Labels":{"a":"2","z":"1"},"WorkingDir":"/w",'
        '"ExposedPorts":{"80/tcp":{}}}')
    assert sif_meta.go_json(sif_meta.oci_config({})) == "{}"


def test_generate_consistent_objects() -> None:
    config = {"Env": ["PATH=/bin"], "Cmd": ["/bin/bash"], "Labels": {"k": "v"}}
    meta = sif_meta.generate(config, source="verl-env:cpu", arch="amd64", when=WHEN)
    assert meta.deffile == b"bootstrap: docker-daemon\nfrom: verl-env:cpu\n\n"
    inspect = json.loads(meta.inspect_json)
    assert list(inspect) == ["data", "type"] and inspect["type"] == "container"
    attrs = inspect["data"]["attributes"]
    assert list(attrs) == ["environment", "labels", "runscript", "deffile", "startscript"]
    files = {f.path: f for f in meta.files}
    assert attrs["deffile"] == "bootstrap: docker-daemon\nfrom: verl-env:cpu"
    assert attrs["runscript"] == files[".singularity.d/runscript"].data.decode().rstrip("\n")
    env_key = "/.singularity.d/env/10-docker2singularity.sh"
    assert attrs["environment"][env_key] == "#!/bin/sh\nexport PATH=\"/bin\""
    assert json.loads(files[".singularity.d/labels.json"].data) == attrs["labels"]
    assert files[".singularity.d/env/94-appsbase.sh"].data == b""
    assert {f.mode for p, f in files.items() if "/env/" in p or "/actions/" in p} == {0o755}
    assert meta.oci_config_json == b'{"Cmd":["/bin/bash"],"Env":["PATH=/bin"],"Labels":{"k":"v"}}'


@pytest.mark.parametrize("script", [".singularity.d/actions/exec", ".singularity.d/actions/run",
                                    ".singularity.d/env/95-apps.sh",
                                    ".singularity.d/env/99-base.sh",
                                    ".singularity.d/env/99-runtimevars.sh"])
def test_static_scripts_are_valid_sh(tmp_path: Path, script: str) -> None:
    path = tmp_path / "s.sh"
    path.write_text(sif_meta.STATIC_FILES[script])
    assert subprocess.run(["/bin/sh", "-n", str(path)]).returncode == 0
