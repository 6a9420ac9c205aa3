"""Progress for the person watching `snakemake --cores all`: a few lines per job on the console,
everything else in the job's log.

A long job (the guest build, the warm start, a training run, an evaluation) is started with
`--log FILE`. It then sends its own output and its children's (library warnings, tqdm bars, the
embedded host) to that file, and keeps the terminal Snakemake gave it for one line when it starts
(where its log is), one line per checkpoint or tenth of the work (with an ETA), and one when it
ends:

    [train drums seed1] log: logs/embedded-default-v8/train_drums_seed1.log; budget ...
    [train drums seed1] checkpoint valid-000016: 16/48 valid (33%), 0 invalid, reward 0.62, ...
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TextIO


def duration(seconds: float) -> str:
    """61 -> '1m01s'; 3700 -> '1h01m'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def eta(done: float, total: float, elapsed: float) -> str:
    """The time left at the rate so far, or '?' before there is a rate."""
    if done <= 0 or elapsed <= 0:
        return "?"
    return duration((total - done) * elapsed / done)


class Console:
    """One job's lines on the console, each prefixed with the job's name."""

    def __init__(self, job: str, stream: TextIO | None):
        self.job = job
        self.stream = stream  # None: the job's whole output is on the terminal already
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        if self.stream is not None:
            print(f"[{self.job}] {text}", file=self.stream, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def job_console(job: str, log: str | Path | None, what: str = "") -> Console:
    """The job's console; with `log`, this process's stdout and stderr (and those of every child
    it starts) go to that file from here on, and the console keeps the terminal it had. Without
    one, everything stays on the terminal and the console says nothing more."""
    if log is None:
        return Console(job, None)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    with open(log, "a") as file:  # dup2 keeps the descriptor open after the close
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
    console = Console(job, terminal)
    _say_crashes(console, log)
    console.say(f"log: {Path(log).as_posix()}{'; ' + what if what else ''}")
    return console


def _say_crashes(console: Console, log: str | Path) -> None:
    """An unexpected exception's traceback goes to the log; its one line to the console too."""
    previous = sys.excepthook

    def hook(kind, value, traceback):
        console.say(f"failed: {kind.__name__}: {value} (traceback in {Path(log).as_posix()})")
        previous(kind, value, traceback)

    sys.excepthook = hook
