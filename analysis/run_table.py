"""One run's learning curve as a table: per checkpoint, the counters, the training-task success
of the valid trajectories since the previous checkpoint (sampled, as GRPO saw them) and the
held-out result.

python -m envab.analysis.run_table --pins pins.json --checkpoints checkpoints.jsonl --run run.json
    --evals eval/<checkpoint>.json ... --out curve.csv
"""

from __future__ import annotations

import argparse

import pandas as pd

from envab.analysis.runs import RunRecords

COLUMNS = [
    "checkpoint",
    "valid_trajectories",
    "invalid_discarded",
    "wall_clock_s",
    "env_cost_usd",
    "inference_cost_usd",
    "train_success",
    "train_window_valid",
    "heldout_success_rate",
    "heldout_episodes",
    "heldout_invalid",
    "scored",
]


def run_table(run: RunRecords) -> pd.DataFrame:
    rows = []
    for checkpoint in sorted(run.checkpoints, key=lambda c: c["valid_trajectories"]):
        evaluation = run.evaluations.get(checkpoint["checkpoint"], {})
        rows.append(
            {
                **{k: checkpoint.get(k) for k in COLUMNS[:8]},
                "heldout_success_rate": evaluation.get("success_rate"),
                "heldout_episodes": evaluation.get("episodes"),
                "heldout_invalid": evaluation.get("invalid"),
                "scored": evaluation.get("scored", False),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.analysis.run_table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pins", required=True, help="the run's pins.json")
    parser.add_argument("--checkpoints", required=True, help="the run's checkpoints.jsonl")
    parser.add_argument("--run", required=True, help="the run's run.json")
    parser.add_argument("--evals", nargs="*", default=[], help="its eval/<checkpoint>.json files")
    parser.add_argument("--out", required=True, help="curve.csv")
    args = parser.parse_args(argv)
    run = RunRecords.load(args.pins, args.checkpoints, args.run, args.evals)
    run_table(run).to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
