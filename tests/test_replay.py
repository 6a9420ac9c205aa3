"""Cross-arm trace replay (eval/replay.py): the actions a run logged, played again on every arm,
must end alike there and as recorded. On the embedded Drums host on loopback, a restore arm
and a fork arm; a reward-flipping control as the arm that answers the same actions otherwise."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from envab.analysis import trace_replay
from envab.envs.arms import open_arm
from envab.envs.tasks.build import build
from envab.eval.replay import compare, replay, sample, summary

RESTORE = {"backend": "drums", "url": "embedded", "mode": "restore"}
FORK = {"backend": "drums", "url": "embedded", "mode": "fork"}
FLIPS = {**FORK, "control": {"flip_rewards": 1.0}}


@pytest.fixture(scope="module")
def played():
    tasks, solutions = build(seed=3, per_family=1)
    task = next(t for t in tasks if t["family"] == "click_button")
    oracle = next(s for s in solutions if s["id"] == task["id"])["oracle"]
    miss = [{"action_type": "CLICK", "parameters": {"x": 1, "y": 1}}]  # the corner: no button
    traces = {"oracle": oracle, "miss": miss, "none": []}
    out = {}
    with open_arm(RESTORE) as restore, open_arm(FORK) as fork, open_arm(FLIPS) as flips:
        for name, actions in traces.items():
            out[name] = {
                "actions": actions,
                "replays": {
                    "restore": replay(restore, task, actions),
                    "drums": replay(fork, task, actions),
                    "flips": replay(flips, task, actions),
                },
            }
    return task, out


def record(task, verdict, score, actions):
    return {"task_id": task["id"], "verdict": verdict, "score": score, "sent": actions}


def test_the_same_actions_end_alike_on_both_arms_and_as_recorded(played):
    task, out = played
    oracle = out["oracle"]["replays"]
    assert oracle["restore"]["verdict"] == "valid" and oracle["restore"]["score"] == 1.0
    assert out["miss"]["replays"]["restore"]["score"] == 0.0
    compared = [
        compare(record(task, "valid", 1.0, out["oracle"]["actions"]), _two(out["oracle"])),
        compare(record(task, "valid", 0.0, out["miss"]["actions"]), _two(out["miss"])),
    ]
    assert all(c["arms_agree"] and all(c["as_recorded"].values()) for c in compared)
    # the screens too: one digest per screen, the first and one after each action
    assert oracle["restore"]["screens_sha256"] == oracle["drums"]["screens_sha256"]
    untouched = out["none"]["replays"]["restore"]
    assert oracle["restore"]["screens_sha256"] != untouched["screens_sha256"]
    judged = summary(compared, ["restore", "drums"])
    assert judged["verdict"] == "same" and judged["arms_agree"] == 2


def test_a_record_the_arms_do_not_reproduce_is_a_difference(played):
    task, out = played
    # the run said the oracle scored 0: neither arm's replay agrees with that record
    wrong = compare(record(task, "valid", 0.0, out["oracle"]["actions"]), _two(out["oracle"]))
    assert wrong["arms_agree"] and wrong["as_recorded"] == {"restore": False, "drums": False}
    judged = summary([wrong], ["restore", "drums"])
    assert judged["verdict"] == "differ" and judged["differing"] == [wrong]


def test_an_arm_that_answers_the_same_actions_otherwise_is_found(played):
    task, out = played
    replays = out["oracle"]["replays"]  # restore, drums, and an arm that flips every reward
    compared = compare(record(task, "valid", 1.0, out["oracle"]["actions"]), replays)
    assert not compared["arms_agree"]
    assert compared["as_recorded"] == {"restore": True, "drums": True, "flips": False}
    # its screens are the same: only the reward differs, which is what the replay names
    assert len({r["screens_sha256"] for r in replays.values()}) == 1
    judged = summary([compared], ["restore", "drums", "flips"])
    assert judged["verdict"] == "differ" and judged["per_arm"]["flips"]["as_recorded"] == 0


def test_the_outcome_says_differ_where_one_runs_replay_does(played):
    """The outcome's section (analysis/trace_replay.py) from real replays: a run whose arms
    answered alike reads "same"; a second run with the reward-flipping arm among its arms turns
    the whole section to "differ", named as outranking any speed result."""
    task, out = played
    honest = summary(
        [compare(record(task, "valid", 1.0, out["oracle"]["actions"]), _two(out["oracle"]))],
        ["restore", "drums"],
    )
    flipped = summary(
        [compare(record(task, "valid", 1.0, out["oracle"]["actions"]), out["oracle"]["replays"])],
        ["restore", "drums", "flips"],
    )
    same = SimpleNamespace(arm="drums", seed=1, replay=honest)
    assert trace_replay.section([same])["verdict"] == "same"
    assert trace_replay.section([SimpleNamespace(arm="drums", seed=1, replay=None)]) is None
    section = trace_replay.section([same, SimpleNamespace(arm="qemu", seed=1, replay=flipped)])
    assert section["verdict"] == "differ"
    assert trace_replay.predicate(section) == {"drums/seed1": "same", "qemu/seed1": "differ"}
    text = "\n".join(trace_replay.lines(section))
    assert "- **qemu/seed1**: differ (0 of 1 answered alike" in text
    assert f"{task['id']}: recorded valid 1.0; replayed restore valid 1.0" in text
    assert "flips valid 0.0" in text and "outranks any speed result" in text
    assert "outranks" not in "\n".join(trace_replay.lines(trace_replay.section([same])))


def test_the_sample_is_drawn_from_its_seed_among_attempts_that_logged_actions():
    attempts = [{"task_id": f"t{i}", "sent": []} for i in range(10)] + [{"task_id": "old"}]
    drawn = sample(attempts, 4, seed=1)
    assert drawn == sample(attempts, 4, seed=1) and len(drawn) == 4
    assert all("sent" in a for a in drawn)
    assert len(sample(attempts, 40, seed=1)) == 10  # an older run's line without actions is out


def _two(trace: dict) -> dict:
    return {arm: trace["replays"][arm] for arm in ("restore", "drums")}
