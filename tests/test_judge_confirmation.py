"""The judge (analysis/stop_at_target.py) on a real run's checkpoints, with a confirmation
registered: a crossing the confirmation confirms stops the run as reached, one it does not
confirm stops it as never reached, and a second judging of the same crossing takes the
confirmation from the evaluation store instead of playing it again.

Certain by construction, whatever the model samples: the held-out tasks are the three-step
family (sequence3, at least four actions) under an evaluation of one action, so the honest
evaluation arm scores every episode 0, and the same arm with every valid score flipped (the
corruption control's `flip_eval`, envs/controls.py) scores every episode 1. The registration:
threshold 0.5 under first_crossing, the confirmation's null at the threshold itself (0.5,
powered at 0.95). The arm that scores 1 crosses at the warm start's look; fresh episodes on it
confirm, fresh episodes on the honest arm cannot.
"""

from __future__ import annotations

import json

import pytest
import yaml

from envab.analysis.stop_at_target import STOP
from envab.analysis.stop_at_target import main as judge_main
from envab.receipts import FREEZE_RECEIPTS

FLIP_EVERY_SCORE = {"flip_rewards": 1.0, "seed": 0}


@pytest.fixture(scope="module")
def run(tmp_path_factory, make_workflow):
    """One honest run (arm drums, seed 1, a budget of 4, a look every 4) that never crosses."""
    workflow = make_workflow(tmp_path_factory.mktemp("confirming"))
    workflow.embedded_arms()
    workflow.tiny_recipe()

    def config(c):
        c["tasks"]["factory"].update(families=["sequence3"], layout="seeded")
        c["training"]["tools"] = "computer_13"  # the set that could solve it with turns enough
        c["training"]["sft"]["cue"] = "shown"  # a seeded task has no cue to shuffle

    workflow.edit_config(config)

    def target(t):
        t["target"].update(threshold=0.5, crossing={"rule": "first_crossing"})
        t["confirmation"] = {"delta": 0.45, "null_at": "threshold"}
        t["budget"].update(max_wall_clock_s=600, max_valid_trajectories=4, stop_at_target=True)
        t["evaluation"].update(checkpoint_interval=4, seeds=[0], max_steps=1)
        t["seeds"] = [1]
        for key in ("controls", "control_seeds", "equivalence"):
            t.pop(key, None)

    workflow.edit_target(target)
    exp = yaml.safe_load((workflow.root / "preregistration/target.yaml").read_text())
    workflow.exp = exp["experiment_id"]
    workflow.pin_tiny_model(workflow.exp)
    result = workflow.snakemake("--cores", "2", "arm=drums", timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    workflow.run = workflow.root / "results" / workflow.exp / "drums" / "seed1"
    return workflow


def judged(run, monkeypatch, folder: str, backend: dict, confirm_backend: dict) -> dict:
    """The judge's verdict on the run's checkpoints so far, judged into `folder`."""
    arms = yaml.safe_load((run.root / "config.yaml").read_text())["arms"]
    evaluation = arms["restore"]  # the registered evaluation arm (embedded_arms)
    monkeypatch.chdir(run.root)
    relative = run.run.relative_to(run.root)
    code = judge_main(
        [*("--target", "preregistration/target.yaml", "--receipts"),
         *(f"receipts/{run.exp}/{name}" for name in FREEZE_RECEIPTS),
         *("--pins", f"{relative}/pins.json", "--checkpoint-records"),
         *(f"{relative}/checkpoints.jsonl", "--checkpoints", f"{relative}/checkpoints"),
         *("--backend", json.dumps({**evaluation, **backend})),
         *("--confirm-backend", json.dumps({**evaluation, **confirm_backend})),
         *("--store", f"results/{run.exp}/evaluations"),
         *("--judged", folder, "--out", f"{folder}/verdict.json", "--cores", "1")]
    )  # fmt: skip
    assert code == 0
    return json.loads((run.root / folder / "verdict.json").read_text())


def confirmation_of(run, folder: str) -> dict:
    return json.loads((run.root / folder / "confirm.json").read_text())


def test_the_honest_run_never_crossed_and_went_to_its_budget(run):
    record = json.loads((run.run / "run.json").read_text())
    assert record["stop_reason"] == "max_valid_trajectories"
    [verdict] = record["stop_at_target"]["verdicts"]  # both looks, judged at the last
    assert (verdict["checkpoint"], verdict["decision"]) == ("valid-000004", "go on")
    for name in ("valid-000000", "valid-000004"):
        evaluation = json.loads((run.run / "eval" / f"{name}.json").read_text())
        assert (evaluation["success_rate"], evaluation["invalid"]) == (0.0, 0), name


def test_a_confirmed_crossing_stops_the_run_as_reached(run, monkeypatch):
    flipped = {"control": FLIP_EVERY_SCORE}
    verdict = judged(run, monkeypatch, "judged-confirmed", flipped, flipped)
    # the first look crosses; the fresh episodes, all scored 1, confirm it
    assert (verdict["checkpoint"], verdict["decision"], verdict["stop_reason"]) == (
        "valid-000004",
        STOP,
        "target_confirmed",
    )
    confirmation = confirmation_of(run, "judged-confirmed")
    assert confirmation["checkpoint"] == "valid-000000"
    assert confirmation["verdict"] == "confirmed" and not confirmation["reused"]
    test = confirmation["test"]
    assert test["successes"] == test["episodes"] >= 8 and test["null_rate"] == 0.5


def test_an_unconfirmed_crossing_stops_the_run_as_never_reached(run, monkeypatch):
    verdict = judged(run, monkeypatch, "judged-unconfirmed", {"control": FLIP_EVERY_SCORE}, {})
    # the same crossing, but its fresh episodes on the honest arm all score 0
    assert (verdict["decision"], verdict["stop_reason"]) == (STOP, "crossing_not_confirmed")
    confirmation = confirmation_of(run, "judged-unconfirmed")
    assert (confirmation["checkpoint"], confirmation["crossing_success_rate"]) == (
        "valid-000000",
        1.0,
    )
    assert confirmation["verdict"] == "not confirmed" and confirmation["evaluation"]["invalid"] == 0
    assert confirmation["test"]["successes"] == 0


def test_a_second_judging_of_a_crossing_reuses_its_confirmation(run, monkeypatch):
    """Judged again in a fresh folder (as the workflow's confirm job or a resumed judge would):
    the evaluations and the confirmation come from the store, nothing is played again, and the
    verdict is the same."""
    flipped = {"control": FLIP_EVERY_SCORE}
    first = judged(run, monkeypatch, "judged-first", flipped, flipped)
    again = judged(run, monkeypatch, "judged-again", flipped, flipped)
    assert again["stop_reason"] == first["stop_reason"] == "target_confirmed"
    confirmation = confirmation_of(run, "judged-again")
    assert confirmation["reused"] and confirmation["evaluated_for"].endswith("seed1/confirm")
    assert confirmation["test"] == confirmation_of(run, "judged-first")["test"]
    for name in ("valid-000000", "valid-000004"):
        evaluation = json.loads((run.root / "judged-again" / "eval" / f"{name}.json").read_text())
        assert evaluation["reused"], name
