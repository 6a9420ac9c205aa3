"""The timing blocks of the speed endpoint (target.yaml `timing`; analysis/blocks.py): every arm
replays the same training seed for the same window of valid trajectories, back to back, in the
registered order, each window measured with the load beside it.

    python -m envab.trainer.timing --target T --receipts R... --model M --train train.jsonl \
        --pins results/<exp>/qemu/seed1/pins.json ... --dir results/<exp>/timing \
        --out results/<exp>/timing/blocks.jsonl [--cores N] [--log L]

Each window is one training process (`python -m envab.trainer.grpo --timing-window N`, the
trainer the A/B runs use, its pins a copy of the seed's), started from here so that this process
can measure it from outside: its wall-clock, the CPU time of its whole process tree (wait4), and
the machine's over the same window (/proc/stat, /proc/pressure/cpu), and what every thread
outside the run asked of the CPUs (envab/machine_load.py: its time running, and a CPU-bound
thread's waiting to run).
What the machine's other processes wanted over the window is its *outside demand*; what they got
is its *outside load*, kept beside it. The load rule judges demand: the CPU an outside job gets
depends on the arm beside it (an arm that keeps every core busy leaves it less), so two arms
under one steady outside job differ in outside load and not in demand. A block where a window's
outside demand or steal passes the registered rule, or whose arms' outside demands differ by more
than it allows, is run again (up to `max_reruns` times). Every execution of every block is
written to `--out`, kept or not, and the outcome lists them all.

Where training is bit-deterministic (CPU), a window replays exactly the first N valid trajectories
of its seed's A/B run: the same work on both arms. Where it is not, it is the same work in
distribution, and the block still puts both arms under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from envab import preregistration
from envab.errors import Refusal
from envab.hashing import sha256_file
from envab.io import atomic_write_text
from envab.machine_load import cpu_ticks, outside_demand_s, outside_threads
from envab.progress import job_console
from envab.trainer.guards import check_code, check_receipts, held_out

PSI_CPU = Path("/proc/pressure/cpu")
TICKS = os.sysconf("SC_CLK_TCK")


def block_order(arms: Sequence[str], blocks: int, seed: int) -> list[tuple[str, ...]]:
    """The order the arms run in, block by block: each pair of blocks runs an order drawn from
    `seed` and then its reverse (ABBA or BAAB with two arms); an odd last block, a drawn order."""
    rng = random.Random(seed)
    orders: list[tuple[str, ...]] = []
    while len(orders) < blocks:
        first = list(arms)
        rng.shuffle(first)
        orders.append(tuple(first))
        if len(orders) < blocks:
            orders.append(tuple(reversed(first)))
    return orders


def block_seed(seeds: Sequence[int], block: int) -> int:
    """The training seed block `block` (from 0) replays."""
    return seeds[block % len(seeds)]


def judged_load(window: dict) -> tuple[str, float | None]:
    """The load the rule judges a window by: its outside demand; where the kernel keeps no
    per-thread schedstat (or a record from before v18), the outside load it obtained."""
    if window.get("outside_demand") is not None:
        return "outside demand", window["outside_demand"]
    return "outside load", window.get("outside_load")


def inadmissible(window: dict, max_outside_load: float | None, max_steal: float) -> str | None:
    """Why one arm's timed window does not count (None: it does): more CPU time wanted from
    outside the run than `max_outside_load` of the machine's (None: no bound), or more steal
    than `max_steal`, or a run that did not finish its window."""
    if window.get("exit") != 0:
        return f"the run exited {window.get('exit')}"
    if not window.get("valid_trajectories"):
        return "no valid trajectory in the window"
    name, load = judged_load(window)
    if load is not None and max_outside_load is not None and load > max_outside_load:
        return f"{name} {load:.2f} > {max_outside_load:g}"
    if window["steal_fraction"] is not None and window["steal_fraction"] > max_steal:
        return f"steal {window['steal_fraction']:.2f} > {max_steal:g}"
    return None


def unequal_load(windows: dict[str, dict], max_load_difference: float | None) -> str | None:
    """Why a block's arms did not run under the same load (None: they did): their windows'
    outside demands differ by more than `max_load_difference` (None: no bound). Steady load
    beside every arm is a condition the block measures under; load that came and went between the
    arms is not."""
    if max_load_difference is None:
        return None
    judged = {arm: judged_load(w) for arm, w in windows.items()}
    if len({name for name, _ in judged.values()}) > 1:
        # one window measured no demand: every window by the same measure, the load obtained
        judged = {arm: ("outside load", w.get("outside_load")) for arm, w in windows.items()}
    loads = {arm: load for arm, (_, load) in judged.items() if load is not None}
    if len(loads) < 2:
        return None
    spread = max(loads.values()) - min(loads.values())
    if spread > max_load_difference:
        (name,) = {judged[arm][0] for arm in loads}
        said = ", ".join(f"{arm} {load:.2f}" for arm, load in sorted(loads.items()))
        return f"{name} differs by {spread:.2f} > {max_load_difference:g} ({said})"
    return None


def _psi_some_us() -> int | None:
    """Microseconds some task waited for a CPU since boot (PSI), or None without PSI."""
    try:
        first = PSI_CPU.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return int(first.rsplit("total=", 1)[1])


def measured(command: list[str], env: dict, log: Path) -> dict:
    """Run one window's training process and measure it from outside: its wall-clock, its
    process tree's CPU seconds, and what the machine did over the same time."""
    # The run's processes are this one's: outside is everything not below it. (A run process
    # that outlived its window is re-parented away and counts as outside: a leak shows as load.)
    scan0 = time.monotonic()
    threads0 = outside_threads(os.getpid())
    scan0 = (scan0 + time.monotonic()) / 2  # the threads were read, on average, mid-scan
    ticks0, psi0, t0 = cpu_ticks(), _psi_some_us(), time.monotonic()
    with open(log, "a") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    ticks1, psi1 = cpu_ticks(), _psi_some_us()
    scan1 = time.monotonic()
    threads1 = outside_threads(os.getpid())
    scan1 = (scan1 + time.monotonic()) / 2
    tree_cpu = usage.ru_utime + usage.ru_stime
    cores = os.cpu_count() or 1
    record = {
        "exit": process.returncode,
        "process_s": wall,
        "tree_cpu_s": tree_cpu,
        "outside_load": None,
        "outside_demand": None,
        "outside_unseen": None,
        "steal_fraction": None,
        "cpu_pressure_some": (psi1 - psi0) / (wall * 1e6) if None not in (psi0, psi1) else None,
    }
    if ticks0 and ticks1:
        delta = [b - a for a, b in zip(ticks0, ticks1, strict=False)]
        total = sum(delta[:8])
        if total > 0:
            # busy: user nice system irq softirq (idle, iowait and steal are not work done here)
            busy_s = (delta[0] + delta[1] + delta[2] + delta[5] + delta[6]) / TICKS
            record["outside_load"] = max(0.0, busy_s - tree_cpu) / (wall * cores)
            record["steal_fraction"] = delta[7] / total
            if threads0 is not None and threads1 is not None:
                # the threads' seconds are over the time between the scans (a little more than
                # the window: the scans are outside it), the ticks' over the window: as rates
                span = scan1 - scan0
                wanted, ran = outside_demand_s(threads0, threads1, span)
                # what the ticks hold beyond the run and the threads seen (a process that began
                # and ended inside the window, interrupts): counted as run, its wait unknown
                unseen = max(0.0, (busy_s - tree_cpu) / wall - ran / span)
                record["outside_demand"] = (wanted / span + unseen) / cores
                record["outside_unseen"] = unseen / cores  # of it, obtained only (no wait seen)
    return record


