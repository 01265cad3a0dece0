"""The Megatron layer as matrix data (the catalogue's layers: megatron:, builder.matrix.stack_layer): a target switches it on with
``megatron:``; it adds verl's megatron extra, megatron-core, mbridge and TransformerEngine's three
distributions; bad entries are refused naming file:line:key; `check` and `list` see it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from builder.cli import main
from builder.resolve.compat import check_target
from builder.errors import SpecError
from builder.resolve.metadata import load_snapshot
from builder.matrix.spec import apply_overrides, load_matrix

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("cuda-x86_64-megatron", "cuda-arm64-megatron")

HEAD = """\
schema: 1
targets:
  t:
    accelerator: {accel}
    arch: x86_64
{cuda}    gpus: [{gpus}]
    base: {{image: "debian:bookworm@sha256:{digest}", glibc: "2.36"}}
    python: "3.12"
    megatron:
{layer}
    packages:
      torch: "2.11.0"
      vllm: "0.24.0"
      ray: "2.60.0"
      transformers: "5.9.0"
      tensordict: "0.10.0"
      verl: {{version: "0.9.1", extras: [vllm]}}
{extra}"""
LAYER = """\
      megatron-core: "0.19.2"
      mbridge: "0.15.1"
      transformer-engine: "2.19.0\""""


def _matrix(tmp_path: Path, layer: str = LAYER, *, accel: str = "cuda", cuda: bool = True,
            extra: str = "") -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(HEAD.format(accel=accel, cuda='    cuda: "13.0"\n' if cuda else "",
                                gpus="sm_90" if accel == "cuda" else "gfx942",
                                digest="a" * 64, layer=layer, extra=extra))
    return path


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("name", TARGETS)
def test_the_shipped_megatron_targets_switch_the_layer_on(name: str) -> None:
    t = load_matrix(REPO / "matrix.yaml").target(name)
    assert t.layer is not None and t.layer.name == "megatron" and t.layer.extra == "megatron"
    pins = {p.name: p for p in t.enabled_packages}
    assert {n: pins[n].version for n in ("megatron-core", "mbridge", "transformer-engine",
                                         "transformer-engine-cu13",
                                         "transformer-engine-torch")} == {
        "megatron-core": "0.19.2", "mbridge": "0.15.1", "transformer-engine": "2.19.0",
        "transformer-engine-cu13": "2.19.0", "transformer-engine-torch": "2.19.0"}
    assert pins["verl"].extras == ("megatron", "vllm")  # verl's own megatron extra
    assert pins["transformer-engine-torch"].build == "source"  # an sdist only on the index
    assert pins["transformer-engine-cu13"].build == "wheel"
    assert {n: pins[n].module for n in ("megatron-core", "transformer-engine",
                                        "transformer-engine-torch")} == {
        "megatron-core": "megatron.core", "transformer-engine": "transformer_engine.pytorch",
        "transformer-engine-torch": "transformer_engine_torch"}
    assert "apex" not in pins  # off by default: verl uses it only in its legacy model code
    assert t.to_dict()["megatron"]["transformer-engine"] == "2.19.0"


def test_the_cuda_major_version_names_the_core_wheel(tmp_path: Path) -> None:
    text = _matrix(tmp_path).read_text().replace('cuda: "13.0"', 'cuda: "12.9"')
    (tmp_path / "matrix.yaml").write_text(text)
    t = load_matrix(tmp_path / "matrix.yaml").target("t")
    assert t.package("transformer-engine-cu12") is not None
    assert t.package("transformer-engine-cu13") is None


@pytest.mark.parametrize("layer,key,message", [
    ('      extra: fsdp\n' + LAYER, "targets.t.megatron.extra", "must be one of megatron, mcore"),
    (LAYER.replace('      mbridge: "0.15.1"\n', ""), "targets.t.megatron",
     "missing key 'mbridge'"),
    (LAYER + '\n      megatron-bridge: "0.5.2"', "targets.t.megatron.megatron-bridge",
     "unknown key 'megatron-bridge'"),
    (LAYER.replace('"0.19.2"', "0.19"), "targets.t.megatron.megatron-core", "quoted string"),
    (LAYER + '\n      transformer-engine-torch: {wheel: x}',
     "targets.t.megatron.transformer-engine-torch.wheel", "unknown key 'wheel'"),
    (LAYER + '\n      apex: {enabled: true}', "targets.t.megatron.apex",
     "the index's 'apex' is another project"),
])
def test_a_bad_layer_names_file_line_key(tmp_path: Path, layer: str, key: str,
                                         message: str) -> None:
    path = _matrix(tmp_path, layer)
    with pytest.raises(SpecError) as err:
        load_matrix(path)
    text = str(err.value)
    assert key in text and message in text, text
    sub = key.rsplit(".", 1)[-1]
    line = _line(path, "megatron:" if sub == "megatron" else f"{sub}:")
    assert f"{path}:{line}:" in text, text
    assert "\n" not in text


def test_the_layer_is_for_cuda_targets_only(tmp_path: Path) -> None:
    path = _matrix(tmp_path, accel="rocm", cuda=False).read_text().replace(
        "accelerator: rocm", 'accelerator: rocm\n    rocm: "7.0.2"')
    (tmp_path / "matrix.yaml").write_text(path)
    with pytest.raises(SpecError, match="targets.t.megatron: the Megatron layer is for cuda"):
        load_matrix(tmp_path / "matrix.yaml")


