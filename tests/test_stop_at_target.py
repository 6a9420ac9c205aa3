"""Stop at target (budget.stop_at_target): a run stops once its fate is decided, its clock paused
while its checkpoints are judged, and the workflow's own evaluations reuse the judge's.

The decision from the crossing and the confirmation, the paused clock and the registration's
checks are pinned here directly; then a real Snakemake run on the embedded host, registered so
that the crossing is certain (threshold 0 under first_crossing, no confirmation), must stop at
its first look with half its budget unspent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import SHIPPED_TARGET

from envab.analysis.stop_at_target import GO_ON, STOP, decide
from envab.preregistration import Preregistration
from envab.schema import ConfigError
from envab.trainer.accounting import Ledger, Prices

REACHED = {"reached": True}
NOT_YET = {"reached": False}


@pytest.mark.parametrize(
    ("confirmation", "crossing", "registered", "expected"),
    [
        (None, NOT_YET, True, (GO_ON, None)),
        ({"verdict": "no crossing to confirm"}, NOT_YET, True, (GO_ON, None)),
        ({"verdict": "confirmed"}, REACHED, True, (STOP, "target_confirmed")),
        # an unconfirmed first crossing is never reached, whatever the run does later
        ({"verdict": "not confirmed"}, REACHED, True, (STOP, "crossing_not_confirmed")),
        (None, REACHED, False, (STOP, "target_reached")),
        (None, NOT_YET, False, (GO_ON, None)),
    ],
)
def test_the_run_stops_once_its_fate_is_decided(confirmation, crossing, registered, expected):
    assert decide(confirmation, crossing, registered) == expected


class Clock:
    def __init__(self):
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_a_paused_clock_leaves_the_judging_out_of_the_wall_clock(tmp_path):
    clock = Clock()
    book = Ledger(
        str(tmp_path / "t.jsonl"), str(tmp_path / "c.jsonl"), "drums", 1, 4, Prices(0.1, 0.2)
    )
    book.clock = clock
    book.start()
    clock.now += 10
    with book.paused():
        clock.now += 30  # a judgment
    clock.now += 5
    assert book.wall_clock_s() == pytest.approx(15.0)
    assert book.paused_s == pytest.approx(30.0)
    assert book.counters()["env_host_hours"] == pytest.approx(15.0 / 3600)
    # carried across a restart with the rest of the counters
    state = book.state()
    again = Ledger(
        str(tmp_path / "t.jsonl"), str(tmp_path / "c.jsonl"), "drums", 1, 4, Prices(0.1, 0.2)
    )
    again.restore(state, state["wall_clock_s"])
    assert again.paused_s == pytest.approx(30.0)


def registered(tmp_path, **changes) -> Path:
    target = yaml.safe_load(SHIPPED_TARGET.read_text())
    target.update(changes)
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(target))
    return path


def test_controls_run_on_their_registered_seeds_and_never_stop_at_target(tmp_path):
    prereg = Preregistration.load(registered(tmp_path, seeds=[1, 2, 3], control_seeds=[2]))
    assert prereg.seeds_of_controls() == (2,)
    assert prereg.budget.stop_at_target
    for control in prereg.controls:
        assert not prereg.budget_for(control.run_arm).stop_at_target
    every = yaml.safe_load(SHIPPED_TARGET.read_text())
    every.pop("control_seeds")
    path = tmp_path / "every.yaml"
    path.write_text(yaml.safe_dump(every))
    assert Preregistration.load(path).seeds_of_controls() == tuple(every["seeds"])
    with pytest.raises(ConfigError, match=r"control_seeds: \[9\] not among the seeds"):
        Preregistration.load(registered(tmp_path, seeds=[1, 2], control_seeds=[9]))


def test_the_shipped_default_registers_replicated_seeds_and_stops_at_target():
    prereg = Preregistration.load(SHIPPED_TARGET)
    assert len(prereg.seeds) >= 5 and prereg.budget.stop_at_target
    assert prereg.confirmation is not None  # a stop waits for the confirmation's judgment


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, make_workflow):
    """One arm, one seed, a budget of 8 and a look every 4: the crossing is certain at the
    warm start's look (threshold 0, first_crossing), so the run must stop at 4."""
    workflow = make_workflow(tmp_path_factory.mktemp("stop"))
    workflow.embedded_arms()

    def target(t):
        t["target"].update(threshold=0.0, crossing={"rule": "first_crossing"})
        t["budget"].update(max_wall_clock_s=600, max_valid_trajectories=8, stop_at_target=True)
        t["evaluation"].update(checkpoint_interval=4, seeds=[0])
        t["seeds"] = [1]
        for key in ("controls", "control_seeds", "confirmation", "equivalence"):
            t.pop(key, None)
        t["replay"] = {"sample": 4, "seed": 0}  # the run's attempts replayed on both arms

    workflow.tiny_recipe()
    workflow.edit_target(target)
    result = workflow.snakemake("--cores", "2", "arm=drums", timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    exp = yaml.safe_load((workflow.root / "preregistration/target.yaml").read_text())
    workflow.run = workflow.root / "results" / exp["experiment_id"] / "drums" / "seed1"
    workflow.console = result.stderr
    return workflow


def test_a_run_whose_target_is_reached_stops_at_that_look(stopped):
    record = json.loads((stopped.run / "run.json").read_text())
    assert record["stop_reason"] == "target_reached"
    assert record["valid_trajectories"] == 4  # half the budget of 8 never spent
    [verdict] = record["stop_at_target"]["verdicts"]
    assert (verdict["checkpoint"], verdict["decision"]) == ("valid-000004", STOP)
    names = [json.loads(line)["checkpoint"] for line in (stopped.run / "checkpoints.jsonl").open()]
    assert names == ["valid-000000", "valid-000004"]
    assert "stop at target, valid-000004: stop (target_reached)" in stopped.console


def test_the_judging_is_paused_out_of_the_wall_clock(stopped):
    record = json.loads((stopped.run / "run.json").read_text())
    judged = record["stop_at_target"]["verdicts"][0]["judged_s"]
    assert record["paused_s"] >= judged > 0
    last = [json.loads(line) for line in (stopped.run / "checkpoints.jsonl").open()][-1]
    # the checkpoint's counters were taken before the judgment, the run's after: only the
    # step's own end lies between them, never the judgment
    assert record["wall_clock_s"] - last["wall_clock_s"] < judged


def test_the_workflows_evaluations_are_the_judges(stopped):
    for name in ("valid-000000", "valid-000004"):
        evaluation = json.loads((stopped.run / "eval" / f"{name}.json").read_text())
        assert evaluation["reused"], name  # played once, by the judge, while training paused
        assert evaluation["evaluated_for"].endswith(f"drums/seed1/{name}")
    # the selection's answer (arm=drums), under its own name
    outcome = stopped.run.parent.parent / "selections" / "arm-drums" / "outcome.md"
    outcome = outcome.read_text()
    assert "**Stopping.** Registered" in outcome and "target_reached" in outcome


def test_the_runs_logged_actions_replay_alike_on_both_arms_and_as_recorded(stopped):
    """The registered cross-arm trace replay (rule replay, eval/replay.py) of the run's own
    attempts: each logged the actions it sent, and played again on a fresh environment of each
    A/B arm they end as recorded; the outcome reads the job's verdict."""
    attempts = [json.loads(line) for line in (stopped.run / "trajectories.jsonl").open()]
    assert attempts and all("sent" in a and len(a["sent"]) == a["actions"] for a in attempts)
    replayed = json.loads((stopped.run / "replay.json").read_text())
    assert (replayed["sample"], replayed["seed"]) == (4, 0)  # as registered
    assert replayed["verdict"] == "same" and replayed["attempts"] == 4
    assert set(replayed["arms"]) == {"restore", "drums"} and replayed["arms_agree"] == 4
    outcome_dir = stopped.run.parent.parent / "selections" / "arm-drums"
    outcome = json.loads((outcome_dir / "outcome.json").read_text())
    assert outcome["replay"]["verdict"] == "same"
    assert [row["run"] for row in outcome["replay"]["runs"]] == ["drums/seed1"]
    text = (outcome_dir / "outcome.md").read_text()
    assert "- **drums/seed1**: same (4 of 4 answered alike on restore, drums" in text
    receipt = json.loads(
        (stopped.root / "receipts" / outcome_dir.relative_to(stopped.root / "results")
         / "outcome.json").read_text()
    )  # fmt: skip
    assert receipt["predicate"]["replay"] == {"drums/seed1": "same"}


def test_a_judge_resumed_mid_way_judges_only_what_is_left(stopped, monkeypatch):
    """A judge killed after its first checkpoint's evaluation leaves that record in its folder;
    the judge run again on that folder takes the record as it is and evaluates only the rest,
    from the evaluation store (nothing is played again), to the same verdict."""
    from envab.analysis.stop_at_target import main as judge
    from envab.receipts import FREEZE_RECEIPTS

    results = stopped.run.parent.parent
    [first] = (results / "judged" / "drums" / "seed1").glob("judge-*/eval/valid-000000.json")
    folder = stopped.root / "judged-again"
    (folder / "eval").mkdir(parents=True)
    kept = folder / "eval" / "valid-000000.json"
    kept.write_bytes(first.read_bytes())  # what the killed judge had written
    written = kept.stat().st_mtime_ns
    arms = yaml.safe_load((stopped.root / "config.yaml").read_text())["arms"]
    target = yaml.safe_load((stopped.root / "preregistration/target.yaml").read_text())
    evaluated_on = json.dumps(arms[target["evaluation"]["backend"]])  # as the rule hands it
    run = stopped.run.relative_to(stopped.root)
    monkeypatch.chdir(stopped.root)
    code = judge(
        [*("--target", "preregistration/target.yaml", "--receipts"),
         *(f"receipts/{results.name}/{name}" for name in FREEZE_RECEIPTS),
         *("--pins", f"{run}/pins.json", "--checkpoint-records", f"{run}/checkpoints.jsonl"),
         *("--checkpoints", f"{run}/checkpoints", "--backend", evaluated_on),
         *("--confirm-backend", evaluated_on),
         *("--store", f"{results.relative_to(stopped.root)}/evaluations"),
         *("--judged", str(folder), "--out", str(folder / "verdict.json"), "--cores", "1")]
    )  # fmt: skip
    assert code == 0
    assert kept.stat().st_mtime_ns == written  # taken as the killed judge left it
    rest = json.loads((folder / "eval" / "valid-000004.json").read_text())
    assert rest["reused"]  # from the store: no episode played again
    verdict = json.loads((folder / "verdict.json").read_text())
    assert (verdict["checkpoint"], verdict["decision"], verdict["stop_reason"]) == (
        "valid-000004",
        STOP,
        "target_reached",
    )


def test_the_evaluations_the_judge_plays_keep_their_embedded_hosts_log(stopped):
    """The judge's evaluations run with no job log of their own: their embedded host's log (an
    env_failure's only reason) goes to the judge's folder, as the eval rule's goes beside its."""
    results = stopped.run.parent.parent
    played = list((results / "judged" / "drums" / "seed1").glob("judge-*/host.log"))
    assert played, sorted(p.name for p in (results / "judged" / "drums" / "seed1").rglob("*"))
    assert all(log.stat().st_size > 0 for log in played)