def window_record(run_dir: Path, outside: dict) -> dict:
    """One arm's window: the trainer's own clocks from its run.json, with the outside measure."""
    record = dict(outside)
    run_json = run_dir / "run.json"
    if record["exit"] != 0 or not run_json.is_file():
        return {**record, "valid_trajectories": 0}
    run = json.loads(run_json.read_text())
    load = run.get("load") or {}
    own = load.get("own_cpu_s")
    return {
        **record,
        "valid_trajectories": run["valid_trajectories"],
        "invalid_discarded": run["invalid_discarded"],
        # clock 1: the training loop (from its first step); clock 2: the environments'
        # provisioning plus training (the arm opened to the arm closed)
        "wall_clock_s": run["wall_clock_s"],
        "provisioned_s": load.get("wall_s"),
        # the environment's CPU time: the run's process tree less the trainer's own process
        "env_cpu_s": tree_cpu_less(record["tree_cpu_s"], own),
        # where training is bit-deterministic, the same on every arm of a block: the same work
        "steps_sha256": sha256_file(run_dir / "steps.jsonl"),
    }


def tree_cpu_less(tree: float, own: float | None) -> float | None:
    return None if own is None else max(0.0, tree - own)


def window_command(args, pins: Path, run_dir: Path, window: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "envab.trainer.grpo",
        *("--target", args.target, "--receipts", *args.receipts),
        *("--pins", str(pins), "--model", args.model, "--train", args.train),
        *("--trajectories", str(run_dir / "trajectories.jsonl")),
        *("--checkpoint-records", str(run_dir / "checkpoints.jsonl")),
        *("--checkpoints", str(run_dir / "checkpoints")),
        *("--run", str(run_dir / "run.json"), "--steps", str(run_dir / "steps.jsonl")),
        *("--timing-window", str(window), "--cores", str(args.cores)),
        *("--host-log", str(run_dir / "host.log"), "--wandb-dir", str(run_dir / "wandb")),
    ]


