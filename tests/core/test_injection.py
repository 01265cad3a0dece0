"""Hostile matrix strings never change the structure of the rendered Dockerfile.

Every matrix field that reaches ``Dockerfile.j2`` gets values carrying newlines, ``;``, ``&&``,
``$()``, backticks, quotes, backslashes and the Unicode line separators (U+2028, U+2029, NEL).
Each value must be refused at ``check`` (the matrix's grammar, builder.matrix.grammar, or the
compatibility check) or render a Dockerfile whose instruction list, as BuildKit's own parser
reads it (the ``dockerfile`` package: Python bindings of moby/buildkit's Go parser), has the
same shape as the benign value's: the same instructions with the same flags and as many
arguments, and in every shell-form RUN the same shell operators outside quotes and as many
command substitutions. (The sbatch side of the same property is tests/slurm's.)
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import dockerfile
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.resolve.compat import check_target
from builder.errors import BuildEnvError
from builder.resolve.lock import lock_path
from builder.resolve.metadata import load_snapshot
from builder.render.context import compute
from builder.render.dockerfile import render_dockerfile
from builder.matrix.spec import load_matrix

REPO = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((REPO / "matrix.yaml").read_text())
SNAPSHOT = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
DIGEST = "sha256:" + "ab" * 32

FRAGMENTS = ["\n", "\r", "\r\n", ";", "&&", "||", "|", "$()", "$(id)", "`id`", "${PATH}", "$HOME",
             '"', "'", "\\", "\\\n", "\u2028", "\u2029", "\x85", "\t", " ", "#", "\x00",
             "\nRUN echo pwned", "\\\nRUN echo pwned", "; rm -rf /", "' && id && '",
             '" && id && "', "\nLABEL x=y", "\u2028RUN echo pwned"]

# (target, path inside the target's entry, benign value): every matrix string the Dockerfile
# template reads, directly or through what is computed from it.
FIELDS: list[tuple[str, tuple[Any, ...], str]] = [
    ("cuda-x86_64", ("base", "image"), "nvidia/cuda:13.0.2-base-ubuntu24.04"),
    ("cuda-x86_64", ("base", "source_image"), "nvidia/cuda:13.0.2-devel-ubuntu24.04"),
    ("cuda-x86_64", ("base", "bytecode_image"), "debian:bookworm"),
    ("cuda-x86_64", ("base", "digest"), DIGEST),
    ("cuda-x86_64", ("base", "glibc"), "2.39"),
    ("cuda-x86_64", ("apt", 0), "libibverbs1"),
    ("cuda-x86_64", ("python",), "3.12"),
    ("cuda-x86_64", ("cuda",), "13.0"),
    ("cuda-x86_64", ("gpus", 0), "sm_80"),
    ("cuda-x86_64", ("description",), "NVIDIA x86_64 (H100/H200/B200)"),
    ("cuda-x86_64", ("packages", "transformers"), "5.9.0"),
    ("cuda-x86_64", ("packages", "ray", "extras", 0), "default"),
    ("cuda-x86_64", ("packages", "flash-attn", "version"), "2.8.3"),
    ("cuda-x86_64", ("find_links", 0), "/srv/wheels"),
    ("cuda-x86_64", ("coverage_allow", "vllm/_flashmla_C*.so"), "FlashMLA kernels, Hopper only"),
    ("rocm-mi300", ("base", "image"),
     "rocm/verl:verl-0.7.1.amd0_rocm7.0.2_ubuntu22.04_py3.12_vllm0.20.2"),
    ("rocm-mi300", ("base", "interpreter"), "python3"),
    ("rocm-mi300", ("base", "sources", 0), "https://rocm.docs.amd.com/verl-install.html"),
    ("rocm-mi300", ("provided", "vllm"), "0.20.2rc1"),
    ("rocm-mi300", ("rocm",), "7.0.2"),
    ("rocm-mi300", ("packages", "transformers"), "5.9.0"),
]
FIELD_IDS = [f"{t}:{'.'.join(map(str, p))}" for t, p, _ in FIELDS]


def _entry(target: str) -> dict[str, Any]:
    entry = {**RAW.get("defaults", {}), **RAW["targets"][target]}
    entry["packages"] = {**RAW["defaults"]["packages"], **RAW["targets"][target]["packages"]}
    entry["apt"] = list(entry.get("apt", []))
    entry.setdefault("find_links", [])
    return yaml.safe_load(yaml.safe_dump(entry))  # a deep copy


def _put(entry: dict[str, Any], path: tuple[Any, ...], value: str) -> None:
    node: Any = entry
    for k in path[:-1]:
        node = node[k]
    last = path[-1]
    if isinstance(node, list) and last == len(node):
        node.append(value)
    elif isinstance(node, list):
        node[last] = value
    else:
        node[last] = value


def _matrix(directory: Path, target: str, path: tuple[Any, ...], value: str) -> Path:
    entry = _entry(target)
    if path == ("base", "digest") and "digest" not in entry["base"]:
        entry["base"]["digest"] = DIGEST
    if path[0] == "find_links" and not entry["find_links"]:
        entry["find_links"].append("/srv/wheels")
    _put(entry, path, value)
    text = yaml.safe_dump({"schema": 1, "targets": {target: entry}}, allow_unicode=False,
                          width=10_000)
    file = directory / "matrix.yaml"
    file.write_text(text)
    return file


def _shell_shape(command: str) -> tuple[Any, ...]:
    """The shell operators outside quotes and the command substitutions of one RUN line."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    try:
        operators = tuple(tok for tok in lexer if tok and set(tok) <= set(";&|()<>"))
    except ValueError as exc:  # an unbalanced quote
        operators = ("unbalanced", str(exc))
    return operators, command.count("$("), command.count("`")