def test_a_package_the_target_pins_itself_wins(tmp_path: Path) -> None:
    """A site moves one pin of the layer, or gives the extension prebuilt wheels, under
    packages: (the layer fills in only what the target does not pin)."""
    path = _matrix(tmp_path, extra='      megatron-core: "0.16.0"\n')
    t = load_matrix(path).target("t")
    assert t.package("megatron-core").version == "0.16.0"
    assert t.package("megatron-core").line == _line(path, 'megatron-core: "0.16.0"')
    assert t.package("mbridge").line == _line(path, 'mbridge: "0.15.1"')


def test_the_extension_takes_prebuilt_wheels_as_data(tmp_path: Path) -> None:
    sha = "b" * 64
    layer = LAYER + ("\n      transformer-engine-torch:\n        prebuilt:\n"
                     f"          - {{url: \"https://wheels.example/te.whl\", sha256: {sha}, "
                     "python: \"3.12\", arch: x86_64}")
    t = load_matrix(_matrix(tmp_path, layer)).target("t")
    te = t.package("transformer-engine-torch")
    assert te.build == "source"  # what a miss builds
    assert te.prebuilt == ({"url": "https://wheels.example/te.whl", "sha256": sha,
                            "python": "3.12", "arch": "x86_64"},)


def test_apex_from_a_commit_pinned_source_when_the_layer_names_it(tmp_path: Path) -> None:
    src = tmp_path / "apex-src"
    src.mkdir()
    layer = LAYER + f'\n      apex: {{version: "0.1", source: {{path: {src}}}}}'
    apex = load_matrix(_matrix(tmp_path, layer)).target("t").package("apex")
    assert apex is not None and apex.build == "source" and apex.source.kind == "path"
    assert apex.module == "apex"
    off = LAYER + f'\n      apex: {{version: "0.1", source: {{path: {src}}}, enabled: false}}'
    t = load_matrix(_matrix(tmp_path, off)).target("t")
    assert "apex" not in {p.name for p in t.enabled_packages}


def test_overrides_keep_the_layer_and_reach_its_packages() -> None:
    t = load_matrix(REPO / "matrix.yaml").target("cuda-x86_64-megatron")
    o = apply_overrides(t, ["python=3.11", "packages.megatron-core=0.16.0",
                            "packages.transformer-engine-torch.enabled=false"])
    assert o.layer == t.layer and o.override
    assert o.package("megatron-core").version == "0.16.0"
    # found in the acceptance run: an override build lost the gate's imports of the layer
    assert {p.name: p.module for p in o.enabled_packages if p.import_name} == {
        "megatron-core": "megatron.core", "mbridge": "mbridge",
        "transformer-engine": "transformer_engine.pytorch"}
    assert not o.package("transformer-engine-torch").enabled
    assert o.package("verl").extras == ("megatron", "vllm")


def test_check_names_megatron_cores_python_floor() -> None:
    """Found building here: megatron-core >= 0.17 needs python >= 3.12 (a Debian 12 base has
    3.11); check says so before anything resolves."""
    t = load_matrix(REPO / "matrix.yaml").target("cuda-x86_64-megatron")
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    assert check_target(t, snap) == []
    problems = [str(p) for p in check_target(apply_overrides(t, ["python=3.11"]), snap)]
    assert any("megatron-core 0.19.2's Requires-Python >=3.12" in p for p in problems), problems


@pytest.mark.parametrize("name", TARGETS)
def test_the_megatron_targets_are_locked(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--matrix", str(REPO / "matrix.yaml"), "--target", name,
                 "--locked"]) == 0, capsys.readouterr()
    lock = (REPO / "locks" / f"{name}.txt").read_text()
    for pin in ("megatron-core==0.19.2", "mbridge==0.15.1", "transformer-engine==2.19.0",
                "transformer-engine-cu13==2.19.0", "torch==2.11.0",
                "nvidia-cudnn-frontend==1.28.0"):
        assert f"\n{pin} \\" in lock, pin
    assert "transformer-engine-torch==" not in lock  # built from its sdist, not resolved
    build = (REPO / "locks" / f"{name}.build.txt").read_text()
    assert "\nnvidia-cuda-nvcc==13.2.86 \\" in build
    assert "\nnvidia-cuda-cccl==13.3.5.0.6 \\" in build  # <nv/target>, which cuda_fp16.h includes
    assert "\nnvidia-cudnn-frontend==1.28.0 \\" in build  # the main lock's, its headers


def test_list_shows_a_megatron_enabled_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--matrix", str(REPO / "matrix.yaml")]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("cuda-x86_64-megatron ") for line in out.splitlines()), out
    assert main(["list", "--matrix", str(REPO / "matrix.yaml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["targets"]
    assert data["cuda-arm64-megatron"]["megatron"]["extra"] == "megatron"


def test_a_layer_for_the_documented_example_parses(tmp_path: Path) -> None:
    """docs/megatron.md's example, as written there."""
    doc = (REPO / "docs" / "megatron.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    layer = "".join("    " + line + "\n" for line in textwrap.dedent(block).splitlines()[1:])
    t = load_matrix(_matrix(tmp_path, layer.rstrip("\n"))).target("t")
    assert t.layer is not None and t.package("transformer-engine-torch") is not None
