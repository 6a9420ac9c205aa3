"""wandb runs for the experiment: offline by default, grouped by experiment id, one per job.

Every run carries the pre-registration's sha256 in its config, is grouped by experiment id, and is
named by arm and seed (plus the checkpoint for an evaluation). Held-out success is plotted against
valid trajectories consumed (`define_metric`), so both arms' curves share an x-axis in wandb.
Runs are written offline into the folder the job is given, results/<exp>/wandb in the workflow
(upload later with `wandb sync`); set
WANDB_MODE=online to stream, WANDB_MODE=disabled to turn it off (the tests do). Nothing secret is
ever put in a run's config: arm configs are passed through `public_arm_config`.
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
    checkpoint: str | None = None,
):
    """A wandb run for one training (`kind="train"`) or evaluation (`kind="eval"`) job."""
    mode = os.environ.get("WANDB_MODE", "offline")
    name = f"{arm}-seed{seed}" + (f"-{checkpoint}" if checkpoint else "")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "env-ab"),
        group=experiment_id,
        job_type=kind,
        name=f"{kind}-{name}",
        mode=mode,
        dir=str(directory),
        config={
            **config,
            "experiment_id": experiment_id,
            "arm": arm,
            "seed": seed,
            "preregistration_sha256": prereg_sha256,
        },
        reinit="finish_previous",
    )
    run.define_metric("valid_trajectories")
    run.define_metric("heldout/*", step_metric="valid_trajectories")
    run.define_metric("train/*", step_metric="valid_trajectories")
    return run
