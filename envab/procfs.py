"""One reader of a process's /proc/<pid>/stat line, for the modules that tell processes apart
(envab/machine_load.py's outside threads, envs/scratch.py's owners of scratch directories).

The command name (field 2) sits in parentheses and may itself hold spaces and parentheses, so
the fields are read after its last ")". A pid the kernel reused belongs to a process with
another start time (field 22): a (pid, start time) pair names one process for good.
"""

from __future__ import annotations

from pathlib import Path


def stat_fields(path: Path) -> list[str]:
    """The fields of a /proc stat file after the command name: [0] is the state (field 3), [1]
    the parent pid (field 4), [19] the start time in clock ticks since boot (field 22).
    Raises OSError where the process (or thread) is gone."""
    text = path.read_text()
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None where there is no such
    process."""
    try:
        return int(stat_fields(Path(f"/proc/{pid}/stat"))[19])
    except (OSError, ValueError, IndexError):
        return None
