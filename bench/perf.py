"""The pipeline's performance in one run: where a GRPO step's time goes on each arm of the embedded
default, which functions the trainer spends it in, and how fast `verify` hashes against sha256sum.

    python bench/perf.py --out DIR [--valid 160] [--arms qemu drums] [--profile]

A copy of the workflow in DIR/workflow with the embedded default's arms, model, warm start and
GRPO settings, and a budget of --valid valid trajectories (16 per step), trains each arm in turn,
nothing else running (`snakemake --cores all results/perf/<arm>/seed1/run.json`). Each run's
`run.json: step_times` (trainer/step_times.py) splits every step into generation, environment,
log-probs, learning and overhead (TRL's rollout glue, and what happens between steps); the table
gives the steps after the first (which warms up). `--profile` samples each training process with
py-spy (`pip install -e .[bench]`) and prints where its time goes, by leaf function and by the
project's own functions. Then `python -m envab.verify receipts/perf` is timed against `sha256sum`
on the same files (each run twice, the faster kept, the page cache warm for both). Writes
DIR/perf.json; the README's performance section is this script's output.
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

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = ["Snakefile", "config.yaml", "environment.yaml", "rules", "schemas", "preregistration",
            "report", "envab", "envs", "trainer", "eval", "analysis"]  # fmt: skip
EXP = "perf"
PARTS = ("generation", "environment", "logprobs", "learning", "rollout", "between")
OWN = re.compile(r"\((?:.*/)?(envab|envs|trainer|eval|analysis)/[^)]*\)")  # the project's frames


def workflow_copy(root: Path, valid: int, arms: list[str]) -> None:
    for name in WORKFLOW:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / name)
    config_path, target_path = root / "config.yaml", root / "preregistration" / "target.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["arms"] = {arm: config["arms"][arm] for arm in arms}
    for spec in config["arms"].values():
        if spec["backend"] == "qemu":
            spec["cache"] = str(REPO / "build" / "qemu")  # the checkout's guest, built once
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
    target = f"results/{EXP}/{arm}/seed1/run.json"
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
    }


def profile_summary(raw: Path, top: int = 12) -> dict:
    """py-spy's raw stacks (`frame;frame;... count`): the leaf functions with the most samples,
    and the project's own functions by the samples under them (inclusive)."""
    leaves, own, total = Counter(), Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        leaves[frames[-1]] += n
        for frame in {f for f in frames if OWN.search(f)}:
            own[frame] += n
    share = lambda c: [(f, round(n / total, 4)) for f, n in c.most_common(top)]  # noqa: E731
    return {"samples": total, "leaf": share(leaves), "own_inclusive": share(own)}


def verify_against_sha256sum(root: Path) -> dict:
    """`python -m envab.verify receipts/perf` against `sha256sum` on the files it checks."""
    command = [sys.executable, "-m", "envab.verify", f"receipts/{EXP}"]
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
    size = sum((root / f).stat().st_size for f in files)

    def best_of_two(argv: list[str]) -> float:
        times = []
        for _ in range(2):
            t0 = time.monotonic()
            subprocess.run(argv, cwd=root, check=True, capture_output=True)
            times.append(time.monotonic() - t0)
        return min(times)

    best_of_two(["sha256sum", *files])  # the page cache warm for both
    sha256sum_s = best_of_two(["sha256sum", *files])
    verify_s = best_of_two(command)
    return {
        "files": len(files),
        "checks": len(checked.stdout.splitlines()) - 1,
        "mib": round(size / 2**20, 1),
        "sha256sum_s": round(sha256sum_s, 3),
        "verify_s": round(verify_s, 3),
        "throughput_vs_sha256sum": round(sha256sum_s / verify_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--valid", type=int, default=160, help="valid trajectories per arm")
    p.add_argument("--arms", nargs="+", default=["qemu", "drums"])
    p.add_argument("--profile", action="store_true", help="sample each training with py-spy")
    args = p.parse_args(argv)
    if args.profile and shutil.which("py-spy") is None:
        raise SystemExit("--profile needs py-spy: pip install -e .[bench]")
    root = args.out / "workflow"
    if root.exists():
        raise SystemExit(f"{root} exists: give a new --out")
    root.mkdir(parents=True)
    workflow_copy(root, args.valid, args.arms)
    result = {"valid": args.valid, "arms": {}}
    for arm in args.arms:
        profile = args.out / f"profile-{arm}.txt" if args.profile else None
        wall = train(root, arm, profile)
        run = json.loads((root / "results" / EXP / arm / "seed1" / "run.json").read_text())
        entry = {"job_wall_s": round(wall, 1), "steps": step_table(run)}
        if profile is not None and profile.exists():
            entry["profile"] = profile_summary(profile)
        result["arms"][arm] = entry
        print(f"{arm}: trained in {wall:.0f} s (freeze and warm start included on the first)")
    result["verify"] = verify_against_sha256sum(root)
    (args.out / "perf.json").write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    return 0


def report(result: dict) -> str:
    lines = [
        f"GRPO step on the embedded default ({result['valid']} valid trajectories per arm, the "
        "steps after the first; trainer/step_times.py spans in run.json):",
        "",
        "| arm | steps | s per step | generation | environment | log-probs | learning | "
        "TRL rollout glue | between steps | overhead |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, entry in result["arms"].items():
        s = entry["steps"]
        pct = " | ".join(f"{100 * s['share'][p]:.1f} %" for p in PARTS)
        lines.append(
            f"| {arm} | {s['steps']} | {s['step_s']:.2f} | {pct} | {100 * s['overhead']:.1f} % |"
        )
    v = result["verify"]
    lines += [
        "",
        f"verify against sha256sum ({v['files']} files, {v['mib']} MiB, {v['checks']} checks; "
        "whole processes, best of two, page cache warm):",
        f"sha256sum {v['sha256sum_s']} s, verify {v['verify_s']} s: "
        f"{v['throughput_vs_sha256sum']}x sha256sum's throughput",
    ]
    for arm, entry in result["arms"].items():
        if "profile" not in entry:
            continue
        prof = entry["profile"]
        lines += ["", f"{arm}: py-spy, {prof['samples']} samples of the training process"]
        lines += ["  leaf functions:"] + [f"    {100 * n:5.1f} %  {f}" for f, n in prof["leaf"]]
        lines += ["  the project's functions (inclusive):"]
        lines += [f"    {100 * n:5.1f} %  {f}" for f, n in prof["own_inclusive"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
