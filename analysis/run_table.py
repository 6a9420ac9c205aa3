"""One run's learning curve as a table: per checkpoint, the counters, the training-task success
of the valid trajectories since the previous checkpoint (sampled, as GRPO saw them) and the
held-out result. The same curve goes to the run's wandb `eval` run (envab/tracking.py): the first
job that has every evaluation of the run.

python -m envab.analysis.run_table --target target.yaml --pins pins.json
    --checkpoints checkpoints.jsonl --run run.json --evals eval/<checkpoint>.json ...
    --out curve.csv --wandb-dir results/<exp>/wandb
"""

from __future__ import annotations

import argparse

import pandas as pd

from envab.analysis.runs import RunRecords
from envab.hashing import sha256_file
from envab.preregistration import Preregistration
from envab.tracking import start_run

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


def track_heldout(
    run: RunRecords, table: pd.DataFrame, prereg_sha256: str, directory, control_of=None
) -> None:
    """The held-out curve as a wandb run: each scored checkpoint at its valid-trajectory count
    and at its training wall-clock (an unscored one has no rate, so no point)."""
    tracker = start_run(
        "eval",
        run.pins.experiment_id,
        run.arm,
        run.seed,
        prereg_sha256,
        {"training": run.pins.training, "stop_reason": run.final.get("stop_reason")},
        directory=directory,
        control_of=control_of,
    )
    for row in table[table["scored"]].itertuples():
        tracker.log(
            {
                "valid_trajectories": row.valid_trajectories,
                "wall_clock_s": row.wall_clock_s,
                "heldout/success_rate": row.heldout_success_rate,
                "heldout_wall_clock/success_rate": row.heldout_success_rate,
                "heldout/env_cost_usd": row.env_cost_usd,
            }
        )
    tracker.finish()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.analysis.run_table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--target", required=True, help="the pre-registration (its sha256 is logged)"
    )
    parser.add_argument("--pins", required=True, help="the run's pins.json")
    parser.add_argument("--checkpoints", required=True, help="the run's checkpoints.jsonl")
    parser.add_argument("--run", required=True, help="the run's run.json")
    parser.add_argument("--evals", nargs="*", default=[], help="its eval/<checkpoint>.json files")
    parser.add_argument("--out", required=True, help="curve.csv")
    parser.add_argument("--wandb-dir", required=True, help="where the offline wandb run goes")
    args = parser.parse_args(argv)
    run = RunRecords.load(args.pins, args.checkpoints, args.run, args.evals)
    table = run_table(run)
    table.to_csv(args.out, index=False)
    controls = Preregistration.load(args.target).prices.controls  # a control's run -> its arm
    track_heldout(
        run, table, sha256_file(args.target), args.wandb_dir, control_of=controls.get(run.arm)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
