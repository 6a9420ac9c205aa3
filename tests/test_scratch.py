"""Scratch directories of killed processes are swept; a live owner's are not (envs/scratch.py),
the owner told apart by the one /proc stat reader (envab/procfs.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from envab.envs import scratch
from envab.procfs import start_time, stat_fields

PREFIX = "envab-test-scratch-"


def _made_by_a_killed_process(base: Path) -> Path:
    """A scratch directory whose owner made it, then died of kill -9 (no clean-up ran)."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from envab.envs import scratch;"
            f"print(scratch.make({PREFIX!r}, {str(base)!r}), flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    path = Path(child.stdout.readline().strip())
    (path / "warm.qcow2").write_bytes(b"\0" * 4096)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    return path


def test_a_killed_owners_directory_is_swept_by_the_next_and_a_live_ones_stays(tmp_path):
    dead = _made_by_a_killed_process(tmp_path)
    mine = scratch.make(PREFIX, tmp_path)
    foreign = tmp_path / f"{PREFIX}not-ours"
    foreign.mkdir()  # names no owner: never touched
    assert dead.is_dir() is False, "the killed process's directory was left behind"
    assert mine.is_dir() and foreign.is_dir()
    assert scratch.sweep(PREFIX, tmp_path) == []  # this process is alive: its directory stays
    assert mine.is_dir()


def test_a_reused_pid_does_not_keep_a_dead_owners_directory(tmp_path):
    """The owner is the pid *and* its start time: a live process with the same pid but another
    start time is not the owner."""
    stale = tmp_path / f"{PREFIX}stale"
    stale.mkdir()
    (stale / scratch.OWNER).write_text(f"1 {(start_time(1) or 0) + 1}\n")
    assert scratch.sweep(PREFIX, tmp_path) == [stale]
    assert not stale.exists()


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields(tmp_path):
    # the kernel writes the command name as given: a process named "x) S 9 (evil" must not
    # have its ") S 9 (" read as fields
    stat = tmp_path / "stat"
    stat.write_text("4242 (x) S 9 (evil)) R 17 4242 " + " ".join(["0"] * 16) + " 777 0\n")
    fields = stat_fields(stat)
    assert (fields[0], fields[1], fields[19]) == ("R", "17", "777")
    # and the real file: this process's parent, and a start time no later than its child's
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert int(stat_fields(Path(f"/proc/{child.pid}/stat"))[1]) == os.getpid()
        assert start_time(os.getpid()) <= start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    assert start_time(child.pid) is None
