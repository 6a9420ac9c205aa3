"""wandb runs for the experiment: offline by default, grouped by experiment id, tagged by arm
and seed, so that both arms' curves can be laid over each other.

Two runs per (arm, seed): `train-<arm>-seed<k>` (every GRPO step: TRL's reward, loss and KL, the
valid and invalid counts, the step time, environment and inference seconds) and
`eval-<arm>-seed<k>` (the held-out success of every checkpoint, written once all of them are
evaluated; a run per checkpoint would be one point, which wandb cannot draw as a curve, and an
offline run cannot be appended to by several jobs). `define_metric` fixes the x-axes:

- `train/*` and `heldout/*` against `valid_trajectories`, the budget both arms spend alike;
- `heldout_wall_clock/*` against `wall_clock_s`, the training wall-clock the arms race on.

Every run carries the pre-registration's sha256 in its config. Runs are written offline into the
folder the job is given (results/<exp>/wandb in the workflow); upload with `wandb sync`
(docs/how-to/read-the-answer.md).
Set WANDB_MODE=online to stream, WANDB_MODE=disabled to turn it off (the tests do, except the one
that reads runs back). Nothing secret is put in a run's config: arm configs pass through
`public_arm_config`.
"""

from __future__ import annotations

import os
from pathlib import Path

import wandb

SECRET_KEYS = ("token", "token_file", "password", "api_key")


def public_arm_config(arm_config: dict) -> dict:
    return {k: v for k, v in arm_config.items() if k not in SECRET_KEYS}


def start_run(
    kind: str,
    experiment_id: str,
    arm: str,
    seed: int,
    prereg_sha256: str,
    config: dict,
    directory: str | Path,
    control_of: str | None = None,
):
    """The wandb run of one training (`kind="train"`) or one run's held-out curve (`"eval"`).
    A control's runs (`control_of`: its base arm) go in a group of their own, so that grouping
    the experiment's runs by arm shows the A/B's arms alone."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "env-ab"),
        group=f"{experiment_id}-controls" if control_of else experiment_id,
        job_type=kind,
        name=f"{kind}-{arm}-seed{seed}",
        tags=[f"arm:{arm}", f"seed:{seed}", "control" if control_of else "a/b"],
        mode=os.environ.get("WANDB_MODE", "offline"),
        dir=str(directory),
        config={
            **config,
            "experiment_id": experiment_id,
            "arm": arm,
            "seed": seed,
            "control_of": control_of,
            "preregistration_sha256": prereg_sha256,
        },
        reinit="finish_previous",
    )
    run.define_metric("valid_trajectories")
    run.define_metric("wall_clock_s")
    run.define_metric("train/*", step_metric="valid_trajectories")
    run.define_metric("heldout/*", step_metric="valid_trajectories")
    run.define_metric("heldout_wall_clock/*", step_metric="wall_clock_s")
    return run
