"""Issue 38's matrix messages, each as a user meets it: a key inherited from ``defaults:`` is
named where it was written (``defaults.python``, its line), an empty ``megatron:`` is refused as
``megatron: false`` is, a layer option is named as written (``megatron.transformer-engine-torch
.enabled``, not ``packages.…``), ``gpus: []`` says the list is empty, a NUL byte is one line
``file:line: ...``; and ``build-env.toml``'s lines are found in the TOML text (tomllib gives
none). Through :func:`builder.matrix.spec.load_matrix` and :mod:`builder.config`, real parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder import config
from builder.errors import SpecError
from builder.matrix.spec import load_matrix

GOOD = """\
schema: 1
defaults:
  python: "3.12"
targets:
  t:
    accelerator: cuda
    arch: x86_64
    cuda: "13.0"
    gpus: [sm_90]
    base: {image: "nvidia/cuda:13.0.2-base-ubuntu24.04", glibc: "2.39"}
    packages:
      torch: "2.11.0"
      vllm: "0.24.0"
      ray: "2.60.0"
      transformers: "5.9.0"
      tensordict: "0.10.0"
      verl: "0.9.1"
"""
LAYER = """\
    megatron:
      megatron-core: "0.19.2"
      mbridge: "0.15.1"
      transformer-engine: "2.19.0"
"""


def _load(tmp_path: Path, text: str | bytes) -> SpecError:
    path = tmp_path / "matrix.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_matrix(path)
    return caught.value


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_the_good_matrix_loads(tmp_path: Path) -> None:
    for text in (GOOD, GOOD.replace("    packages:\n", LAYER + "    packages:\n")):
        (tmp_path / "matrix.yaml").write_text(text)
        assert set(load_matrix(tmp_path / "matrix.yaml").targets) == {"t"}


@pytest.mark.parametrize("default,key,says", [
    ('  python: "3.1x"\n', "defaults.python", "invalid python version '3.1x'"),
    ("  python: 3.12\n", "defaults.python", "write versions as quoted strings"),
    ('  python: "3.12"\n  packages:\n    hydra-core: "1.x"\n', "defaults.packages.hydra-core",
     "invalid version '1.x'"),
    ('  python: "3.12"\n  apt: [procps, "curl && id"]\n', "defaults.apt[1]",
     "is not a Debian package"),
])
def test_an_inherited_value_is_named_where_it_was_written(tmp_path: Path, default: str,
                                                          key: str, says: str) -> None:
    text = GOOD.replace('  python: "3.12"\n', default)
    err = _load(tmp_path, text)
    assert err.key == key, str(err)
    written = key.split(".")[-1].split("[")[0]
    assert err.line == _line(text, f"  {written}:"), str(err)
    assert says in str(err), str(err)
    # a value wrong in any target (the schema's) is the defaults' own; one wrong for this target
    # says which target took it
    assert ("inherited by target t" in str(err)) == ("quoted" not in says), str(err)


def test_a_target_s_own_value_keeps_its_own_key(tmp_path: Path) -> None:
    text = GOOD.replace('    gpus: [sm_90]\n', '    gpus: [sm_90]\n    python: "3.1x"\n')
    err = _load(tmp_path, text)
    assert (err.key, err.line) == ("targets.t.python", _line(text, '    python: "3.1x"'))
    assert "inherited" not in str(err)


@pytest.mark.parametrize("value,got", [("", "an empty value"), (" false", "False"),
                                       (" ~", "an empty value")])
def test_an_empty_layer_key_is_refused_as_false_is(tmp_path: Path, value: str, got: str
                                                   ) -> None:
    text = GOOD.replace("    packages:\n", f"    megatron:{value}\n    packages:\n")
    err = _load(tmp_path, text)
    assert (err.key, err.line) == ("targets.t.megatron", _line(text, "megatron:")), str(err)
    assert "expected a mapping" in str(err) and str(err).endswith(f"got {got}"), str(err)


@pytest.mark.parametrize("option,key,says", [
    ("enabled: maybe", "targets.t.megatron.transformer-engine-torch.enabled",
     "expected true or false"),
    ("prebuilt: [3]", "targets.t.megatron.transformer-engine-torch.prebuilt[0]",
     "expected {url: WHEEL_URL"),
    ("prebuilt: [{url: x}]", "targets.t.megatron.transformer-engine-torch.prebuilt[0]",
     "needs its sha256"),
])
def test_a_layer_option_is_named_as_written(tmp_path: Path, option: str, key: str,
                                            says: str) -> None:
    text = GOOD.replace("    packages:\n", f"{LAYER}      transformer-engine-torch:\n"
                        f"        {option}\n    packages:\n")
    err = _load(tmp_path, text)
    assert err.key == key, str(err)
    assert err.line == _line(text, f"        {option}"), str(err)
    assert says in str(err), str(err)


def test_a_layer_version_is_named_as_written(tmp_path: Path) -> None:
    text = GOOD.replace("    packages:\n", LAYER.replace('"2.19.0"', '"2.x"') + "    packages:\n")
    err = _load(tmp_path, text)
    assert (err.key, err.line) == ("targets.t.megatron.transformer-engine",
                                   _line(text, "transformer-engine:")), str(err)
    assert "invalid version '2.x'" in str(err)


def test_an_empty_gpu_list_says_it_is_empty(tmp_path: Path) -> None:
    text = GOOD.replace("gpus: [sm_90]", "gpus: []")
    err = _load(tmp_path, text)
    assert (err.key, err.line) == ("targets.t.gpus", _line(text, "gpus: []")), str(err)
    assert "the list is empty" in str(err) and "missing" not in str(err), str(err)
    assert "at least one name matching sm_" in str(err), str(err)


@pytest.mark.parametrize("char", ["\x00", "\x07"])
def test_a_character_yaml_refuses_is_one_line_with_its_line(tmp_path: Path, char: str) -> None:
    text = GOOD.replace('  python: "3.12"', f'  python: "3.1{char}2"')
    err = _load(tmp_path, text)
    message = str(err)
    assert "\n" not in message, message
    assert err.line == 3, message
    assert message.startswith(f"{tmp_path / 'matrix.yaml'}:3: "), message
    column = text.splitlines()[2].index(char) + 1
    assert f"U+{ord(char):04X}" in message and f"(column {column})" in message, message


# --------------------------------------------------------------------------- build-env.toml


@pytest.mark.parametrize("text,key,line", [
    ('[slurm]\nnodes = -3\n', "slurm.nodes", 2),
    ('a = 1\nslurm.nodes = -3\n', "slurm.nodes", 2),
    ('a = 1\n\nslurm = { partition = "gpu", nodes = -3 }\n', "slurm.nodes", 3),
    ('[slurm]\ntrain_cmd = """\nnodes = 1\n"""\nnodes = -3\n', "slurm.nodes", 5),
    ("[ 'slurm' ]\n'nodes'=-3\n", "slurm.nodes", 2),
    ('[slurm]\nenv = [\n  "A=1",\n]\nroce = true\n', "slurm.roce", 5),
    ('[slurm]\nenv = [\n  "A=1",\n]\nroce = true\n', "slurm.env", 2),
    ('[other]\nnodes = 1\n[slurm]\nnodes = -3\n', "slurm.nodes", 4),
])
def test_a_config_key_s_line_is_found_in_the_toml_text(text: str, key: str, line: int) -> None:
    assert config.key_lines(text)[key] == line
