"""The pipeline's performance in one run: where a GRPO step's time goes on each arm of the embedded
default, which functions the trainer spends it in, and how fast `verify` hashes against sha256sum.

    python bench/perf.py --out DIR [--valid 160] [--arms qemu drums] [--profile]
                         [--creates 1 8] [--cpus none 0:1] [--vms 2 4 8] [--steps 1 all]
                         [--no-verify]

A copy of the workflow in DIR/workflow-<variant> with the embedded default's arms, model, warm
start and GRPO settings, and a budget of --valid valid trajectories (16 per step), trains each
arm in turn, nothing else running (`snakemake --cores all results/perf/<arm>/seed1/run.json`).
Variants, one copy each, one after another: each value of --creates
(`training.grpo.parallel_creates`: how many of a group's sessions an arm that cannot fork creates
at once) with each value of --cpus (`training.cpus`: `none`, or `T:E`, the trainer's CPUs and the
environments' as comma-separated lists, e.g. `0:1`) with each value of --vms (the VMs the QEMU arm's
pool starts with, `arms.qemu.vms`; the default keeps config.yaml's. Its ceiling `max_vms` stays
at least the generation batch, 16: TRL holds a step's every session open at once, so a smaller
pool cannot run a step. The fork host has no pool to size: each environment is a sandbox of its
own, restored or forked on demand) with each value of --steps (`training.grpo.parallel_steps`:
how many of a turn's tool calls run at once across the generation batch, `all` for the batch, 1
for TRL's loop, one after another; trainer/toolcalls.py). Each run's
`run.json: step_times` (trainer/step_times.py) splits every step into generation, environment,
log-probs, learning and overhead (TRL's rollout glue, and what happens between steps); the table
gives the steps after the first (which warms up), and the run's valid rollouts per host-hour with
the model playing (`valid_trajectories / env_host_hours`, the whole run: bench/envs_bench.py
gives the oracle's ceiling), and a second table each step's environment and generation seconds
with what the turns' batches did (`run.json: tool_calls`: the calls' own seconds summed against
the batches' wall-clock). `--profile` samples each training process with
py-spy (`pip install -e .[bench]`) and prints where its time goes, by leaf function and by the
project's own functions. Then `python -m envab.verify receipts/perf` is timed against `sha256sum`
on the same files (each run twice, the faster kept, the page cache warm for both; not with
--no-verify). Writes
DIR/perf.json; docs/results/2026-12-02-performance.md is this script's output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml
from soak import WORKFLOW  # the files a workflow copy needs (bench/soak.py)

from envab.layout import Layout

REPO = Path(__file__).resolve().parent.parent
EXP = "perf"
PARTS = ("generation", "environment", "logprobs", "learning", "rollout", "between")
OWN = re.compile(r"\((?:envab|envs|trainer|eval|analysis)/")  # the project's own frames


def workflow_copy(
    root: Path,
    valid: int,
    arms: list[str],
    creates: int,
    cpus: str,
    vms: int | None,
    steps: int | None = None,
) -> None:
    for name in WORKFLOW:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / name)
    config_path, target_path = root / "config.yaml", root / "preregistration" / "target.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["arms"] = {arm: config["arms"][arm] for arm in arms}
    config["training"]["grpo"]["parallel_creates"] = creates
    config["training"]["grpo"]["parallel_steps"] = steps
    if cpus != "none":
        trainer, _, environments = cpus.partition(":")
        config["training"]["cpus"] = {
            "trainer": [int(c) for c in trainer.split(",")],
            "environments": [int(c) for c in environments.split(",")],
        }
    for spec in config["arms"].values():
        if spec["backend"] == "qemu":
            spec["cache"] = str(REPO / "build" / "qemu")  # the checkout's guest, built once
            if vms is not None:  # the VMs started with the pool; it grows to its ceiling
                spec["vms"] = vms
                spec["max_vms"] = max(spec.get("max_vms") or vms, vms)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    target = yaml.safe_load(target_path.read_text())
    target["experiment_id"] = EXP
    target["arms"] = arms
    target["prices"]["host_usd_per_hour"] = {arm: 0.10 for arm in arms}
    target["budget"].update(max_wall_clock_s=3600, max_valid_trajectories=valid)
    target["evaluation"]["checkpoint_interval"] = valid
    for key in ("controls", "confirmation"):
        target.pop(key, None)
    target_path.write_text(yaml.safe_dump(target, sort_keys=False))


def train(root: Path, arm: str, profile: Path | None) -> float:
    """Train one arm; with `profile`, py-spy samples its training process into that file."""
    target = (Layout(EXP).run(arm, 1) / "run.json").as_posix()
    started = time.monotonic()
    job = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "all", target],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    spy = None
    while profile is not None and spy is None and job.poll() is None:
        pid = training_pid(arm)
        if pid is None:
            time.sleep(0.5)
            continue
        spy = subprocess.Popen(
            ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "50",
             "--output", str(profile), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    out, _ = job.communicate()
    if spy is not None:
        spy.wait(timeout=120)
    if job.returncode != 0:
        raise SystemExit(f"training {arm} failed:\n{out[-4000:]}")
    return time.monotonic() - started


def training_pid(arm: str) -> int | None:
    found = subprocess.run(
        ["pgrep", "-f", f"envab.trainer.grpo .*/{arm}/seed1/"], capture_output=True, text=True
    )
    pids = [int(p) for p in found.stdout.split()]
    return min(pids) if pids else None


def step_table(run: dict) -> dict:
    steps = run["step_times"]
    # the per-step lines are not kept in run.json; the totals after the first step are
    after = steps["after_first_s"]
    n = steps["steps"] - 1
    step_s = after["step_s"]
    return {
        "steps": n,
        "step_s": step_s / n if n else None,
        "share": {part: after[part] / step_s for part in PARTS} if step_s else {},
        "overhead": (after["rollout"] + after["between"]) / step_s if step_s else None,
        "first_step_s": steps["first_step_s"]["step_s"],
        # seconds per step, for the arms' environment against their generation
        "per_step_s": {part: after[part] / n for part in PARTS} if n else {},
    }


def profile_summary(raw: Path, top: int = 12) -> dict:
    """py-spy's raw stacks (`frame;frame;... count`) of the training loop's samples (start-up,
    imports and the arm's start left out; py-spy skips a thread while it waits, so this is where
    the CPU goes): the leaf functions with the most samples, and the project's code by the
    innermost project frame of each sample (the timing wrappers of step_times.py left out)."""
    leaves, own, total = Counter(), Counter(), 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or not any(f.startswith("_inner_training_loop ") for f in frames):
            continue
        n = int(count)
        total += n
        leaves[frames[-1]] += n
        ours = [f for f in frames if OWN.search(f) and "step_times.py" not in f]
        own[ours[-1] if ours else "(none)"] += n
    share = lambda c: [(f, round(n / total, 4)) for f, n in c.most_common(top)]  # noqa: E731
    return {"samples": total, "leaf": share(leaves), "innermost_own": share(own)}


def best_of_two(argv: list[str], cwd: Path) -> float:
    times = []
    for _ in range(2):
        t0 = time.monotonic()
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
        times.append(time.monotonic() - t0)
    return min(times)


def verify_against_sha256sum(root: Path, scratch: Path, gib: float) -> dict:
    """`python -m envab.verify receipts/perf` against `sha256sum` on the files it checks, whole
    processes; then the hashing alone (verify's `Digests`, in a fresh interpreter) against
    `sha256sum` on `gib` GiB of checkpoint-sized files, where start-up no longer hides it."""
    command = [sys.executable, "-m", "envab.verify", Layout(EXP).receipts.as_posix()]
    checked = subprocess.run(command, cwd=root, capture_output=True, text=True)
    if checked.returncode != 0:
        raise SystemExit(f"verify failed:\n{checked.stdout[-3000:]}")
    files = sorted(
        {
            line.split()[1]
            for line in checked.stdout.splitlines()
            if line.startswith("ok ") and "(the receipt itself)" not in line
        }
    )
    best_of_two(["sha256sum", *files], root)  # the page cache warm for both
    receipts = {
        "files": len(files),
        "checks": len(checked.stdout.splitlines()) - 1,
        "mib": round(sum((root / f).stat().st_size for f in files) / 2**20, 1),
        "sha256sum_s": round(best_of_two(["sha256sum", *files], root), 3),
        "verify_s": round(best_of_two(command, root), 3),
    }
    receipts["ratio"] = round(receipts["sha256sum_s"] / receipts["verify_s"], 3)

    scratch.mkdir(parents=True, exist_ok=True)
    size = 128 * 2**20
    big = [scratch / f"part-{i}.bin" for i in range(max(1, round(gib * 2**30 / size)))]
    for path in big:
        with open(path, "wb") as f:
            f.write(os.urandom(size))
    names = [p.name for p in big]
    best_of_two(["sha256sum", *names], scratch)
    hashing = {"files": len(big), "mib": len(big) * size // 2**20}
    hashing["sha256sum_s"] = round(best_of_two(["sha256sum", *names], scratch), 3)
    for workers in (1, os.cpu_count() or 1):
        code = (
            "from pathlib import Path; from envab.verify import Digests; "
            f"Digests({workers}).prefetch([Path(n) for n in {names!r}])"
        )
        hashing[f"digests_{workers}_s"] = round(
            best_of_two([sys.executable, "-c", code], scratch), 3
        )
    hashing["workers"] = os.cpu_count() or 1
    for path in big:
        path.unlink()
    return {"receipts": receipts, "hashing": hashing}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--valid", type=int, default=160, help="valid trajectories per arm")
    p.add_argument("--arms", nargs="+", default=["qemu", "drums"])
    p.add_argument("--profile", action="store_true", help="sample each training with py-spy")
    p.add_argument("--hash-gib", type=float, default=1.0, help="GiB hashed against sha256sum")
    p.add_argument("--no-verify", action="store_true", help="the steps only: verify not timed")
    p.add_argument(
        "--creates",
        nargs="+",
        type=int,
        default=[8],
        help="training.grpo.parallel_creates, one workflow copy each, in this order",
    )
    p.add_argument(
        "--cpus",
        nargs="+",
        default=["none"],
        help="training.cpus per copy: none, or TRAINER:ENVIRONMENTS (e.g. 0:1)",
    )
    p.add_argument(
        "--vms", nargs="+", type=int, default=[None], help="the QEMU arm's pool size per copy"
    )
    p.add_argument(
        "--steps",
        nargs="+",
        type=steps_width,
        default=[None],
        help="training.grpo.parallel_steps per copy: a number, or all (the batch)",
    )
    args = p.parse_args(argv)
    if "drums" not in args.arms:  # the warm start plays its demonstrations there
        raise SystemExit("--arms must include drums, the embedded default's evaluation arm")
    if args.profile and shutil.which("py-spy") is None:
        raise SystemExit("--profile needs py-spy: pip install -e .[bench]")
    result = {
        "valid": args.valid,
        "creates": args.creates,
        "cpus": args.cpus,
        "vms": args.vms,
        "steps": args.steps,
        "arms": {},
    }
    variants = [
        (n, cpus, vms, steps)
        for n in args.creates
        for cpus in args.cpus
        for vms in args.vms
        for steps in args.steps
    ]
    roots = []
    for creates, cpus, vms, steps in variants:
        root = args.out / (
            f"workflow-creates{creates}-cpus{cpus.replace(':', '-')}-vms{vms}-steps{steps or 'all'}"
        )
        if root.exists():
            raise SystemExit(f"{root} exists: give a new --out")
        root.mkdir(parents=True)
        workflow_copy(root, args.valid, args.arms, creates, cpus, vms, steps)
        roots.append(root)
        for arm in args.arms:
            label = arm
            if len(args.creates) > 1:
                label += f", parallel_creates {creates}"
            if len(args.cpus) > 1:
                label += f", cpus {cpus}"
            if len(args.vms) > 1:
                if arm != "qemu" and vms != args.vms[0]:
                    continue  # the pool size is the QEMU arm's: the other arms once
                label += f", {vms} VMs" if arm == "qemu" else ""
            if len(args.steps) > 1:
                label += f", parallel_steps {steps or 'all'}"
            first = root == roots[0]
            profile = args.out / f"profile-{arm}.txt" if args.profile and first else None
            wall = train(root, arm, profile)
            run = json.loads((Layout(EXP, root).run(arm, 1) / "run.json").read_text())
            entry = {"job_wall_s": round(wall, 1), "steps": step_table(run)}
            entry["placement"] = run.get("placement")
            entry["tool_calls"] = run.get("tool_calls")  # absent in runs before the setting
            entry["load"] = run.get("load")  # what else the machine was doing meanwhile
            # With the model playing: valid rollouts per hour of the arm held (the whole run)
            entry["valid_per_host_hour"] = round(run["valid_trajectories"] / run["env_host_hours"])
            if profile is not None and profile.exists():
                entry["profile"] = profile_summary(profile)
            result["arms"][label] = entry
            print(f"{label}: trained in {wall:.0f} s (freeze and warm start included on the first)")
    root = roots[0]
    if not args.no_verify:
        result["verify"] = verify_against_sha256sum(root, args.out / "hashing", args.hash_gib)
    (args.out / "perf.json").write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    return 0


def steps_width(value: str) -> int | None:
    """--steps: `all` (None: every call of a turn at once) or a width of at least 1."""
    if value == "all":
        return None
    width = int(value)
    if width < 1:
        raise argparse.ArgumentTypeError("a width is at least 1, or all")
    return width


def report(result: dict) -> str:
    lines = [
        f"GRPO step on the embedded default ({result['valid']} valid trajectories per arm, the "
        "steps after the first; trainer/step_times.py spans in run.json):",
        "",
        "| arm | steps | s per step | generation | environment | log-probs | learning | "
        "TRL rollout glue | between steps | overhead | valid rollouts per host-hour |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, entry in result["arms"].items():
        s = entry["steps"]
        pct = " | ".join(f"{100 * s['share'][p]:.1f} %" for p in PARTS)
        lines.append(
            f"| {arm} | {s['steps']} | {s['step_s']:.2f} | {pct} | {100 * s['overhead']:.1f} % | "
            f"{entry['valid_per_host_hour']} |"
        )
    lines += [
        "",
        "Seconds per step (the same steps), and the turns' tool calls over the whole run "
        "(`run.json: tool_calls`; the calls' own seconds summed against the batches' wall-clock):",
        "",
        "| arm | environment s | generation s | environment / generation | tool-call batches | "
        "calls | widest | calls' seconds | batches' wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, entry in result["arms"].items():
        per = entry["steps"]["per_step_s"]
        calls = entry.get("tool_calls") or {}
        ratio = per["environment"] / per["generation"] if per.get("generation") else float("nan")
        lines.append(
            f"| {arm} | {per['environment']:.2f} | {per['generation']:.2f} | {ratio:.1f} | "
            f"{calls.get('batches', '-')} | {calls.get('calls', '-')} | "
            f"{calls.get('widest', '-')} | {calls.get('busy_s', '-')} | "
            f"{calls.get('wall_s', '-')} |"
        )
    if "verify" in result:  # not with --no-verify
        v, h = result["verify"]["receipts"], result["verify"]["hashing"]
        n = h["workers"]
        lines += [
            "",
            "verify against sha256sum (whole processes, best of two, page cache warm):",
            "",
            "| files | what | sha256sum s | verify s | verify's throughput / sha256sum's |",
            "|---|---|---:|---:|---:|",
            f"| the run's receipts: {v['files']} files, {v['mib']} MiB ({v['checks']} checks) | "
            f"`python -m envab.verify receipts/perf` | {v['sha256sum_s']} | {v['verify_s']} | "
            f"{v['ratio']}x |",
            f"| {h['files']} files of 128 MiB ({h['mib']} MiB) | verify's hashing, 1 thread | "
            f"{h['sha256sum_s']} | {h['digests_1_s']} | "
            f"{h['sha256sum_s'] / h['digests_1_s']:.2f}x |",
            f"| the same | verify's hashing, {n} threads | {h['sha256sum_s']} | "
            f"{h[f'digests_{n}_s']} | {h['sha256sum_s'] / h[f'digests_{n}_s']:.2f}x |",
        ]
    for arm, entry in result["arms"].items():
        if "profile" not in entry:
            continue
        prof = entry["profile"]
        lines += ["", f"{arm}: py-spy, {prof['samples']} samples of the training loop (on CPU)"]
        lines += ["  leaf functions:"] + [f"    {100 * n:5.1f} %  {f}" for f, n in prof["leaf"]]
        lines += ["  the project's innermost frame:"]
        lines += [f"    {100 * n:5.1f} %  {f}" for f, n in prof["innermost_own"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
