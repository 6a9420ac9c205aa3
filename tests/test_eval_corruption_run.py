"""The evaluation corruption control through Snakemake on a tiny budget: the drums arm and its
evaluation corruption (every valid held-out score flipped), trained and evaluated by the
workflow, its checkpoints evaluated once more honestly (eval-honest/), and the controls' table
judging it. Training here is bit-deterministic (CPU), so the honest evaluation of each replayed
checkpoint is its base run's, reused (eval/reuse.py), and the verdict rests on no divergence and
the reported evaluation disagreeing with the honest one for the same task and actions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SHIPPED_EXP as EXP

RESULTS = Path("results") / EXP

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def judged(tmp_path_factory, make_workflow):
    workflow = make_workflow(tmp_path_factory.mktemp("eval-corruption"))

    def target(t):
        t["budget"].update(max_wall_clock_s=600, max_valid_trajectories=4)
        # Greedy, two evaluation seeds: a task's two episodes send the same actions, so the
        # honest evaluations have comparable groups to measure their own disagreement by.
        t["evaluation"].update(checkpoint_interval=4, max_steps=1, seeds=[0, 1], temperature=0.0)
        t.setdefault("equivalence", {"reference_start": 0.5, "margin_fraction": 0.5})
        t.pop("confirmation", None)
        t["controls"] = [
            {"name": "evalflip", "arm": "drums", "expect": "eval_differs", "flip_eval": 1.0}
        ]

    workflow.embedded_arms()
    workflow.tiny_recipe()
    workflow.edit_target(target)
    result = workflow.snakemake(f"{RESULTS}/controls.json", timeout=1500)
    logs = "".join(p.read_text()[-2000:] for p in (workflow.root / "logs").rglob("*.log"))
    assert result.returncode == 0, result.stderr[-3000:] + logs
    workflow.judged = json.loads((workflow.root / RESULTS / "controls.json").read_text())
    return workflow


def test_the_evaluation_corruption_is_caught_in_a_real_run(judged):
    (control,) = judged.judged["controls"]
    assert control["verdict"] == "as expected", control
    assert control["rules"] == "deterministic"
    assert all(s["divergence"]["verdict"] == "never" for s in control["seeds"])
    check = control["evaluation"]
    reported = check["reported"]
    assert reported["comparable_groups"] == reported["pairs"] > 0  # a replay takes one path
    assert reported["disagreeing_groups"] == reported["comparable_groups"]  # every score flipped
    assert check["honest"]["disagreeing_groups"] == 0 and check["excess_p"] <= 0.05
    run = judged.root / RESULTS / "drums-evalflip" / "seed1"
    honest = sorted(p.name for p in (run / "eval-honest").iterdir())
    assert honest == sorted(p.name for p in (run / "eval").iterdir())
    # The honest evaluation of a replayed checkpoint is the base run's, played once.
    for name in honest:
        record = json.loads((run / "eval-honest" / name).read_text())
        base = json.loads((judged.root / RESULTS / "drums" / "seed1" / "eval" / name).read_text())
        assert record["evaluation_key"] == base["evaluation_key"]
        reported_record = json.loads((run / "eval" / name).read_text())
        assert reported_record["evaluation_key"] != base["evaluation_key"]


def test_each_evaluation_that_played_kept_its_hosts_log_beside_its_own(judged):
    # the evaluation workers' embedded host: its reasons for an env_failure are only there
    logs = judged.root / "logs" / EXP
    played = [
        p
        for p in logs.glob("eval_drums-evalflip_*.log")
        if not p.name.endswith(".host.log") and "reused" not in p.read_text()
    ]
    assert played, sorted(p.name for p in logs.iterdir())
    for log in played:
        assert log.with_suffix(".host.log").stat().st_size > 0, log.name
