"""The code pins (envab/codepins.py): one list for every config, named from the working
directory, and a freeze on a dirty tree recorded file by file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from envab import codepins

REPO = Path(__file__).resolve().parent.parent


def test_the_list_covers_what_decides_the_answer_and_matches_the_repository():
    groups = codepins.pin_groups(codepins.CODE_PINS, REPO)
    files = {path for g in groups.values() for path in g["files"]}
    for deciding in (
        "analysis/stop_at_target.py",  # the judge
        "analysis/crossing.py",  # the crossing rule
        "analysis/confirm.py",  # the confirmation
        "analysis/statistics.py",  # the paired test
        "analysis/outcome.py",  # the verdict as rendered
        "trainer/grpo.py",
        "eval/heldout.py",
        "envs/protocol.py",
        "Snakefile",
    ):
        assert deciding in files, deciding


def test_patterns_are_named_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO / ".test")
    assert codepins.code_pins(REPO)["analysis"] == ["../analysis/**/*.py"]
    monkeypatch.chdir(REPO)
    assert codepins.code_pins(REPO)["analysis"] == ["analysis/**/*.py"]


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


def test_pinned_files_that_differ_from_the_commit_are_named(tmp_path, monkeypatch):
    (tmp_path / "analysis").mkdir()
    for name in ("a.py", "b.py"):
        (tmp_path / "analysis" / name).write_text(f"# {name}\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "c")
    monkeypatch.chdir(tmp_path)
    paths = ["analysis/a.py", "analysis/b.py"]
    assert codepins.uncommitted(paths) == []
    (tmp_path / "analysis" / "b.py").write_text("# edited\n")
    (tmp_path / "analysis" / "c.py").write_text("# new, never committed\n")
    assert codepins.uncommitted([*paths, "analysis/c.py"]) == ["analysis/b.py", "analysis/c.py"]


def test_outside_a_checkout_nothing_is_claimed(tmp_path, monkeypatch):
    (tmp_path / "x.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    assert codepins.uncommitted(["x.py"]) is None


def test_a_changed_pinned_file_is_named(tmp_path):
    (tmp_path / "analysis").mkdir()
    judge = tmp_path / "analysis" / "stop_at_target.py"
    judge.write_text("STOP = 'target_confirmed'\n")
    patterns = {"analysis": ["analysis/**/*.py"]}
    frozen = {"patterns": patterns, "groups": codepins.pin_groups(patterns, tmp_path)}
    assert codepins.changed_since(frozen, tmp_path) == []
    judge.write_text("STOP = 'target_reached'\n")
    assert codepins.changed_since(frozen, tmp_path) == ["analysis/stop_at_target.py"]
    judge.unlink()
    with pytest.raises(FileNotFoundError):
        codepins.changed_since(frozen, tmp_path)
