"""Issue 38's wrong messages, at the level of the code that words them: the atomic writer names
the user's path, VERL_ENV_NETWORK_TIMEOUT is held to its grammar, the doctor rounds what the
self-test measured, init refuses a directory holding someone else's files, and
docs/train-check.md says what the checker now does with the CPU fixture."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from builder.cluster import doctor
from builder.commands import init
from builder.errors import BuildEnvError, SiteError
from builder.files import atomic_write_text, naming
from builder.resolve import metadata
from builder.selftest.phases import preflight

REPO = Path(__file__).resolve().parents[2]


def test_atomic_write_onto_a_directory_names_the_directory(tmp_path: Path) -> None:
    out = tmp_path / "jobs"
    out.mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        atomic_write_text(out, "#!/bin/bash\n")
    assert caught.value.filename == str(out) and caught.value.errno == errno.EISDIR
    assert "cannot write" in caught.value.strerror
    assert list(tmp_path.rglob("*")) == [out], "a temporary file was left behind"


def test_atomic_write_where_no_file_can_be_made_names_the_path() -> None:
    where = Path("/proc/verl-env-38a-core")
    with pytest.raises(OSError) as caught:
        atomic_write_text(where, "x")
    assert caught.value.filename == str(where), caught.value
    assert ".part" not in str(caught.value)


def test_naming_keeps_the_errno_so_a_full_disk_stays_infrastructure() -> None:
    with pytest.raises(OSError) as caught:
        with naming("/the/users/path"):
            raise OSError(errno.ENOSPC, "No space left on device", "/the/users/.path.x.part")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == "/the/users/path"


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf", "1e400", "5s"])
def test_a_bad_network_timeout_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("VERL_ENV_NETWORK_TIMEOUT", value)
    with pytest.raises(BuildEnvError) as caught:
        metadata.network_timeout()
    assert caught.value.exit_code == 2
    assert "VERL_ENV_NETWORK_TIMEOUT" in str(caught.value) and repr(value) in str(caught.value)


@pytest.mark.parametrize("value,seconds", [("", metadata.NETWORK_TIMEOUT), ("2", 2.0),
                                           (" 0.5 ", 0.5)])
def test_a_good_network_timeout_is_taken(monkeypatch: pytest.MonkeyPatch, value: str,
                                         seconds: float) -> None:
    monkeypatch.setenv("VERL_ENV_NETWORK_TIMEOUT", value)
    assert metadata.network_timeout() == seconds


@pytest.mark.parametrize("size", [23.540164947509766, 1.0000001, 512.123456])
def test_doctor_prints_the_shm_size_rounded_with_its_unit(size: float) -> None:
    check = preflight.decide_shm(int(size * preflight.GiB), None, gpus_expected=True)
    finding = doctor.from_check(check)
    number = re.fullmatch(r"(\d+(?:\.\d{1,2})?) GiB \(>= 1 GiB\)", finding.message)
    assert number, finding.message
    assert abs(float(number.group(1)) - size) <= 0.05


def test_init_refuses_a_directory_with_files_and_keeps_version_control(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    init.refuse_occupied(tmp_path)  # only a .git: accepted
    for name in ("a.txt", "b", "c", "d"):
        (tmp_path / name).write_text("")
    with pytest.raises(SiteError) as caught:
        init.refuse_occupied(tmp_path)
    message = str(caught.value)
    assert str(tmp_path) in message and "a.txt" in message and "1 more" in message, message
    init.refuse_occupied(tmp_path / "new")  # absent: made by init


def test_train_check_doc_says_the_cpu_fixture_passes_the_trainer_stage() -> None:
    doc = (REPO / "docs" / "train-check.md").read_text()
    flat = " ".join(doc.split())
    assert "rejected at the `trainer` stage" not in flat
    # the words the checker itself gives a cpu image (builder/train/incheck/stages.py)
    said = re.search(r"not installed \((a cpu image has no rollout engine)\)",
                     (REPO / "builder" / "train" / "incheck" / "stages.py").read_text())
    assert said and said.group(1) in flat
    assert "passes** the `trainer` stage" in flat


def test_a_named_write_error_keeps_the_systems_words_for_its_reason(tmp_path: Path) -> None:
    """files.naming re-raises with the user's path and ``cannot write:``; a caller that words
    the error itself (sif --report: "cannot write the report (No space left on device)") reads
    the system's reason through files.reason, never "cannot write: cannot write: ..."."""
    from builder import files

    target = tmp_path / "r.json"
    with pytest.raises(OSError) as e:
        with files.naming(target):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".r.x.part"))
    assert e.value.filename == str(target) and e.value.errno == errno.ENOSPC
    assert e.value.strerror == "cannot write: No space left on device"
    assert files.reason(e.value) == "No space left on device"
    assert files.reason(OSError(errno.EACCES, "Permission denied")) == "Permission denied"
