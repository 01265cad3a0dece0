"""A lock is what `build-env lock` wrote (issue 29, item 4): `check --locked` fails and `render`
refuses when the lock was edited since, and the message names the removed entry or the edited
hash. The lock's header records a digest of its body and of each entry (builder.resolve.lockfile), so
this needs no resolution: a copy of the reference site, edited as a hand (or a bad merge) would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.resolve import lockfile as lockbody
from builder.cli import main
from builder.resolve.targets import init_site
from tests.conftest import REPO

TARGET = "cuda-x86_64"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    init_site(root)
    return root


def _lock(site: Path) -> Path:
    return site / "locks" / f"{TARGET}.txt"


def _entry(lines: list[str], name: str) -> tuple[int, int]:
    """[start, end) of ``name``'s entry (with extras, if any): its requirement line to the
    next one."""
    start = next(i for i, ln in enumerate(lines) if ln.startswith((f"{name}==", f"{name}[")))
    end = next(i for i in range(start + 1, len(lines)) if lines[i][:1].isalnum())
    return start, end


def _edit(site: Path, fn) -> None:  # type: ignore[no-untyped-def]
    lines = _lock(site).read_text().splitlines(keepends=True)
    _lock(site).write_text("".join(fn(lines)))


def _cli(capsys: pytest.CaptureFixture[str], site: Path, *args: str) -> tuple[int, str]:
    code = main([*args, "--matrix", str(site / "matrix.yaml")])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out + out.err


def _refused(capsys: pytest.CaptureFixture[str], site: Path, tmp_path: Path, *names: str
             ) -> str:
    """check --locked fails (1) and render refuses, each naming ``names``; nothing rendered."""
    code, text = _cli(capsys, site, "check", "--locked", "--target", TARGET)
    assert code == 1, text
    assert f"{TARGET}: FAIL" in text
    for name in names:
        assert name in text, text
    code, rendered = _cli(capsys, site, "render", "--target", TARGET, "--output",
                          str(tmp_path / "ctx"))
    assert code == 1, rendered
    assert not (tmp_path / "ctx").exists()
    for name in names:
        assert name in rendered, rendered
    return text


def test_every_shipped_and_fixture_lock_is_what_lock_wrote() -> None:
    locks = sorted(p for p in REPO.rglob("locks/*.txt") if ".git" not in p.parts)
    assert len(locks) >= 5
    for path in locks:
        assert lockbody.problems(path, path.read_text(), "build-env lock") == [], path


def test_an_untouched_lock_checks_and_renders(capsys: pytest.CaptureFixture[str], site: Path,
                                              tmp_path: Path) -> None:
    code, text = _cli(capsys, site, "check", "--locked", "--target", TARGET)
    assert code == 0 and f"{TARGET}: ok" in text, text
    code, text = _cli(capsys, site, "render", "--target", TARGET, "--output",
                      str(tmp_path / "ctx"))
    assert code == 0, text


def test_a_removed_entry_is_named(capsys: pytest.CaptureFixture[str], site: Path,
                                  tmp_path: Path) -> None:
    def drop(lines: list[str]) -> list[str]:
        a, b = _entry(lines, "accelerate")
        return lines[:a] + lines[b:]

    _edit(site, drop)
    text = _refused(capsys, site, tmp_path, "accelerate")
    assert "removed" in text


def test_sixteen_deleted_lines_are_named(capsys: pytest.CaptureFixture[str], site: Path,
                                         tmp_path: Path) -> None:
    """The finding as reported: 16 lines from accelerate's on deleted (a whole entry or two and
    part of the next one's hashes)."""
    def drop(lines: list[str]) -> list[str]:
        a, _ = _entry(lines, "accelerate")
        return lines[:a] + lines[a + 16:]

    _edit(site, drop)
    _refused(capsys, site, tmp_path, "accelerate", "removed")


def test_an_edited_hash_is_named_with_its_line(capsys: pytest.CaptureFixture[str], site: Path,
                                               tmp_path: Path) -> None:
    lines = _lock(site).read_text().splitlines(keepends=True)
    a, _ = _entry(lines, "accelerate")
    old = lines[a + 1]
    assert "--hash=sha256:" in old
    at = old.index("sha256:") + len("sha256:")
    new = old[:at] + ("0" if old[at] != "0" else "1") + old[at + 1:]  # one hex digit changed
    _edit(site, lambda ls: ls[:a + 1] + [new] + ls[a + 2:])
    text = _refused(capsys, site, tmp_path, "accelerate==1.15.0", f"{TARGET}.txt:{a + 1}-")
    assert "edited" in text
    # without --locked too: an edited lock is not "not locked yet"
    code, plain = _cli(capsys, site, "check", "--target", TARGET)
    assert code == 1 and "accelerate" in plain, plain


def test_a_requirement_without_hash_is_named(capsys: pytest.CaptureFixture[str], site: Path,
                                             tmp_path: Path) -> None:
    def unhash(lines: list[str]) -> list[str]:
        a, b = _entry(lines, "accelerate")
        kept = [ln for ln in lines[a + 1:b] if "--hash=" not in ln]
        return lines[:a] + ["accelerate==1.15.0\n"] + kept + lines[b:]

    _edit(site, unhash)
    text = _refused(capsys, site, tmp_path, "accelerate==1.15.0")
    assert "has no --hash" in text


def test_a_lock_without_its_body_digest_is_refused(capsys: pytest.CaptureFixture[str],
                                                   site: Path, tmp_path: Path) -> None:
    _edit(site, lambda ls: [ln for ln in ls if not ln.startswith(lockbody.BODY_KEY)])
    _refused(capsys, site, tmp_path, "no body digest", f"build-env lock --target {TARGET}")


def test_a_missing_matrix_pin_is_named(tmp_path: Path) -> None:
    """verl's entry gone, the header rewritten to match (as a tool that recomputes it would):
    the lock no longer pins what the matrix pins."""
    site = tmp_path / "site"
    init_site(site)
    text = _lock(site).read_text()
    lines = text.splitlines(keepends=True)
    a, b = _entry(lines, "verl")
    header, body, _ = lockbody.split("".join(lines[:a] + lines[b:]))
    header = "".join(ln for ln in header.splitlines(keepends=True)
                     if not ln.startswith((lockbody.BODY_KEY, lockbody.ENTRIES_KEY)))
    head, regen = header.rsplit("# regenerate:", 1)
    _lock(site).write_text(head + lockbody.record(body) + "# regenerate:" + regen + body)
    problems = lockbody.pin_problems(_lock(site), _lock(site).read_text(), [("verl", "0.9.1")])
    assert problems == [f"{_lock(site)}: the matrix pins verl==0.9.1, the lock has no line "
                        "for it"]
    code = main(["check", "--locked", "--target", TARGET, "--matrix", str(site / "matrix.yaml")])
    assert code == 1
