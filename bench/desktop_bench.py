"""Benchmark the embedded desktop and the task factory in-process (no host, no HTTP).

    python bench/desktop_bench.py [--repeat 5]

Prints a markdown table: default task-set build, screenshot render, PNG encode, one action,
state hash, snapshot + restore (medians and p95 over the default set's oracle episodes), and
the in-process validation of the default set.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envab.envs.desktop import Desktop  # noqa: E402
from envab.envs.tasks.build import build  # noqa: E402
from envab.envs.tasks.local import LocalBackend  # noqa: E402
from envab.envs.validate import validate  # noqa: E402


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def row(name: str, samples: list[float], unit: float = 1e-3, label: str = "ms") -> str:
    q = statistics.quantiles(samples, n=20) if len(samples) > 1 else samples * 19
    return (
        f"| {name} | {len(samples)} | {statistics.median(samples) / unit:.3f} {label} "
        f"| {q[18] / unit:.3f} {label} |"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    builds = [timed(lambda: build(1, 12)) for _ in range(args.repeat)]
    tasks, solutions = build(1, 12)
    by_id = {s["id"]: s for s in solutions}
    render, encode, apply, hashing, snap = [], [], [], [], []
    for _ in range(args.repeat):
        for task in tasks:
            d = Desktop()
            d.setup(task["config"])
            for action in by_id[task["id"]]["oracle"]:
                apply.append(timed(lambda a=action, d=d: d.apply(a)))
                t0 = time.perf_counter()
                shot = d.screenshot()
                render.append(time.perf_counter() - t0)
                encode.append(timed(lambda s=shot: s.save(io.BytesIO(), "PNG", compress_level=1)))
                hashing.append(timed(d.state_hash))
                snap.append(timed(lambda d=d: Desktop.restore(d.snapshot())))
    check = timed(lambda: validate(LocalBackend().create, tasks, solutions))
    plays = sum(2 + len(s["near_misses"]) for s in solutions)
    print("| what | n | median | p95 |\n|---|---|---|---|")
    print(row("build default set (96 tasks)", builds))
    print(row("screenshot render (128x128)", render))
    print(row("PNG encode (compress_level=1)", encode))
    print(row("apply one action", apply, 1e-6, "us"))
    print(row("state hash", hashing, 1e-6, "us"))
    print(row("snapshot + restore", snap, 1e-6, "us"))
    print(f"| validate default set in-process ({plays} plays) | 1 | {check:.2f} s | - |")


if __name__ == "__main__":
    main()
