"""Benchmark the embedded host through the Drums client: restore vs fork.

    python bench/envs_bench.py [--per-family 2] [--seconds 8] [--group 8] [--out FILE.json]

Prints two markdown tables:
- latency (median, p95) of create/restore, fork per child and step, measured at the client
  (HTTP round trip included) and at the host (the host's own timings);
- valid rollouts per host-hour with the oracle policy (from the task factory's solutions) at 1,
  2 and 4 parallel environments. One rollout is one environment: set-up, the oracle's actions,
  verify, close. Restore mode creates every environment of a GRPO group from the snapshot; fork
  mode creates one parent per group and forks it into the group's children. A host-hour is an
  hour of wall time with the host held. The policy takes no time here, so this is the
  environment's ceiling, not a training rate.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from envab.envs.drums import DrumsBackend
from envab.envs.host import serve_embedded
from envab.envs.tasks.build import build

MODES = ("restore", "fork")
PARALLEL = (1, 2, 4)


def summary(xs: list[float]) -> tuple[float, float]:
    """(median, p95) in milliseconds."""
    ms = [x * 1000 for x in xs]
    p95 = statistics.quantiles(ms, n=20, method="inclusive")[18] if len(ms) > 1 else ms[0]
    return statistics.median(ms), p95


def measure_latency(
    backend: DrumsBackend, mode: str, tasks, oracle, rounds: int, group: int
) -> dict[str, dict[str, list[float]]]:
    out = {k: {"client": [], "host": []} for k in ("create", "fork_per_child", "step")}
    for i in range(rounds):
        task = tasks[i % len(tasks)]
        t0 = time.perf_counter()
        session = backend.create(task)
        out["create"]["client"].append(time.perf_counter() - t0)
        out["create"]["host"].append(session.timings["create_s"])
        sessions = [session]
        if mode == "fork":
            t0 = time.perf_counter()
            children = session.fork(group)
            out["fork_per_child"]["client"].append((time.perf_counter() - t0) / group)
            out["fork_per_child"]["host"].append(children[0].timings["per_child_s"])
            sessions += children
        for s in sessions[:2]:
            for action in oracle[task["id"]]:
                t0 = time.perf_counter()
                s.step(action)
                out["step"]["client"].append(time.perf_counter() - t0)
                out["step"]["host"].append(s.timings["step_s"])
            assert s.verify().valid
        for s in sessions:
            s.close()
    return out


def rollouts(
    backend: DrumsBackend, mode: str, tasks, oracle, parallel: int, seconds: float, group: int
) -> dict:
    """Run `parallel` environments at once for `seconds`; count valid verified rollouts."""
    counts = {"valid": 0, "invalid": 0, "success": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def one(session) -> None:
        for action in oracle[session.task_id]:
            session.step(action)
        v = session.verify()
        session.close()
        with lock:
            counts["valid" if v.valid else "invalid"] += 1
            counts["success"] += v.score == 1.0

    def worker(k: int) -> None:
        i = k
        while time.monotonic() < deadline:
            task = tasks[i % len(tasks)]
            i += parallel
            if mode == "fork":
                parent = backend.create(task)
                children = parent.fork(group)
                parent.close()
                for child in children:
                    one(child)
            else:
                for _ in range(group):
                    one(backend.create(task))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return {**counts, "seconds": elapsed, "per_host_hour": counts["valid"] / elapsed * 3600}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--per-family", type=int, default=2)
    p.add_argument("--seconds", type=float, default=8.0, help="per throughput cell")
    p.add_argument("--rounds", type=int, default=30, help="latency rounds per mode")
    p.add_argument("--group", type=int, default=8, help="GRPO group size (fork children)")
    p.add_argument("--out", type=Path, help="also write the numbers as JSON")
    args = p.parse_args(argv)

    tasks, solutions = build(seed=args.seed, per_family=args.per_family)
    oracle = {s["id"]: s["oracle"] for s in solutions}
    results: dict = {"latency": {}, "throughput": {}, "args": vars(args) | {"out": None}}
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "token"
        token_file.write_text(secrets.token_hex(16))
        for mode in MODES:
            with (
                serve_embedded(mode, token_file) as url,
                DrumsBackend(url, token_file=token_file) as backend,
            ):
                lat = measure_latency(backend, mode, tasks, oracle, args.rounds, args.group)
                results["latency"][mode] = {
                    op: {side: summary(xs) for side, xs in sides.items() if xs}
                    for op, sides in lat.items()
                }
                results["throughput"][mode] = {
                    n: rollouts(backend, mode, tasks, oracle, n, args.seconds, args.group)
                    for n in PARALLEL
                }
    print(render(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


def render(results: dict) -> str:
    lines = [
        "| mode | operation | client median ms | client p95 ms | host median ms | host p95 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for mode, ops in results["latency"].items():
        for op, sides in ops.items():
            if not sides:
                continue
            c, h = sides["client"], sides["host"]
            lines.append(f"| {mode} | {op} | {c[0]:.1f} | {c[1]:.1f} | {h[0]:.1f} | {h[1]:.1f} |")
    lines += [
        "",
        "| mode | " + " | ".join(f"{n} env{'s' if n > 1 else ''}" for n in PARALLEL) + " |",
        "|---|" + "---:|" * len(PARALLEL),
    ]
    for mode, cells in results["throughput"].items():
        row = [f"{cells[n]['per_host_hour']:,.0f}" for n in PARALLEL]
        lines.append(f"| {mode} | " + " | ".join(row) + " |")
    invalid = sum(c["invalid"] for cells in results["throughput"].values() for c in cells.values())
    valid = sum(c["valid"] for cells in results["throughput"].values() for c in cells.values())
    success = sum(c["success"] for cells in results["throughput"].values() for c in cells.values())
    lines += [
        "",
        f"valid rollouts per host-hour, oracle policy; {valid} valid "
        f"({success} scored 1), {invalid} invalid",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
