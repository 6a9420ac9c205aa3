"""The real deployment and the cluster profiles, dry-run: the workflow parses with
config/qwen3-vl-4b.yaml in place of the embedded default (not merged into it), and the SLURM and
Kubernetes profiles plan every job through their real executor plugins (the test extra installs
them), with no cluster. Each plan must reach training and the GPU settings must reach the jobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REAL = "config/qwen3-vl-4b.yaml"


def dry_run(*args: str) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--cores",
            "4",
            "-p",
            "--configfile",
            REAL,
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def test_the_real_deployment_replaces_the_embedded_default():
    plan = dry_run()
    assert "receipts/qwen3-vl-4b-v3/preregistration.json" in plan
    # real applications on both sandboxes, multi-turn: the X desktop's tasks and oracles
    assert "envs/xdesktop/tasks" in plan and "--solutions-from" in plan
    assert '"max_turns": 5' in plan and '"world": "xdesktop"' in plan
    for run in ("qemu", "drums", "drums-evalcorruption"):
        assert f"train_{run}_seed1" in plan
    assert "embedded-default" not in plan  # nothing of config.yaml's experiment
    assert "rule pin_model" in plan and "config/qwen3-vl-4b.manifest.yaml" in plan
    assert (
        "--source hf://Qwen/Qwen3-VL-4B-Instruct@ebb281ec70b05090aa6165b016eac8ec08e71b17" in plan
    )
    assert '"device": "cuda"' in plan and '"turn_end": "none"' in plan  # the pins' training


@pytest.mark.parametrize(
    "profile, gpu_line",
    [("slurm", "gpu=1"), ("kubernetes", "gpu=1")],
)
def test_a_cluster_profile_plans_every_job(profile, gpu_line):
    plan = dry_run("--profile", f"profiles/{profile}")
    assert f"Using profile profiles/{profile}" in plan
    assert "checkpoint train:" in plan and "rule sft:" in plan
    train = plan[plan.index("checkpoint train:") :].split("\n\n")[0]
    assert gpu_line in train.replace(" ", ""), train
