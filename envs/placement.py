"""Which CPUs the trainer and the arm's processes run on (`training.cpus`, pre-registered).

On a machine with cores to spare, the environments (QEMU VMs, the embedded host and its gVisor
sandboxes) can run on CPUs of their own, apart from the trainer's, so that each half's clock
measures its own work and not the other's: `pin` restricts the calling process (the training job,
before torch starts its threads) to the trainer's CPUs, and every child started through
`envs/lifetime.py: start_child` from then on to the environments' (its own children inherit them).
Both sets must be CPUs this process may use, and apart. Unset, nothing is pinned.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from envab.errors import Refusal

_environments: frozenset[int] | None = None


class PlacementError(Refusal, ValueError):
    pass


def pin(trainer: Iterable[int], environments: Iterable[int]) -> dict:
    """Pin this process to `trainer` and its children from now on to `environments`; returns
    what the run records (`run.json: placement`)."""
    global _environments
    trainer, environments = frozenset(trainer), frozenset(environments)
    available = frozenset(os.sched_getaffinity(0))
    if not trainer or not environments:
        raise PlacementError("training.cpus: the trainer and the environments need a CPU each")
    if missing := (trainer | environments) - available:
        raise PlacementError(
            f"training.cpus: CPUs {sorted(missing)} are not available to this job "
            f"(it may use {sorted(available)})"
        )
    if shared := trainer & environments:
        raise PlacementError(f"training.cpus: CPUs {sorted(shared)} are given to both halves")
    for task in os.listdir("/proc/self/task"):  # every thread already started, not just this one
        os.sched_setaffinity(int(task), trainer)
    _environments = environments
    return {"trainer": sorted(trainer), "environments": sorted(environments)}


def place_child() -> None:
    """In a child between fork and exec: run on the environments' CPUs, when pinned."""
    if _environments is not None:
        os.sched_setaffinity(0, _environments)


def unpinned() -> None:
    """Forget the environments' CPUs (tests)."""
    global _environments
    _environments = None
