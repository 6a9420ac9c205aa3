"""Scratch directories that a killed process does not leave behind for good.

A QEMU pool's overlays (about 120 MB a VM) and a gVisor host's checkpoint images live in a
temporary directory that their owner removes when it closes. A process killed outright (kill -9,
out of memory, the resume tests' killed trainer) cannot, and on a machine that runs the
pipeline again and again those directories add up until the disk is full. So each directory
names its owner (pid and the process's start time, which a reused pid does not share), and the
next one made with the same prefix removes those whose owner is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from envab.procfs import start_time

OWNER = ".owner"


def sweep(prefix: str, base: str | Path | None = None) -> list[Path]:
    """Remove the scratch directories `base/prefix*` whose owner has exited; those of a live
    owner, and directories that name no owner (not made here, or still being made), stay."""
    removed = []
    for path in Path(base or tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            pid, started = (path / OWNER).read_text().split()
            alive = start_time(int(pid)) == int(started)
        except (OSError, ValueError):
            continue
        if not alive:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def make(prefix: str, base: str | Path | None = None) -> Path:
    """A new scratch directory owned by this process, after sweeping its prefix's dead ones."""
    sweep(prefix, base)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    (path / OWNER).write_text(f"{os.getpid()} {start_time(os.getpid())}\n")
    return path
