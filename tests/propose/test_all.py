"""`propose` finishes what it starts: `--all` goes on past a target that fails, reports each
target, exits with the failures' code and leaves no candidate directory for a failed target;
`--output` takes only a new or empty directory or one this tool wrote. Offline: the recorded
snapshot of tests/propose/data, `--no-lock` (the tool's own search, no uv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.commands import propose as command
from builder.errors import InfraError
from builder.propose import candidate, outputs
from tests.conftest import run_build_env
from tests.propose import test_search

site = test_search.site  # the fixture: the data site copied

# pins no release set can satisfy: transformers 5.23.0 is above what the newest verl allows
# (<5.11), and the search never moves a pin down
BROKEN = """  broken:
    description: pins that cannot fit (verl 0.9.1 requires transformers<5.11)
    accelerator: cuda
    arch: x86_64
    cuda: "13.0"
    gpus: [sm_90]
    base: {image: "example/cuda:13.0", glibc: "2.35"}
    packages:
      torch: "2.11.0"
      vllm: "0.24.0"
      transformers: "5.23.0"

"""


@pytest.fixture
def broken_site(site: Path) -> Path:
    """The data site with a failing target between its two good ones (gpu, broken, cpu)."""
    text = site.read_text()
    assert "\n  cpu:\n" in text
    site.write_text(text.replace("\n  cpu:\n", "\n" + BROKEN + "  cpu:\n", 1))
    return site


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _propose(matrix: Path, *args: str):
    return run_build_env("propose", "--matrix", str(matrix), "--no-lock", *args)


def test_all_goes_on_past_a_failing_target(broken_site: Path,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    site_before = _tree(broken_site.parent)
    elsewhere = tmp_path_factory.mktemp("out")
    out = elsewhere / "proposals"
    proc = _propose(broken_site, "--all", "--output", str(out), "--json")
    # the failure's own code: no coherent set is the matrix's fault (bad input, exit 2)
    assert proc.returncode == 2, proc.stderr
    assert "[broken] no coherent set of pins for targets.broken" in proc.stderr
    doc = json.loads(proc.stdout)
    assert [(t["target"], t["status"], t["exit_code"]) for t in doc["targets"]] == [
        ("gpu", "searched", 0), ("broken", "error", 2), ("cpu", "searched", 0)]
    assert doc["failed"] == ["broken"] and doc["exit_code"] == 2
    # the target after the failing one was processed; nothing is left for the failed one
    assert sorted(p.name for p in out.iterdir()) == [".verl-env-proposals", "cpu", "gpu"]
    assert json.loads((out / "cpu" / "proposal.json").read_text())["target"] == "cpu"
    assert _tree(broken_site.parent) == site_before  # nothing in the site (its locks/ included)
    # each earlier result is what a single-target propose writes
    for name in ("gpu", "cpu"):
        single = elsewhere / f"single-{name}"
        assert _propose(broken_site, "--target", name, "--output", str(single)).returncode == 0
        assert _tree(out / name) == _tree(single), name


def test_all_reports_each_target_in_one_line(broken_site: Path, tmp_path: Path) -> None:
    proc = _propose(broken_site, "--all")
    assert proc.returncode == 2, proc.stderr
    outcome = proc.stdout.split("\noutcome:\n", 1)[1].splitlines()
    assert [line.split(":", 1)[0].strip() for line in outcome[:3]] == ["gpu", "broken", "cpu"]
    assert outcome[0].strip() == "gpu: searched"
    assert outcome[1].strip().startswith("broken: failed, exit 2, error: ")
    assert outcome[3] == "2 of 3 targets proposed; failed: broken (exit 2)"


def test_a_single_failing_target_leaves_nothing(broken_site: Path, tmp_path: Path) -> None:
    out = tmp_path / "one"
    proc = _propose(broken_site, "--target", "broken", "--output", str(out))
    assert proc.returncode == 2 and "no coherent set" in proc.stderr
    assert not out.exists()


def test_output_refuses_a_directory_it_did_not_write(broken_site: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    before = _tree(tmp_path)
    for args in (("--all",), ("--target", "gpu", "--target", "cpu"), ("--target", "gpu")):
        proc = _propose(broken_site, *args, "--output", str(foreign))
        assert proc.returncode == 2, (args, proc.stderr)
        assert f"--output: {foreign} is a non-empty directory that this tool did not write" \
            in proc.stderr, args
        assert "nothing was written" in proc.stderr
        assert _tree(tmp_path) == before, args
        assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    # a file, and one target's candidate given as the directory of several
    file = tmp_path / "file.txt"
    file.write_text("x")
    proc = _propose(broken_site, "--all", "--output", str(file))
    assert proc.returncode == 2 and f"--output: {file} exists and is not a directory" in proc.stderr
    one = tmp_path / "one"
    assert _propose(broken_site, "--target", "gpu", "--output", str(one)).returncode == 0
    proc = _propose(broken_site, "--target", "gpu", "--target", "cpu", "--output", str(one))
    assert proc.returncode == 2 and "is the candidate of a single target" in proc.stderr
    assert sorted(p.name for p in one.iterdir()) == sorted(
        [".verl-env-proposal", "PROPOSAL.md", "matrix.diff", "matrix.yaml", "metadata",
         "proposal.json"])
    # a candidate directory of several that holds a directory it did not write
    several = tmp_path / "several"
    (several / "gpu").mkdir(parents=True)
    (several / outputs.SEVERAL_MARKER).write_text("")
    (several / "gpu" / "notes.txt").write_text("keep")
    proc = _propose(broken_site, "--target", "gpu", "--target", "cpu", "--output", str(several))
    assert proc.returncode == 2 and f"{several / 'gpu'} is a non-empty directory" in proc.stderr
    assert not (several / "cpu").exists()


def test_output_takes_its_own_earlier_output_and_an_empty_directory(broken_site: Path,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "proposals"
    out.mkdir()  # empty: taken
    both = ("--target", "gpu", "--target", "cpu", "--output", str(out))
    assert _propose(broken_site, *both).returncode == 0
    assert (out / outputs.SEVERAL_MARKER).is_file()
    again = _propose(broken_site, *both, "--hold", "transformers")
    assert again.returncode == 0, again.stderr
    for name in ("gpu", "cpu"):
        doc = json.loads((out / name / "proposal.json").read_text())
        assert doc["anchors"]["hold"] == ["transformers"], name
    # --all over it: the failed target gets nothing, the others are replaced
    assert _propose(broken_site, "--all", "--output", str(out)).returncode == 2
    assert sorted(p.name for p in out.iterdir()) == [".verl-env-proposals", "cpu", "gpu"]
    assert json.loads((out / "gpu" / "proposal.json").read_text())["anchors"]["hold"] == []


def test_every_target_failing_leaves_no_directory(broken_site: Path, tmp_path: Path) -> None:
    broken_site.write_text(broken_site.read_text() + "\n" + BROKEN.replace("  broken:",
                                                                          "  broken2:"))
    out = tmp_path / "proposals"
    proc = _propose(broken_site, "--target", "broken", "--target", "broken2", "--output",
                    str(out))
    assert proc.returncode == 2, proc.stderr
    assert not out.exists()


# ----------------------------------------------------------------------- the rule, the cleanup


def test_the_exit_code_of_several_targets() -> None:
    assert command.combined_exit([0, 0]) == 0
    assert command.combined_exit([0, 2, 2]) == 2
    assert command.combined_exit([1, 0]) == 1
    assert command.combined_exit([2, 3]) == 1
    assert command.combined_exit([3]) == 3


def _job(site_path: Path, tmp_path: Path, **flags: object):
    import argparse

    from builder.propose.search import Anchors
    from builder.resolve.targets import open_site

    s = open_site(site_path, None)
    args = argparse.Namespace(no_lock=False, no_fetch=True, build=True, quiet=True, json=True,
                              ca_bundle=None, templates=None, tag_prefix="t", network="default",
                              verify_timeout=1, gpus="auto", expect_gpus=None, **flags)
    return s, command._Run(args, s, s.snapshot(), Anchors(), tmp_path)


def test_a_target_failing_after_its_candidate_was_written_leaves_none(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error after the candidate went in (here: the engine, as the build meets it) removes
    the candidate this run wrote; Ctrl-C does too, and stops the run."""
    parent = tmp_path / "proposals"
    s, job = _job(site, parent)
    monkeypatch.setattr(candidate, "resolve", _resolved)
    written = []
    real_write = candidate.write

    def write(out: Path, **kw: object) -> None:
        real_write(out, **kw)
        written.append(sorted(p.name for p in out.iterdir()))

    monkeypatch.setattr(candidate, "write", write)

    def engine_down(*_: object) -> int:
        raise InfraError("the engine does not answer")

    monkeypatch.setattr(candidate, "build", engine_down)
    result = job.one(s.matrix.target("gpu"), parent / "gpu")
    assert (result.status, result.code, result.output) == ("error", 3, None)
    assert written and "proposal.json" in written[0]  # it was there ...
    assert not (parent / "gpu").exists()  # ... and is gone

    def interrupted(*_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(candidate, "build", interrupted)
    with pytest.raises(KeyboardInterrupt):
        job.one(s.matrix.target("gpu"), parent / "gpu")
    assert len(written) == 2 and not (parent / "gpu").exists()
    assert (parent / outputs.SEVERAL_MARKER).is_file()  # the directory of several stays


def _resolved(_site: Path, target, proposal, *_: object, **__: object):
    proposal.status = "resolved"
    return target
