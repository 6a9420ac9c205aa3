"""What the machine was doing while a timed job ran, measured rather than assumed.

Wall-clock comparisons between arms mean something only when the load beside them is known: the
CPU time this job and its children used (getrusage), the load average, and the share of CPU time
the hypervisor stole from this virtual machine (/proc/stat's `steal` column). A timed job takes a
snapshot when its clock starts and reads the difference when it ends (`Snapshot`, `since`).

A timing window (trainer/timing.py) also reads what every thread outside its run asked of the
CPUs, before and after (`outside_threads`, `outside_demand_s`): the load rule judges that demand.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from envab.procfs import stat_fields

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


# What the load beside a run *wanted*, not what it got. The CPU time outside processes obtain
# depends on the run beside them: an arm that keeps every core busy leaves a steady outside job
# less CPU than an arm that waits, so "outside load obtained" differs between the arms of a block
# under the very same outside job (v17's whole job under a registered load: drums 0.24-0.26,
# qemu 0.12-0.14, every block refused). The time an outside thread spent running *or waiting to
# run* (the kernel's per-thread schedstat) is what it asked for, whichever arm ran beside it.
PROC = Path("/proc")
Thread = tuple[int, int]  # (tid, start time in ticks since boot): a tid the kernel reused is new


def _tree(root: int, parents: dict[int, int]) -> set[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


def outside_threads(exclude_tree_of: int) -> dict[Thread, tuple[int, int]] | None:
    """Nanoseconds every thread outside the process tree of `exclude_tree_of` has spent running and
    waiting for a CPU, since it started; None where the kernel keeps no per-thread schedstat."""
    if not (PROC / "self" / "schedstat").is_file():
        return None
    parents = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(stat_fields(entry / "stat")[1])
            except (OSError, ValueError, IndexError):
                continue  # ended while read
    excluded = _tree(exclude_tree_of, parents)
    threads: dict[Thread, tuple[int, int]] = {}
    for pid in parents.keys() - excluded:
        try:
            tids = [t.name for t in (PROC / str(pid) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            task = PROC / str(pid) / "task" / tid
            try:
                run_ns, wait_ns = (int(x) for x in (task / "schedstat").read_text().split()[:2])
                started = int(stat_fields(task / "stat")[19])
            except (OSError, ValueError, IndexError):
                continue
            threads[(int(tid), started)] = (run_ns, wait_ns)
    if not any(wait for _, wait in threads.values()):
        return None  # the file is there but nothing counts waits (no sched_info): no demand
    return threads


# A thread that ran less than this share of one CPU between the scans is a light one (a kernel
# thread, a daemon): its wait is the latency the run beside it caused at each wake-up, not load
# it offered. Measured in v18's first quiet timing job: DAMON's kernel thread waited 0.10 of a CPU
# beside a QEMU window while running 0.006, and a block was refused for it. A CPU-bound thread
# (the registered load's worker ran 0.24 of a CPU even beside every core busy) counts its wait.
CPU_BOUND = 0.05


def outside_demand_s(
    before: dict[Thread, tuple[int, int]], after: dict[Thread, tuple[int, int]], span_s: float
) -> tuple[float, float]:
    """CPU seconds the outside threads wanted over the `span_s` seconds between two scans, and of
    those the seconds they ran. A CPU-bound thread wants its time running plus waiting to run; a
    light one (below CPU_BOUND), its time running. A thread that began after `before` counts from
    its start; one that ended before `after` is missed (its CPU time is still in the machine's
    ticks: the caller adds what the ticks hold beyond the threads seen)."""
    wanted = ran = 0
    for thread, (run_ns, wait_ns) in after.items():
        run0, wait0 = before.get(thread, (0, 0))
        run = run_ns - run0
        ran += run
        wanted += run + (wait_ns - wait0 if run >= CPU_BOUND * span_s * 1e9 else 0)
    return wanted / 1e9, ran / 1e9
