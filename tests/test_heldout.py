"""One held-out episode: the policy's refused calls are its own mistakes, scored, never a crash."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from envab.envs.arms import open_arm
from envab.envs.tasks.build import build
from envab.envs.tasks.local import LocalBackend
from envab.eval.episodes import Protocol, evaluate
from envab.trainer import agent

PROTOCOL = Protocol(
    episodes_per_task=1,
    seeds=(0,),
    max_steps=3,
    max_invalid_retries=0,
    temperature=0.0,
    max_new_tokens=32,
)


class Scripted:
    """A policy that replays tool calls: what the model would have emitted, one per turn."""

    tools = agent.tool_set("computer_13")

    def __init__(self, calls):
        self.calls, self.seen = calls, []

    def act(self, messages, seed):
        self.seen.append(messages[-1])
        name, arguments = self.calls[len(self.seen) - 1]
        call = {"type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}


@pytest.fixture(scope="module")
def task_and_click():
    tasks, solutions = build(1, 1, families=["click_button"], layout="templated", templates=2)
    oracle = solutions[0]["oracle"][0]["parameters"]
    return tasks[0], {"x": oracle["x"], "y": oracle["y"]}


REPO = Path(__file__).resolve().parent.parent
# Every kind of arm can be the evaluation backend: each is opened by the one `open_arm`.
ARMS = {
    "embedded": {"backend": "drums", "url": "embedded", "mode": "fork"},
    "qemu": {
        "backend": "qemu",
        "vms": 1,
        "cache": os.environ.get("ENVAB_QEMU_CACHE", str(REPO / "build/qemu")),
    },
}
NO_QEMU = shutil.which("qemu-system-x86_64") is None


@pytest.mark.parametrize(
    "backend",
    [
        "local",
        "embedded",
        pytest.param(
            "qemu",
            marks=pytest.mark.skipif(
                NO_QEMU,
                reason="qemu-system-x86_64 is not installed (Debian package qemu-system-x86)",
            ),
        ),
    ],
)
def test_refused_calls_are_told_to_the_policy_and_the_episode_goes_on(task_and_click, backend):
    task, click = task_and_click
    policy = Scripted(
        [
            ("click", {"x": 32, "y": 11804}),  # off the screen: the desktop refuses
            ("click", {"x": "left"}),  # not a valid call of the tool
            ("click", click),
        ]
    )
    if backend == "local":
        result = evaluate(policy, LocalBackend(), [task], PROTOCOL)
    else:
        with open_arm(ARMS[backend]) as arm:
            result = evaluate(policy, arm, [task], PROTOCOL)
    (episode,) = result["episode_records"]
    assert (episode["verdict"], episode["score"], episode["turns"]) == ("valid", 1.0, 3)
    assert result["success_rate"] == 1.0 and result["invalid"] == 0
    # what the policy was told after each refused call: a note, no screenshot
    notes = [m["content"] for m in policy.seen[1:]]
    assert [n[0]["type"] for n in notes] == ["text", "text"]
    assert notes[0][0]["text"].startswith("Refused:") and "outside" in notes[0][0]["text"]
    assert "x must be int" in notes[1][0]["text"] or "missing" in notes[1][0]["text"]


def test_a_call_whose_arguments_are_not_an_object_is_refused_not_a_crash(task_and_click):
    """A sampled tool call's JSON may carry any value as its arguments (a policy in training
    sampled `"arguments": 5`, which stopped an evaluation with a TypeError)."""
    task, click = task_and_click
    policy = Scripted([("click", 5), ("click", ["x", "y"]), ("click", click)])
    result = evaluate(policy, LocalBackend(), [task], PROTOCOL)
    (episode,) = result["episode_records"]
    assert (episode["verdict"], episode["score"], episode["turns"]) == ("valid", 1.0, 3)
    notes = [m["content"][0]["text"] for m in policy.seen[1:]]
    assert all("arguments must be an object" in n for n in notes), notes


def test_an_episode_of_refused_calls_scores_0_within_max_steps(task_and_click):
    task, _ = task_and_click
    policy = Scripted([("click", {"x": -1, "y": 5})] * 5)
    result = evaluate(policy, LocalBackend(), [task], PROTOCOL)
    (episode,) = result["episode_records"]
    assert (episode["verdict"], episode["score"], episode["turns"]) == ("valid", 0.0, 3)
    assert result["success_rate"] == 0.0


def test_sampled_episodes_draw_independently_and_reproducibly():
    from envab.eval.episodes import sampler_seed

    seeds = {
        sampler_seed(task, seed, turn) for task in ("a", "b") for seed in (0, 1) for turn in (0, 1)
    }
    assert len(seeds) == 8  # no two (task, episode seed, turn) share a random stream
    assert sampler_seed("a", 0, 1) == sampler_seed("a", 0, 1)
    assert all(0 <= s < 2**63 for s in seeds)  # torch.manual_seed takes it


class Batched(Scripted):
    """A policy whose one reply carries several tool calls (TRL runs them all in training)."""

    def act(self, messages, seed):
        self.seen.append(messages[-1])
        calls = [
            {"type": "function", "function": {"name": n, "arguments": a}} for n, a in self.calls
        ]
        return {"role": "assistant", "content": "", "tool_calls": calls}


def test_every_call_of_a_reply_is_played_up_to_max_steps(task_and_click):
    task, click = task_and_click
    # empty space, the target, done: all three are played; the fourth call comes after done
    # (and past max_steps 3), so it is not, else a second click on the target would score 0
    policy = Batched(
        [("click", {"x": 2, "y": 126}), ("click", click), ("done", {}), ("click", click)]
    )
    result = evaluate(policy, LocalBackend(), [task], PROTOCOL)
    (episode,) = result["episode_records"]
    assert (episode["verdict"], episode["score"], episode["turns"]) == ("valid", 1.0, 3)


def test_the_evaluated_checkpoint_must_be_the_one_training_recorded(tmp_path):
    from envab.eval.heldout import recorded_files
    from envab.hashing import file_manifest
    from envab.io import append_jsonl
    from envab.trainer.guards import GuardError
    from envab.trainer.model import ModelPinError, check_manifest

    checkpoint = tmp_path / "checkpoints" / "valid-000016"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    records = tmp_path / "checkpoints.jsonl"
    append_jsonl(records, {"checkpoint": "valid-000016", "files": file_manifest(checkpoint)})
    expected = recorded_files(str(checkpoint), str(records))
    check_manifest(checkpoint, expected)  # what Policy's load runs first
    (checkpoint / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(
        ModelPinError, match=r"does not match its manifest \(mismatched: model\.safetensors\)"
    ):
        check_manifest(checkpoint, expected)
    with pytest.raises(GuardError, match="not a checkpoint recorded"):
        recorded_files(str(tmp_path / "checkpoints" / "valid-000032"), str(records))


def test_an_evaluation_is_played_once_per_key_and_reused_after(tmp_path):
    from envab.eval.reuse import Store, evaluated_once, evaluation_key

    played = []

    def play():
        played.append(1)
        return {"success_rate": 0.5, "wall_s": 3.0}

    files = {"model.safetensors": "ab" * 32}
    key = evaluation_key(files, {"seeds": [0]}, "click", {"backend": "drums"}, "cd" * 32)
    store = Store(tmp_path / "evaluations")
    first = evaluated_once(store, key, play, "drums/seed1/valid-000000")
    again = evaluated_once(store, key, play, "qemu/seed1/valid-000000")
    assert len(played) == 1 and (first["reused"], again["reused"]) == (False, True)
    assert again["evaluated_for"] == "drums/seed1/valid-000000" and again["wall_s"] == 3.0
    # Anything the result depends on gives another key: other files, protocol, tools, backend,
    # held-out set; and a record filed under another key's name is not taken.
    others = [
        evaluation_key({"model.safetensors": "ef" * 32}, {"seeds": [0]}, "click", {}, "cd" * 32),
        evaluation_key(files, {"seeds": [1]}, "click", {"backend": "drums"}, "cd" * 32),
        evaluation_key(files, {"seeds": [0]}, "computer_13", {"backend": "drums"}, "cd" * 32),
        evaluation_key(files, {"seeds": [0]}, "click", {"backend": "qemu"}, "cd" * 32),
        evaluation_key(files, {"seeds": [0]}, "click", {"backend": "drums"}, "ce" * 32),
    ]
    assert len({key, *others}) == 6
    store.path(key).rename(store.path(others[0]))
    assert evaluated_once(store, others[0], play, "x")["reused"] is False and len(played) == 2
    # Without a store, every call plays.
    evaluated_once(None, key, play, "x")
    assert len(played) == 3