def shape(text: str) -> list[tuple[Any, ...]]:
    """The Dockerfile's instruction list as BuildKit parses it, values reduced to their shape."""
    out = []
    for cmd in dockerfile.parse_string(text):
        shell = (_shell_shape(cmd.value[0]) if cmd.cmd.upper() == "RUN" and not cmd.json
                 and len(cmd.value) == 1 else ())
        out.append((cmd.cmd.upper(), tuple(f.split("=", 1)[0] for f in cmd.flags),
                    len(cmd.value), cmd.json, shell))
    return out


def render(file: Path, target: str) -> str | None:
    """The rendered Dockerfile, or None when `check` refuses the matrix (bad input or a
    failed compatibility check)."""
    try:
        t = load_matrix(file).target(target)
    except BuildEnvError as exc:
        assert "\n" not in str(exc) and "\u2028" not in str(exc), str(exc)
        return None
    if check_target(t, SNAPSHOT):
        return None
    lock = lock_path(REPO / "matrix.yaml", t)
    ctx = compute(t, lock.read_text(), SNAPSHOT, lock_file=lock)
    return render_dockerfile(ctx)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("injection")


_BENIGN: dict[int, list[tuple[Any, ...]]] = {}


def _benign_shape(i: int, workdir: Path) -> list[tuple[Any, ...]]:
    if i not in _BENIGN:
        target, path, benign = FIELDS[i]
        text = render(_matrix(workdir, target, path, benign), target)
        assert text is not None, f"the benign value of {FIELD_IDS[i]} must render"
        _BENIGN[i] = shape(text)
    return _BENIGN[i]


def _holds(i: int, value: str, workdir: Path) -> None:
    target, path, _ = FIELDS[i]
    text = render(_matrix(workdir, target, path, value), target)
    if text is None:
        return  # refused at check
    assert shape(text) == _benign_shape(i, workdir), (
        f"{FIELD_IDS[i]} = {value!r} changed the Dockerfile's structure")


@pytest.mark.parametrize("i", range(len(FIELDS)), ids=FIELD_IDS)
def test_every_fragment_at_the_end_of_every_field(workdir: Path, i: int) -> None:
    """Each hostile fragment appended to each field's benign value (the deterministic floor
    under the property test below)."""
    for fragment in FRAGMENTS:
        _holds(i, FIELDS[i][2] + fragment, workdir)


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(i=st.integers(0, len(FIELDS) - 1), data=st.data())
def test_hostile_values_are_refused_or_change_nothing(workdir: Path, i: int, data) -> None:
    benign = FIELDS[i][2]
    pieces = data.draw(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), min_size=1,
                                max_size=3))
    at = data.draw(st.integers(0, len(benign)))
    replace_all = data.draw(st.booleans())
    value = "".join(pieces) if replace_all else benign[:at] + "".join(pieces) + benign[at:]
    _holds(i, value, workdir)


def test_the_parser_sees_an_injected_instruction() -> None:
    """The shape is not blind: a newline in a FROM line is a new instruction, and an operator in
    a RUN line is a new shell command (what today's main rendered for the issue's examples)."""
    good = "FROM a:b AS runtime\nRUN apt-get install -y curl\n"
    assert shape(good) != shape("FROM a:b\nRUN echo pwned AS runtime\nRUN apt-get install -y "
                                "curl\n")
    assert shape(good) != shape("FROM a:b AS runtime\nRUN apt-get install -y curl; rm -rf /\n")
    assert shape(good) != shape("FROM a:b AS runtime\nRUN apt-get install -y $(id)\n")
    assert shape(good) == shape("FROM a:b AS runtime\nRUN apt-get install -y 'curl; rm'\n")
