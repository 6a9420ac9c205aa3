"""Benchmark the environment arms side by side on the Pillow desktop: the QEMU pool, the fork host
in each of its sandboxes (gVisor, a namespace sandbox of bubblewrap and seccomp, plain processes)
and the restore host in OCI containers (runc).

    python bench/envs_bench.py [--arms qemu gvisor namespaces process runc] [--seconds 20]
                               [--group 8] [--out FILE.json] [--host-logs DIR]

Prints, per arm, in one run (compare ratios within a run: timings on a shared 2-core machine
move about 20 % between runs):
- latency (median, p95, at the client: the HTTP round trip or the QMP calls included) of create
  (a task's environment with its set-up done and first screenshot taken), fork per child (fork
  arms: one fork of `group` children divided by `group`), step (an action and the screenshot
  after it) and observe (a screenshot, no action);
- memory per environment: the proportional set size (PSS: shared pages split among sharers) of
  every process the arm runs (host, sandboxes or VMs, and their helpers), with `group`
  environments open, divided by `group`;
- valid rollouts per host-hour with the oracle policy (the task factory's solutions) at 1, 2, 4
  and 8 parallel groups: each group is one task's `group` environments, made by a fork of one
  parent where the arm can fork and by `group` creates where it cannot (QEMU restores a warm
  snapshot per environment). One rollout: the oracle's actions, verify, close. A host-hour is an
  hour of wall time with the arm held. The policy takes no time, so this is the environment's
  ceiling, not a training rate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from envab.envs.arms import open_arm
from envab.envs.memory import tree_pss_bytes
from envab.envs.tasks.build import build

REPO = Path(__file__).resolve().parent.parent
ARMS = {
    # A group of 8 restores 8 VMs (it cannot fork); the pool keeps 8 warm.
    "qemu": {"backend": "qemu", "vms": 8, "max_vms": 16, "cache": str(REPO / "build" / "qemu")},
    "gvisor": {"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "gvisor"},
    "namespaces": {
        "backend": "drums",
        "url": "embedded",
        "mode": "fork",
        "sandbox": "namespaces",
    },
    "process": {"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "process"},
    # An OCI container cannot fork here (no CRIU): a group is 8 fresh containers.
    "runc": {"backend": "drums", "url": "embedded", "mode": "restore", "sandbox": "runc"},
}
PARALLEL = (1, 2, 4, 8)


def summary(xs: list[float]) -> tuple[float, float]:
    """(median, p95) in milliseconds."""
    ms = [x * 1000 for x in xs]
    p95 = statistics.quantiles(ms, n=20, method="inclusive")[18] if len(ms) > 1 else ms[0]
    return statistics.median(ms), p95


def group_of(backend, task, group: int) -> list:
    """One task's `group` environments: a parent forked into `group` children, or creates."""
    if backend.can_fork:
        parent = backend.create(task)
        children = parent.fork(group)
        parent.close()
        return children
    return [backend.create(task) for _ in range(group)]


