"""A job's console lines and its log: what the person watching `snakemake` sees, and what goes to
the file instead."""

from __future__ import annotations

import subprocess
import sys

from envab.progress import duration, eta

JOB = """
import subprocess, sys
from envab.progress import job_console
console = job_console("train drums seed1", sys.argv[1], "GRPO")
print("a library's chatter")
subprocess.run(["echo", "a child's output"], check=True)
console.say("checkpoint valid-000016: 16/48 valid")
raise RuntimeError("boom")
"""


def test_the_console_gets_the_jobs_lines_and_the_log_everything_else(tmp_path):
    log = tmp_path / "logs" / "train.log"
    result = subprocess.run(
        [sys.executable, "-c", JOB, str(log)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    console = result.stderr.splitlines()
    assert console == [
        f"[train drums seed1] log: {log.as_posix()}; GRPO",
        "[train drums seed1] checkpoint valid-000016: 16/48 valid",
        f"[train drums seed1] failed: RuntimeError: boom (traceback in {log.as_posix()})",
    ]
    assert result.stdout == ""
    text = log.read_text()
    for line in ("a library's chatter", "a child's output", "Traceback", "RuntimeError: boom"):
        assert line in text


def test_durations_and_etas_read_at_a_glance():
    assert [duration(s) for s in (0, 9.6, 61, 3599, 3700)] == [
        "0s",
        "10s",
        "1m01s",
        "59m59s",
        "1h01m",
    ]
    assert eta(0, 48, 10) == "?"
    assert eta(16, 48, 14) == "28s"  # 32 left at 16 per 14 s


def test_without_a_log_the_output_stays_on_the_terminal_once(tmp_path):
    job = JOB.replace("sys.argv[1]", "None")
    result = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, timeout=60)
    assert "a library's chatter" in result.stdout
    assert "[train drums seed1]" not in result.stdout + result.stderr  # nothing said twice
    assert result.stderr.count("RuntimeError: boom") == 1
