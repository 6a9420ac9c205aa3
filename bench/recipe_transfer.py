"""Does the embedded default's recipe transfer to task sets it was never tuned on?

    python bench/recipe_transfer.py --out transfer --seeds 3 4 5 6 7 [-- learnability args]

For each factory seed, runs bench/learnability.py (the shipped recipe unless arguments after `--`
change it: SFT warm start, then GRPO on the in-process arm) into OUT/seed<k>, then tabulates per
seed the warm start's and GRPO's held-out success with their one-sided 95 % Wilson lower bounds,
and whether that bound reaches the registered threshold (preregistration/target.yaml), the
crossing rule the pipeline applies at a checkpoint: at the first of the looks (`--eval-every`,
the checkpoints a run would evaluate) or, without looks, at the end. A seed whose
OUT/seed<k>/results.json exists is read, not rerun (`--rerun` to redo it).

Seed 1 tuned every recipe so far and seed 2 is embedded-default-v7/v8's task set: a fresh seed is
neither. Evaluation defaults to four episodes per held-out task (128 for 32 tasks), as the
pre-registration plays at a checkpoint; GRPO runs 128 steps of 16, the budget's 2,048 trajectories.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from envab.analysis.crossing import wilson_lower_bound  # noqa: E402


def run_seed(seed: int, out: Path, extra: list[str]) -> dict:
    results = out / "results.json"
    cmd = [sys.executable, str(REPO / "bench" / "learnability.py"), "--out", str(out)]
    cmd += ["--factory-seed", str(seed), "--eval-seeds", "4", "--grpo-steps", "128", *extra]
    out.mkdir(parents=True, exist_ok=True)
    with (out / "log.txt").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    return json.loads(results.read_text())


def bound(rate: float, episodes: int) -> float:
    return wilson_lower_bound(round(rate * episodes), episodes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seeds", type=int, nargs="+", default=[3, 4, 5, 6, 7])
    p.add_argument("--rerun", action="store_true")
    p.add_argument("extra", nargs="*", help="after --: arguments for bench/learnability.py")
    args = p.parse_args()
    target = yaml.safe_load((REPO / "preregistration" / "target.yaml").read_text())
    threshold = target["target"]["threshold"]

    rows = []
    for seed in args.seeds:
        out = args.out / f"seed{seed}"
        if args.rerun or not (out / "results.json").exists():
            print(f"seed {seed}: running (log {out / 'log.txt'})", flush=True)
            run_seed(seed, out, args.extra)
        r = json.loads((out / "results.json").read_text())
        episodes = r["heldout_tasks"] * r["args"]["eval_seeds"]
        row = {"seed": seed, "episodes": episodes, "sft": r["sft"], "sft_train": r["sft_train"]}
        row["sft_lb"] = bound(r["sft"], episodes)
        if "grpo" in r:
            row |= {"grpo": r["grpo"], "grpo_train": r["grpo_train"]}
            row["grpo_lb"] = bound(r["grpo"], episodes)
            a = r["args"]
            looks = r.get("grpo_curve") or [{"step": a["grpo_steps"], "heldout": r["grpo"]}]
            per_step = a["gens"] * a["prompts"]
            row["looks"] = [(look["step"] * per_step, look["heldout"]) for look in looks]
            row["best"] = max(rate for _, rate in row["looks"])
            row["reached_at"] = next(
                (n for n, rate in row["looks"] if bound(rate, episodes) >= threshold), None
            )
        rows.append(row)

    print(f"threshold {threshold} (one-sided 95 % Wilson lower bound of held-out success)")
    print(
        "| factory seed | warm start, training tasks | warm start, held-out (bound)"
        " | held-out at each look | best held-out | reached? |"
    )
    print("|---:|---:|---:|---|---:|---|")
    for row in rows:
        if row["sft_lb"] >= threshold:
            reached = "by the warm start"
        elif "grpo" not in row:
            reached = "GRPO not run"
        elif row["reached_at"] is None:
            reached = "no"
        else:
            reached = f"yes, at {row['reached_at']:,} trajectories"
        looks = ", ".join(f"{rate:.3f}" for _, rate in row.get("looks", []))
        best = f"{row['best']:.3f}" if "grpo" in row else "-"
        print(
            f"| {row['seed']} | {row['sft_train']:.3f} | {row['sft']:.3f} ({row['sft_lb']:.3f}) | "
            f"{looks} | {best} | {reached} |"
        )
    (args.out / "table.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