def measure_latency(backend, tasks, oracle, rounds: int, group: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"create": [], "fork_per_child": [], "step": [], "observe": []}
    for i in range(rounds):
        task = tasks[i % len(tasks)]
        t0 = time.perf_counter()
        session = backend.create(task)
        out["create"].append(time.perf_counter() - t0)
        # A QEMU session's create in its parts: the snapshot's restore, then the guest's set-up.
        timings = getattr(session, "timings", {})
        for part in ("loadvm", "setup"):
            if f"{part}_s" in timings:
                out.setdefault(f"create: {part}", []).append(timings[f"{part}_s"])
        sessions = [session]
        if backend.can_fork:
            t0 = time.perf_counter()
            sessions += session.fork(group)
            out["fork_per_child"].append((time.perf_counter() - t0) / group)
        for s in sessions[:2]:
            for action in oracle[task["id"]]:
                t0 = time.perf_counter()
                s.step(action)
                out["step"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            s.observe()
            out["observe"].append(time.perf_counter() - t0)
            assert s.verify().valid
        for s in sessions:
            s.close()
    return {k: v for k, v in out.items() if v}


def memory_per_env(backend, task, group: int) -> float:
    """MiB of the whole process tree with one group open, per environment."""
    sessions = group_of(backend, task, group)
    try:
        return tree_pss_bytes(os.getpid()) / group / 2**20
    finally:
        for s in sessions:
            s.close()


def timed_cell(parallel: int, seconds: float, rollouts) -> dict:
    """`parallel` workers for `seconds`, worker k calling `rollouts(i)` for i = k, k + parallel,
    ...; each call yields (valid, scored 1, why invalid) per rollout. A worker that fails stops
    the cell: its error is raised, never counted as zero rollouts."""
    counts = {"valid": 0, "invalid": 0, "success": 0}
    reasons: Counter[str] = Counter()  # an invalid attempt's verdict and failed gates
    lock = threading.Lock()
    errors: list[BaseException] = []
    deadline = time.monotonic() + seconds

    def worker(k: int) -> None:
        i = k
        try:
            while time.monotonic() < deadline and not errors:
                for valid, success, reason in rollouts(i):
                    with lock:
                        counts["valid" if valid else "invalid"] += 1
                        counts["success"] += valid and success
                        if not valid:
                            reasons[reason] += 1
                i += parallel
        except BaseException as e:  # raised by the caller
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    elapsed = time.perf_counter() - t0
    return {
        **counts,
        "invalid_reasons": dict(reasons),
        "seconds": elapsed,
        "per_host_hour": counts["valid"] / elapsed * 3600,
    }


def rollouts(backend, tasks, oracle, parallel: int, seconds: float, group: int) -> dict:
    """`parallel` groups at once for `seconds`, each one task's oracle in `group` sessions."""

    def group_rollouts(i: int):
        task = tasks[i % len(tasks)]
        sessions = group_of(backend, task, group)
        try:
            for session in sessions:
                for action in oracle[task["id"]]:
                    session.step(action)
                v = session.verify()
                yield v.valid, v.score == 1.0, " ".join([v.verdict, *v.failed_gates])
        finally:
            for session in sessions:
                session.close()

    return timed_cell(parallel, seconds, group_rollouts)


def bench_arm(name: str, args, tasks, oracle) -> dict:
    arm = dict(ARMS[name])
    result: dict = {"arm": arm}
    t0 = time.perf_counter()
    log = str(args.host_logs / f"{name}.log") if args.host_logs else None
    with open_arm(arm, log_path=log) as backend:
        backend.create(tasks[0]).close()  # warm: a guest booted, a template checkpointed
        result["warm_up_s"] = time.perf_counter() - t0
        lat = measure_latency(backend, tasks, oracle, args.rounds, args.group)
        result["latency"] = {op: summary(xs) for op, xs in lat.items()}
        result["memory_mib_per_env"] = memory_per_env(backend, tasks[0], args.group)
        # The QEMU pool is driven from one thread, as training drives it (its QMP clients are
        # not shared between threads): one group at a time.
        limit = 1 if arm["backend"] == "qemu" else len(tasks)
        result["throughput"] = {
            n: rollouts(backend, tasks, oracle, n, args.seconds, args.group)
            for n in PARALLEL
            if n <= limit
        }
    print(f"{name}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--per-family", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0, help="per throughput cell")
    p.add_argument("--rounds", type=int, default=10, help="latency rounds per arm")
    p.add_argument("--group", type=int, default=8, help="GRPO group size (fork children)")
    p.add_argument("--out", type=Path, help="also write the numbers as JSON")
    p.add_argument(
        "--host-logs",
        type=Path,
        help="an embedded host's output to DIR/<arm>.log (why an attempt failed its gate)",
    )
    args = p.parse_args(argv)
    if args.host_logs:
        args.host_logs.mkdir(parents=True, exist_ok=True)

    tasks, solutions = build(seed=args.seed, per_family=args.per_family)
    oracle = {s["id"]: s["oracle"] for s in solutions}
    results = {
        "args": vars(args) | {"out": None, "host_logs": None},
        "arms": {name: bench_arm(name, args, tasks, oracle) for name in args.arms},
    }
    print(render(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


def render(results: dict) -> str:
    arms = results["arms"]
    ops = ("create", "fork_per_child", "step", "observe")
    lines = [
        "| arm | " + " | ".join(f"{op} ms (median / p95)" for op in ops) + " | MiB per env |",
        "|---|" + "---:|" * (len(ops) + 1),
    ]
    for name, r in arms.items():
        cells = [
            f"{r['latency'][op][0]:.1f} / {r['latency'][op][1]:.1f}" if op in r["latency"] else "-"
            for op in ops
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['memory_mib_per_env']:.0f} |")
    for name, r in arms.items():
        parts = [(op, ms) for op, ms in r["latency"].items() if op.startswith("create: ")]
        if parts:
            said = ", ".join(
                f"{op.removeprefix('create: ')} {median:.1f} / {p95:.1f}"
                for op, (median, p95) in parts
            )
            lines.append(f"\n{name}'s create in its parts, ms (median / p95): {said}")
    group = results["args"]["group"]
    lines += [
        "",
        "| arm | "
        + " | ".join(f"{n} group{'s' if n > 1 else ''} of {group}" for n in PARALLEL)
        + " |",
        "|---|" + "---:|" * len(PARALLEL),
    ]
    valid = invalid = success = 0
    reasons: Counter[str] = Counter()
    for name, r in arms.items():
        row = []
        for n in PARALLEL:
            cell = r["throughput"].get(n, r["throughput"].get(str(n)))
            row.append("-" if cell is None else f"{cell['per_host_hour']:,.0f}")
            if cell:
                valid, invalid = valid + cell["valid"], invalid + cell["invalid"]
                success += cell["success"]
                why = cell.get("invalid_reasons", {})  # absent from runs written before it
                reasons.update({f"{name}: {k}": v for k, v in why.items()})
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += [
        "",
        f"valid rollouts per host-hour, oracle policy; {valid} valid ({success} scored 1), "
        f"{invalid} invalid; '-': not measured (the QEMU pool is driven from one thread)",
        *(f"invalid, {why}: {n}" for why, n in sorted(reasons.items())),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
