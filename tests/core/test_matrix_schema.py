"""The matrix's shape is one JSON Schema (builder/matrix/matrix.schema.json): `check` validates
every matrix against it (builder.yamldoc.validate) before the grammar and cross-field rules, its
errors name file:line: key, and `build-env init` points editors at it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import jsonschema
import pytest

from builder import yamldoc
from builder.cli import main
from builder.errors import SpecError
from builder.matrix.families import FAMILIES
from builder.matrix.model import ARCHES
from builder.matrix.rules import SCHEMA_FILE, schema
from builder.matrix.spec import MODELINE, load_matrix

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [REPO / "matrix.yaml", *sorted((REPO / "tests" / "fixtures").glob("*.yaml")),
           *sorted((REPO / "tests" / "fixtures").glob("*/matrix.yaml")),
           REPO / "tests" / "propose" / "data" / "matrix.yaml"]

GOOD = """\
schema: 1
targets:
  t:
    accelerator: cpu
    arch: x86_64
    base: {image: "python:3.12-slim-bookworm", glibc: "2.36"}
    python: "3.12"
    packages:
      torch: "2.11.0"
      ray: "2.60.0"
      transformers: "5.9.0"
      tensordict: "0.10.0"
      verl: "0.9.1"
"""


def test_the_schema_is_a_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_FILE.read_text()))


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(REPO)) for p in SHIPPED])
def test_the_schema_accepts_the_shipped_matrices(path: Path) -> None:
    doc = yamldoc.read(path, "matrix")
    yamldoc.validate(doc, schema())  # the document as written
    assert load_matrix(path).targets  # and each target merged with its defaults


def test_the_enumerations_are_the_codes() -> None:
    """The schema names the families and architectures the model knows (families.py, ARCHES)."""
    props = schema()["$defs"]["target"]["properties"]
    assert props["accelerator"]["enum"] == list(FAMILIES)
    assert props["arch"]["enum"] == list(ARCHES)
    assert schema()["$defs"]["prebuilt"]["items"]["properties"]["arch"]["enum"] == list(ARCHES)


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_matrix(path)
    return str(err.value)


@pytest.mark.parametrize("edit,where,message", [
    (lambda s: s.replace('python: "3.12"', "python: [3, 12]"), ":7: targets.t.python:",
     "expected a string, got [3, 12]"),
    (lambda s: s.replace("arch: x86_64", "arch: {x: 1}"), ":5: targets.t.arch:",
     "must be one of x86_64, aarch64"),
    (lambda s: s.replace('ray: "2.60.0"', "ray: {version: \"2.60.0\", enabled: yes-ish}"),
     ":10: targets.t.packages.ray.enabled:", "expected true or false"),
    (lambda s: s.replace("    python:", "    colour: red\n    python:"),
     ":7: targets.t.colour:", "unknown key 'colour' (allowed: abi_allow, accelerator"),
    (lambda s: s.replace("schema: 1\n", "schema: 1\nextra: 1\n"), ":2: extra:",
     "unknown key 'extra' (allowed: defaults, schema, targets)"),
    (lambda s: s.replace("glibc: \"2.36\"}", "glibc: \"2.36\", tag: x}"),
     ":6: targets.t.base.tag:", "unknown key 'tag'"),
    (lambda s: s.replace("    arch: x86_64\n", ""), ":3: targets.t:", "missing key 'arch'"),
])
def test_a_shape_error_names_file_line_key(tmp_path: Path, edit, where: str,
                                           message: str) -> None:
    err = _error(tmp_path, edit(GOOD))
    assert f"matrix.yaml{where}" in err and message in err, err


def test_a_key_from_the_defaults_reports_the_defaults_line(tmp_path: Path) -> None:
    text = GOOD.replace("targets:\n", "defaults:\n  apt: [1]\ntargets:\n")
    err = _error(tmp_path, text)
    assert "matrix.yaml:3: defaults.apt[0]: expected a list of strings" in err, err


def test_init_points_editors_at_the_schema(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site"
    assert main(["init", str(site), "--quiet"]) == 0
    first = (site / "matrix.yaml").read_text().splitlines()[0]
    assert first.startswith(MODELINE), first
    uri = first[len(MODELINE):]
    assert Path(unquote(urlparse(uri).path)) == SCHEMA_FILE and SCHEMA_FILE.is_file()
    assert load_matrix(site / "matrix.yaml").targets  # the comment changes nothing else
    cwd = os.getcwd()
    os.chdir(site)
    try:
        assert main(["check"]) == 0, capsys.readouterr().err
    finally:
        os.chdir(cwd)
