"""The timing blocks through Snakemake (trainer/timing.py, rules/train.smk): a tiny A/B on the
embedded host, both arms (a restore per rollout against a fork), registered with two blocks
and the speed endpoint as primary. Every window is a real training process measured from
outside; the outcome leads with the blocks' ratio and lists every execution."""

from __future__ import annotations

import json

import pytest
import yaml

from envab.machine_load import outside_threads
from envab.trainer.timing import block_order

COUNTS_WAITS = outside_threads(1) is not None


@pytest.fixture(scope="module")
def timed(tmp_path_factory, make_workflow):
    workflow = make_workflow(tmp_path_factory.mktemp("timing"))
    workflow.embedded_arms()

    def target(t):
        t["budget"].update(max_wall_clock_s=600, max_valid_trajectories=8, stop_at_target=False)
        t["evaluation"].update(checkpoint_interval=4, seeds=[0])
        t["seeds"] = [1]
        t.pop("confirmation", None)
        # one control timed beside the arms: the drums arm's A/A, judged by the blocks
        t["controls"] = [
            # its own budget larger than the window: the window must bound it all the same
            {"name": "aa", "arm": "drums", "expect": "same", "max_valid_trajectories": 8}
        ]
        t["control_seeds"] = [1]
        t["primary_endpoint"] = {
            "endpoint": "seconds_per_valid_trajectory",
            "alpha": 0.05,
            "smallest_effect": 0.8,
        }
        # No bound on outside demand: the tests' other workers share the machine, and beside
        # them demand passes 1 (more threads want a CPU than there are). The rule itself:
        # tests/test_blocks.py.
        t["timing"] = {
            "blocks": 2,
            "order_seed": 5,
            "window_valid_trajectories": 4,
            "max_outside_load": None,
            "max_load_difference": None,
            "max_steal": 1.0,
            "max_reruns": 0,
            "controls": ["drums-aa"],
        }

    workflow.tiny_recipe()
    workflow.edit_target(target)
    result = workflow.snakemake("--cores", "2", timeout=1500)
    assert result.returncode == 0, result.stderr[-4000:]
    exp = yaml.safe_load((workflow.root / "preregistration/target.yaml").read_text())
    workflow.results = workflow.root / "results" / exp["experiment_id"]
    workflow.console = result.stderr
    return workflow


def test_every_block_ran_both_arms_back_to_back_in_the_registered_order(timed):
    executions = [json.loads(line) for line in (timed.results / "timing" / "blocks.jsonl").open()]
    assert [e["block"] for e in executions] == [0, 1]
    arms = ["restore", "drums", "drums-aa"]  # the arms, then the timed control
    assert [tuple(e["order"]) for e in executions] == block_order(arms, 2, 5)
    for e in executions:
        assert e["seed"] == 1
        for arm, w in e["windows"].items():
            assert w["exit"] == 0 and w["valid_trajectories"] >= 4, (arm, w)
            assert 0 < w["wall_clock_s"] <= w["provisioned_s"] < w["process_s"]
            assert w["tree_cpu_s"] > 0 and w["outside_load"] is not None
            # what the load rule judges (v18): what the load beside it wanted, never less than
            # what it obtained; none only where the kernel counts no per-thread waits
            if COUNTS_WAITS:
                assert w["outside_demand"] >= w["outside_load"] - 1e-9, w
            else:
                assert w["outside_demand"] is None, w
        # every window of a block the same amount of work, the timed control's included
        assert len({w["valid_trajectories"] for w in e["windows"].values()}) == 1, e["windows"]
        # bit-deterministic here: both arms of a block did the same work, step for step
        digests = {w["steps_sha256"] for w in e["windows"].values()}
        assert len(digests) == 1
    assert "[timing] block 0 (seed 1" in timed.console


def test_the_outcome_leads_with_the_blocks_and_lists_every_execution(timed):
    outcome = json.loads((timed.results / "outcome.json").read_text())
    (primary,) = outcome["primary"]
    assert primary["endpoint"] == "seconds_per_valid_trajectory:wall_clock_s"
    assert primary["blocks"] == 2 and primary["ratio"] > 0
    assert len(outcome["speed"]["executions"]) == 2
    assert set(outcome["speed"]["env_cpu_s_per_valid"]) == {"restore", "drums", "drums-aa"}
    # the timed A/A judged by the primary endpoint against its base arm, in the same blocks
    (aa,) = outcome["speed"]["controls"]
    assert (aa["runs_as"], aa["judged"]["baseline"], aa["judged"]["blocks"]) == (
        "drums-aa",
        "drums",
        2,
    )
    low, high = aa["judged"]["interval"]
    assert aa["verdict"] == ("as expected" if low <= 1 <= high else "NOT as expected")
    md = (timed.results / "outcome.md").read_text()
    assert "- **Controls by the primary endpoint**" in md
    assert "drums-aa/drums (same: interval covers 1" in md
    assert "seconds per valid trajectory drums/restore in 2 timing blocks" in md
    assert "## Speed: seconds per valid trajectory in timing blocks" in md
    assert md.count("| yes |") == 2
