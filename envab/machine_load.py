"""What the machine was doing while a timed job ran, measured rather than assumed.

Wall-clock comparisons between arms mean something only when the load beside them is known: the
CPU time this job and its children used (getrusage), the load average, and the share of CPU time
the hypervisor stole from this virtual machine (/proc/stat's `steal` column). A timed job takes a
snapshot when its clock starts and reads the difference when it ends.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def cpu_ticks() -> list[int] | None:
    """The machine's aggregate CPU ticks (user nice system idle iowait irq softirq steal ...)."""
    try:
        first = PROC_STAT.read_text().splitlines()[0].split()
    except OSError:
        return None
    return [int(x) for x in first[1:]] if first and first[0] == "cpu" else None


def _cpu_seconds() -> tuple[float, float]:
    """User and system CPU seconds of this process, and of its children that have finished."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@dataclass(frozen=True)
class Snapshot:
    monotonic: float
    own_cpu_s: float
    children_cpu_s: float
    ticks: list[int] | None

    @property
    def cpu_s(self) -> float:
        return self.own_cpu_s + self.children_cpu_s

    @classmethod
    def now(cls) -> Snapshot:
        return cls(time.monotonic(), *_cpu_seconds(), cpu_ticks())


def since(start: Snapshot) -> dict:
    """The load between `start` and now, as a run record carries it."""
    end = Snapshot.now()
    wall = end.monotonic - start.monotonic
    cpu = end.cpu_s - start.cpu_s
    cores = os.cpu_count() or 1
    record = {
        "wall_s": wall,
        "cpu_s": cpu,
        # the job's own process, and its finished children (an arm's host, sandboxes and VMs,
        # a judge): a training run's environment CPU time, where its processes are its children
        "own_cpu_s": end.own_cpu_s - start.own_cpu_s,
        "children_cpu_s": end.children_cpu_s - start.children_cpu_s,
        "cpu_hours": cpu / 3600,
        "cores": cores,
        "cpu_utilisation": cpu / (wall * cores) if wall > 0 else None,
        "loadavg_1_5_15": list(os.getloadavg()),
        "steal_fraction": None,
        "machine_busy_fraction": None,
    }
    if start.ticks and end.ticks:
        delta = [b - a for a, b in zip(start.ticks, end.ticks, strict=False)]
        total = sum(delta[:8])  # guest and guest_nice are already inside user and nice
        if total > 0:
            idle = delta[3] + (delta[4] if len(delta) > 4 else 0)
            record["steal_fraction"] = (delta[7] if len(delta) > 7 else 0) / total
            record["machine_busy_fraction"] = 1 - idle / total
    return record