def run_blocks(args, console) -> list[dict]:
    prereg, receipts = preregistration.frozen_inputs(args)
    rule = prereg.timing
    if rule is None:
        raise Refusal(f"{args.target}: no timing blocks are registered (target.yaml: timing)")
    # The refusals every window's training would make, made once here, naming the item: a
    # tampered receipt or edited code stops the job before any window runs (and its log says
    # why, where a window's refusal would be in that window's own log).
    check_receipts(receipts, unread=held_out)
    check_code(receipts)
    pins = {
        (p.parent.parent.name, int(p.parent.name.removeprefix("seed"))): p
        for p in map(Path, args.pins)
    }
    # the arms, and the controls timed beside them (an A/A, a handicap: analysis/speed.py)
    orders = block_order(prereg.timed_arms, rule.blocks, rule.order_seed)
    env = {**os.environ, "WANDB_MODE": "disabled"}  # a window is timed, not tracked
    executions = []
    for block, order in enumerate(orders):
        seed = block_seed(prereg.seeds, block)
        for execution in range(rule.max_reruns + 1):
            folder = Path(args.dir) / f"block{block:02d}-{execution}"
            shutil.rmtree(folder, ignore_errors=True)  # a rerun of this job starts the block anew
            windows = {}
            for position, arm in enumerate(order):
                run_dir = folder / arm
                run_dir.mkdir(parents=True)
                shutil.copy2(pins[(arm, seed)], run_dir / "pins.json")
                command = window_command(
                    args, run_dir / "pins.json", run_dir, rule.window_valid_trajectories
                )
                outside = measured(command, env, run_dir / "train.log")
                windows[arm] = {"position": position, **window_record(run_dir, outside)}
            reasons = {
                arm: why
                for arm, w in windows.items()
                if (why := inadmissible(w, rule.max_outside_load, rule.max_steal))
            }
            if not reasons and (why := unequal_load(windows, rule.max_load_difference)):
                reasons["block"] = why
            record = {
                "block": block,
                "execution": execution,
                "seed": seed,
                "order": list(order),
                "windows": windows,
                "admissible": not reasons,
                "inadmissible": reasons,
            }
            executions.append(record)
            console.say(
                f"block {block} (seed {seed}, {' then '.join(order)}), execution {execution}: "
                + ("kept" if not reasons else f"run again: {reasons}")
                + "; "
                + ", ".join(
                    f"{arm} {w['wall_clock_s'] / w['valid_trajectories']:.3f} s/valid"
                    for arm, w in windows.items()
                    if w.get("valid_trajectories")
                )
            )
            # The window's records are measured; its checkpoints and journal are not needed.
            for arm in order:
                shutil.rmtree(folder / arm / "checkpoints", ignore_errors=True)
            if not reasons or any(w["exit"] != 0 for w in windows.values()):
                break
        failed = [arm for arm, w in executions[-1]["windows"].items() if w["exit"] != 0]
        if failed:
            log = folder / failed[0] / "train.log"
            said = (
                log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
            )
            raise Refusal(
                f"block {block}: {failed[0]}'s window failed ({log}"
                + (f": {said[0][-300:]}" if said else "")
                + ")"
            )
    return executions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.trainer.timing", description=__doc__.split("\n")[0]
    )
    preregistration.add_frozen_arguments(parser)
    parser.add_argument("--model", required=True, help="the model every window starts from")
    parser.add_argument("--train", required=True, help="the training split (train.jsonl)")
    parser.add_argument("--pins", nargs="+", required=True, help="each A/B run's pins.json")
    parser.add_argument("--dir", required=True, help="where each window's run folder goes")
    parser.add_argument("--out", required=True, help="writes: every execution of every block")
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--log", help="the job's log; the console gets a line per block")
    args = parser.parse_args(argv)
    console = job_console("timing", args.log, "timing blocks, both arms back to back")
    try:
        executions = run_blocks(args, console)
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        console.say(f"error: {e}")
        return 2
    atomic_write_text(args.out, "".join(json.dumps(e, sort_keys=True) + "\n" for e in executions))
    kept = sum(e["admissible"] for e in executions)
    console.say(f"done: {len(executions)} executions, {kept} kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
