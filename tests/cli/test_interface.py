"""The interface people expect from uv, buildx and apptainer, through the installed
``build-env``: --json documents with a schema, --quiet, progress lines on stderr, the site
config file (flags win), the site's own package index, and shell completion."""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURE, run_build_env


@pytest.fixture
def site(tmp_path: Path) -> Path:
    s = tmp_path / "site"
    s.mkdir()
    shutil.copy(FIXTURE, s / "matrix.yaml")
    shutil.copytree(FIXTURE.parent / "metadata", s / "metadata")
    shutil.copytree(FIXTURE.parent / "locks", s / "locks")
    return s


def test_json_documents_name_their_schema(site: Path, tmp_path: Path) -> None:
    for argv, kind in ((["list", "--json"], "list"), (["check", "--json"], "check"),
                       (["render", "--target", "cpu-x86_64", "--output", str(tmp_path / "ctx"),
                         "--json"], "render"),
                       (["init", str(tmp_path / "new-site"), "--json"], "init"),
                       (["slurm", "--target", "cpu-x86_64", "--runtime", "ch-run", "--sif",
                         str(tmp_path), "--data", str(tmp_path), "--model", "m", "--train-cmd",
                         "python3 train.py", "--output", str(tmp_path / "job.sbatch"),
                         "--json"], "slurm")):
        proc = run_build_env(*argv, cwd=site)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)  # stdout is the document and nothing else
        assert doc["schema"] == f"verl-env/{kind}/v1", argv
    check = json.loads(run_build_env("check", "--json", cwd=site).stdout)
    assert {t["status"] for t in check["targets"]} == {"ok"} and len(check["targets"]) == 3
    render = json.loads(run_build_env("render", "--target", "cpu-x86_64", "--output",
                                      str(tmp_path / "ctx"), "--json", cwd=site).stdout)
    assert Path(render["context"], "Dockerfile").is_file()
    assert render["lock_hash"].startswith("sha256:")


def test_quiet_prints_only_errors(site: Path, tmp_path: Path) -> None:
    proc = run_build_env("check", "--quiet", cwd=site)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    proc = run_build_env("render", "--target", "cpu-x86_64", "--output", str(tmp_path / "c"),
                         "-q", cwd=site)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout
    proc = run_build_env("check", "--quiet", "--target", "nope", cwd=site)
    assert proc.returncode == 2 and "unknown target 'nope'" in proc.stderr


def test_site_config_fills_defaults_and_flags_win(site: Path, tmp_path: Path) -> None:
    (site / "build-env.toml").write_text('[slurm]\npartition = "gpu-a"\nnodes = "3"\n')
    common = ["slurm", "--target", "cpu-x86_64", "--runtime", "ch-run", "--sif", str(tmp_path),
              "--data", str(tmp_path), "--model", "m", "--train-cmd", "python3 train.py"]
    proc = run_build_env(*common, "--output", str(tmp_path / "a.sbatch"), cwd=site)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "a.sbatch").read_text()
    assert "#SBATCH --partition=gpu-a" in text and "#SBATCH --nodes=3" in text
    proc = run_build_env(*common, "--partition", "gpu-b", "--output", str(tmp_path / "b.sbatch"),
                         cwd=site)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=gpu-b" in (tmp_path / "b.sbatch").read_text()
    # a mistake in the config names the file and the key
    (site / "build-env.toml").write_text('tag_prefix = "x"\nregistyr = "typo"\n')
    proc = run_build_env("check", cwd=site)
    assert proc.returncode == 2 and "build-env.toml" in proc.stderr and "registyr" in proc.stderr
    (site / "build-env.toml").write_text('[slurm]\nno_such_option = 1\n')
    proc = run_build_env(*common, "--output", str(tmp_path / "c.sbatch"), cwd=site)
    assert proc.returncode == 2 and "no_such_option" in proc.stderr
    assert not (tmp_path / "c.sbatch").exists()
    (site / "build-env.toml").write_text('tag_prefix = \n')
    proc = run_build_env("check", cwd=site)
    assert proc.returncode == 2 and "build-env.toml:1" in proc.stderr, proc.stderr


class _Recorder(http.server.BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        _Recorder.paths.append(self.path)
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorder.paths.clear()
    try:
        yield f"http://builder:s3cret-token@127.0.0.1:{server.server_port}/simple"
    finally:
        server.shutdown()
        server.server_close()


def test_a_site_index_is_used_and_its_credentials_never_printed(site: Path, index: str) -> None:
    """--index-url (or index_url in the config) points metadata at the site's own index; the
    token in its URL appears in no output."""
    (site / "build-env.toml").write_text(f'index_url = "{index}"\n')
    proc = run_build_env("check", "--online", cwd=site, timeout=300)
    assert proc.returncode != 0
    assert _Recorder.paths and _Recorder.paths[0].startswith("/simple/")
    assert "s3cret-token" not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "fetching metadata of" in proc.stderr  # the progress line came first


def test_shell_completion_knows_every_command_and_option(tmp_path: Path) -> None:
    proc = run_build_env("completion", "bash")
    assert proc.returncode == 0
    script = tmp_path / "build-env.bash"
    script.write_text(proc.stdout)
    if shutil.which("shellcheck"):
        lint = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True,
                              text=True)
        assert lint.returncode == 0, lint.stdout
    probe = (f'source {script}; COMP_WORDS=(build-env lock --upgrade-p); COMP_CWORD=2; '
             '_build_env; echo "${COMPREPLY[@]}"; COMP_WORDS=(build-env ch); COMP_CWORD=1; '
             '_build_env; echo "${COMPREPLY[@]}"')
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout.split("\n")
    assert out[0].split() == ["--upgrade-package"]
    assert out[1].split() == ["check"]
