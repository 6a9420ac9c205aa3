"""Command line of the QEMU arm.

    python -m envab.envs.qemu build [--cache build/qemu] [--memory 256] [--accel auto] [--record F]
    python -m envab.envs.qemu check [--cache build/qemu] [--memory 256] [--vms 1] [--seed 1]

`build` builds (or finds cached) the guest and its warm snapshot. `check` starts the pool and
plays every task family's oracle (must score 1) and first near miss (must score 0), printing
one line per episode; it exits 1 when any episode is invalid or scores the other way.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from envab.envs.qemu import image
from envab.envs.qemu.pool import QemuConfig, QemuPool
from envab.envs.tasks.build import build
from envab.errors import Refusal, refused


def check(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m envab.envs.qemu check")
    p.add_argument("--cache", type=Path, default=QemuConfig.cache)
    p.add_argument("--memory", type=int, default=QemuConfig.memory_mib)
    p.add_argument("--vms", type=int, default=QemuConfig.vms)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    tasks, solutions = build(seed=args.seed, per_family=1)
    by_id = {s["id"]: s for s in solutions}
    failures = 0
    try:
        pool = QemuPool(
            QemuConfig(vms=args.vms, memory_mib=args.memory, cache=args.cache, build=False)
        )
    except (Refusal, image.BuildError) as e:
        return refused(e, prefix="envab.envs.qemu", code=1)
    with pool:
        print(f"pool: {pool.describe()}")
        for task in tasks:
            sol = by_id[task["id"]]
            for name, actions, expected in (
                ("oracle", sol["oracle"], 1.0),
                (sol["near_misses"][0]["name"], sol["near_misses"][0]["actions"], 0.0),
            ):
                t0 = time.perf_counter()
                with pool.create(task) as session:
                    for action in actions:
                        session.step(action)
                    result = session.verify()
                ok = result.valid and result.score == expected
                failures += not ok
                print(
                    f"{'ok  ' if ok else 'FAIL'} {task['id']:<24} {name:<20} "
                    f"{result.verdict:<16} score={result.score} "
                    f"{time.perf_counter() - t0:.2f}s"
                )
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("build", "check"):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    if argv[0] == "build":
        return image.main(argv[1:])
    return check(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
