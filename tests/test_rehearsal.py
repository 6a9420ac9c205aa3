"""The rehearsal (config/rehearsal.yaml), smaller: the real deployment's shape through Snakemake.

The X desktop's tasks in OSWorld's format, the warm start on their oracles, multi-turn
`computer_13` episodes at 1024x768, QEMU VMs restored from the warm snapshot against gVisor
sandboxes forked from a prepared desktop, held-out evaluation, the outcome and `verify`: every
stage the GPU run takes but CUDA, at one GRPO step a run and no controls (the whole rehearsal,
with its four, is measured in docs/results/).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from envab.io import read_jsonl

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.integration,  # Snakemake, an X desktop on gVisor and on QEMU
    pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc not found (setup installs it)"),
    pytest.mark.skipif(
        shutil.which("qemu-system-x86_64") is None,
        reason="qemu-system-x86_64 not found: the QEMU arm needs it (setup installs it)",
    ),
    pytest.mark.skipif(
        shutil.which("debootstrap") is None,
        reason="debootstrap not found: the X desktop's root is built with it (setup installs it)",
    ),
]


def small_rehearsal(root: Path) -> str:
    """The copy's config.yaml and pre-registration: the rehearsal's, one step of one group per
    run, no controls; returns its experiment id."""
    config = yaml.safe_load((REPO / "config" / "rehearsal.yaml").read_text())
    config["training"]["sft"]["steps"] = 100  # nine in ten first turns parse (docs/results/)
    config["preregistration"] = "preregistration/rehearsal.yaml"
    target_path = root / "preregistration" / "rehearsal.yaml"
    target = yaml.safe_load(target_path.read_text())
    target["experiment_id"] = "rehearsal-small"
    target["budget"]["max_valid_trajectories"] = 2
    target["evaluation"]["checkpoint_interval"] = 2
    target["controls"] = []
    target_path.write_text(yaml.safe_dump(target, sort_keys=False))
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return target["experiment_id"]


def test_the_rehearsal_runs_every_stage_on_real_applications_on_both_sandboxes(workflow):
    exp = small_rehearsal(workflow.root)
    run = workflow.snakemake(timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]

    results = workflow.root / "results" / exp
    played = []
    for arm in ("qemu", "drums"):
        lines = list(read_jsonl(results / arm / "seed1" / "trajectories.jsonl"))
        assert sum(line["verdict"] == "valid" for line in lines) >= 2, arm
        assert {line["task_id"][:3] for line in lines} == {"xd-"}  # the X desktop's tasks
        run_json = json.loads((results / arm / "seed1" / "run.json").read_text())
        assert run_json["preflight"], arm  # the checks before the first step ran on this arm
        played += [line["actions"] for line in lines]
    # the warm-started policy's own calls were played in the real applications
    assert max(played) >= 1, played
    assert (results / "outcome.md").is_file()
    verified = workflow.python("-m", "envab.verify", f"receipts/{exp}")
    assert verified.returncode == 0, verified.stdout[-3000:]
