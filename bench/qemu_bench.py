"""Benchmark the QEMU warm-snapshot pool: loadvm, create, step, and rollouts per host-hour.

    python bench/qemu_bench.py [--cache build/qemu] [--memory 256 512] [--restores 20]
                               [--seconds 60] [--vms 1 2] [--sustained 0] [--batch 16]
                               [--out FILE.json]

Prints two markdown tables:
- latency (median, p95) per guest memory size: QMP `loadvm warm` alone; a whole create
  (loadvm, agent hello, task set-up, screendump matching the agent's frame); one step (input
  events, the agent's apply and redraw, screendump);
- valid rollouts per host-hour with the oracle policy at 1 and 2 VMs (the first memory size).
  One rollout: create, the oracle's actions, verify, close. A host-hour is an hour of wall time
  with the pool held. The policy takes no time, so this is the pool's ceiling.
- with `--sustained SECONDS`: create time per minute of a pool used as a GRPO step uses it
  (`--batch` VMs; each round creates the whole batch one after another, plays one oracle action
  in each, verifies and closes them). A create that grows over minutes is a guest that does
  more work after each restore as its VM ages (the guest clock jump: envs/qemu/vm.py).
A guest memory size without a warm snapshot yet is booted and saved first (a minute or two).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from envab.envs.qemu.pool import QemuConfig, QemuPool
from envab.envs.tasks.build import build


def summary(xs: list[float]) -> tuple[float, float]:
    """(median, p95) in milliseconds."""
    ms = [x * 1000 for x in xs]
    p95 = statistics.quantiles(ms, n=20, method="inclusive")[18] if len(ms) > 1 else ms[0]
    return statistics.median(ms), p95


def latency(pool: QemuPool, tasks, oracle, restores: int) -> dict[str, list[float]]:
    vm = pool.slots[0].vm
    out = {"loadvm": [], "create": [], "step": []}
    for _ in range(restores):
        t0 = time.perf_counter()
        vm.loadvm("warm")
        out["loadvm"].append(time.perf_counter() - t0)
    for i in range(restores):
        task = tasks[i % len(tasks)]
        with pool.create(task) as session:
            out["create"].append(session.timings["create_s"])
            for action in oracle[task["id"]]:
                session.step(action)
            out["step"] += session.timings["step_s"]
    return out


def rollouts(pool: QemuPool, tasks, oracle, seconds: float) -> dict:
    counts = {"valid": 0, "invalid": 0, "success": 0}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker(k: int) -> None:
        i = k
        while time.monotonic() < stop:
            task = tasks[i % len(tasks)]
            i += len(pool.slots)
            with pool.create(task) as session:
                for action in oracle[task["id"]]:
                    session.step(action)
                result = session.verify()
            with lock:
                counts["valid" if result.valid else "invalid"] += 1
                counts["success"] += result.score == 1.0

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(pool.slots))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {**counts, "wall_s": wall, "per_host_hour": counts["valid"] * 3600 / wall}


def sustained(pool: QemuPool, tasks, oracle, seconds: float, batch: int) -> dict:
    """Rounds of `batch` sessions open at once, as a GRPO generation batch; creates by minute."""
    by_minute: dict[int, list[float]] = {}
    t0, rounds = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        sessions = [pool.create(tasks[(rounds * batch + i) % len(tasks)]) for i in range(batch)]
        for session in sessions:
            session.step(oracle[session.task["id"]][0])
            session.verify()
            session.close()
            by_minute.setdefault(int((time.monotonic() - t0) // 60), []).append(
                session.timings["create_s"]
            )
        rounds += 1
    return {
        "rounds": rounds,
        "batch": batch,
        "create_by_minute": {m: xs for m, xs in sorted(by_minute.items())},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=Path("build/qemu"))
    p.add_argument("--memory", type=int, nargs="+", default=[256, 512])
    p.add_argument("--vms", type=int, nargs="+", default=[1, 2])
    p.add_argument("--restores", type=int, default=20, help="latency rounds per memory size")
    p.add_argument("--seconds", type=float, default=60.0, help="per throughput cell")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--per-family", type=int, default=2)
    p.add_argument(
        "--sustained", type=float, default=0.0, help="seconds of GRPO-like rounds (0: skip)"
    )
    p.add_argument("--batch", type=int, default=16, help="sessions open at once in --sustained")
    p.add_argument("--out", type=Path, help="also write the numbers as JSON")
    args = p.parse_args(argv)
    tasks, solutions = build(seed=args.seed, per_family=args.per_family)
    oracle = {s["id"]: s["oracle"] for s in solutions}

    results: dict = {"latency": {}, "rollouts": {}}
    for memory in args.memory:
        config = QemuConfig(vms=1, memory_mib=memory, cache=args.cache, step_timeout_s=30.0)
        with QemuPool(config) as pool:
            results["accel"] = pool.guest.accel
            results["guest_image"] = pool.guest.image_digest
            results["latency"][memory] = latency(pool, tasks, oracle, args.restores)
            results["latency"][memory]["load"] = os.getloadavg()[0]
        print(f"latency at {memory} MiB done", file=sys.stderr, flush=True)
    for vms in args.vms:
        config = QemuConfig(
            vms=vms, memory_mib=args.memory[0], cache=args.cache, step_timeout_s=30.0
        )
        with QemuPool(config) as pool:
            results["rollouts"][vms] = rollouts(pool, tasks, oracle, args.seconds)
            results["rollouts"][vms]["load"] = os.getloadavg()[0]
        print(f"rollouts at {vms} VMs done", file=sys.stderr, flush=True)
    if args.sustained > 0:
        config = QemuConfig(
            vms=args.batch, memory_mib=args.memory[0], cache=args.cache, step_timeout_s=30.0
        )
        with QemuPool(config) as pool:
            results["sustained"] = sustained(pool, tasks, oracle, args.sustained, args.batch)
            results["sustained"]["load"] = os.getloadavg()[0]
        print("sustained rounds done", file=sys.stderr, flush=True)
    print(render(results, args.memory[0]))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


def render(results: dict, memory: int) -> str:
    lines = [
        f"QEMU pool ({results['accel']}, guest {results['guest_image'][:12]})",
        "",
        "| memory | loadvm ms (median / p95) | create ms | step ms | load (1 min) |",
        "|---|---|---|---|---|",
    ]
    for mem, lat in results["latency"].items():
        cells = [
            f"{m:.0f} / {q:.0f}" for m, q in (summary(lat[k]) for k in ("loadvm", "create", "step"))
        ]
        lines.append(f"| {mem} MiB | " + " | ".join(cells) + f" | {lat['load']:.1f} |")
    lines += [
        "",
        f"| VMs ({memory} MiB) | valid rollouts | invalid | wall s | "
        "valid rollouts / host-hour | load (1 min) |",
        "|---|---|---|---|---|---|",
    ]
    for vms, r in results["rollouts"].items():
        lines.append(
            f"| {vms} | {r['valid']} | {r['invalid']} | {r['wall_s']:.0f} | "
            f"{r['per_host_hour']:.0f} | {r['load']:.1f} |"
        )
    if "sustained" in results:
        r = results["sustained"]
        lines += [
            "",
            f"Sustained: {r['rounds']} rounds of {r['batch']} sessions open at once",
            "",
            "| minute | creates | create ms (median / p95) |",
            "|---|---|---|",
        ]
        for minute, xs in r["create_by_minute"].items():
            median, p95 = summary(xs)
            lines.append(f"| {minute} | {len(xs)} | {median:.0f} / {p95:.0f} |")
    lines += [
        "",
        f"{os.cpu_count()} host cores; load is the host's 1-minute load average at "
        "the end of each cell (other work on the host slows TCG).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
