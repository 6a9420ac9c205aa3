"""The memory a process tree holds, read from /proc: what a sandbox or a VM with everything it
started costs the host (a gVisor sandbox's `stats`, the X desktop's VM, bench/envs_bench.py).

Proportional set size, so pages the tree shares with others (a forked desktop's parent, the
Python it runs) are counted in shares, not once per process."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def tree_pss_bytes(pid: int, include_root: bool = True) -> int | None:
    """Proportional set size of the processes below `pid` (and of `pid` itself when
    `include_root`); None when none of them can be read (gone)."""
    total, todo = None, [pid]
    seen = [pid] if include_root else []
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    kids = [
                        int(k) for k in Path(f"/proc/{p}/task/{tid}/children").read_text().split()
                    ]
                    seen += kids
                    todo += kids
    for p in seen:
        with contextlib.suppress(OSError):
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            kib = next((int(ln.split()[1]) for ln in rollup.splitlines() if ln[:4] == "Pss:"), 0)
            total = (total or 0) + kib * 1024
    return total
