"""The agent format (trainer/agent.py) and the GRPO environment (trainer/environment.py) on real
parts: the task factory, TRL's own prompt preparation, the tiny Qwen3-VL (built in-process, real
forward pass) and the embedded host in both modes, with its fault switches."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import threading
import time
import types
from pathlib import Path

import pytest
from transformers.utils import get_json_schema
from trl.data_utils import prepare_multimodal_messages

from envab.envs.arms import open_arm
from envab.envs.tasks.build import build
from envab.envs.tasks.local import LocalBackend
from envab.hashing import sha256_json
from envab.trainer import agent
from envab.trainer.accounting import Ledger, Prices
from envab.trainer.environment import (
    ENV_FAILED,
    GenerationClock,
    Run,
    environment_class,
)
from envab.trainer.forkgroups import ForkGroups
from envab.trainer.guards import GuardError, HeldoutGuard

REPO = Path(__file__).resolve().parent.parent
COMPUTER_13 = agent.tool_set("computer_13")


@pytest.fixture(scope="module")
def task_set():
    tasks, solutions = build(seed=1, per_family=2)
    return {t["id"]: t for t in tasks}, {s["id"]: s for s in solutions}


# --- the format ----------------------------------------------------------------------------------


def test_every_tool_maps_to_its_action_and_back(task_set):
    _, solutions = task_set
    assert COMPUTER_13.action_for("click", {"x": 3, "y": 4}) == {
        "action_type": "CLICK",
        "parameters": {"x": 3, "y": 4},
    }
    assert COMPUTER_13.action_for("scroll", {"x": 1, "y": 2, "dy": -3})["parameters"]["dx"] == 0
    assert COMPUTER_13.action_for("done", {}) == {"action_type": "DONE", "parameters": {}}
    oracle = [a for s in solutions.values() for a in s["oracle"]]
    assert {a["action_type"] for a in oracle} >= {"CLICK", "TYPING"}
    for action in oracle:
        assert COMPUTER_13.action_for(*agent.call_for(action, COMPUTER_13)) == action


def test_every_x_desktop_oracle_is_a_computer_13_tool_call():
    """The X desktop's oracles save with a chord (ctrl+s) and wait for applications: the warm
    start turns each into the tool call the policy would make, and back."""
    lines = (REPO / "envs" / "xdesktop" / "tasks" / "solutions.jsonl").read_text().splitlines()
    oracle = [a for line in lines for a in json.loads(line)["oracle"]]
    assert {"HOTKEY", "WAIT", "TYPING", "PRESS"} <= {a["action_type"] for a in oracle}
    for action in oracle:
        assert COMPUTER_13.action_for(*agent.call_for(action, COMPUTER_13)) == action


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("drag", {}, "unknown tool"),
        ("click", {"x": 1}, "missing argument(s) y"),
        ("click", {"x": 1, "y": 2, "z": 3}, "unexpected argument(s) z"),
        ("click", {"x": True, "y": 2}, "x must be int"),
        ("type_text", {"text": 5}, "text must be str"),
        ("hotkey", {"keys": "ctrl+s"}, "keys must be list[str]"),
        ("hotkey", {"keys": ["ctrl", 19]}, "keys must be list[str]"),
        ("hotkey", {"keys": []}, "keys must name 1 to 4 keys"),
        ("hotkey", {"keys": ["a", "b", "c", "d", "e"]}, "keys must name 1 to 4 keys"),
        ("wait", {"seconds": 3600}, "seconds must be 1 to 5"),
        ("wait", {"seconds": 0}, "seconds must be 1 to 5"),
        # what a sampled call's JSON may hold in place of an object (a policy sampled `5`)
        ("click", 5, "click: arguments must be an object, got 5"),
        ("click", [1, 2], "arguments must be an object"),
        ("click", {"x": 1, "y": 2, 3: 4}, "arguments must be an object"),
    ],
)
def test_a_bad_call_is_one_clear_error(name, arguments, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        COMPUTER_13.action_for(name, arguments)


def test_the_dataset_row_and_the_reset_turn_become_the_task_prompt_in_trl(task_set):
    """TRL appends what `reset` returns to the row's last user message (GRPOTrainer.
    _generate_and_score_completions), then normalises it (prepare_multimodal_messages): the
    result is the prompt the evaluation and the warm start render, screenshot first."""
    tasks, _ = task_set
    task = next(iter(tasks.values()))
    shot = agent.first_screenshot(task)
    row = agent.dataset_row(task)
    assert "images" not in row and row["task_id"] == task["id"]
    last = row["prompt"][-1]
    prompt = row["prompt"][:-1] + [
        {**last, "content": last["content"] + agent.first_turn(task, shot)}
    ]
    assert prepare_multimodal_messages(prompt) == agent.task_prompt(task, shot)
    blank, text = agent.first_turn(task, None)  # the environment failed before showing one
    assert text == {"type": "text", "text": agent.instruction_text(task)}
    assert blank["image"].size == shot.size and blank["image"].getextrema() == ((0, 0),) * 3


@pytest.mark.parametrize("name", sorted(agent.TOOL_SETS))
def test_environment_tools_present_exactly_the_agent_tools_in_trls_order(name):
    tools = agent.tool_set(name)
    cls = environment_class(tools)
    discovered = sorted(n for n in dir(cls) if callable(getattr(cls, n)) and not n.startswith("_"))
    assert discovered == sorted([*tools.names, "get_reward", "reset"])
    env = cls.__new__(cls)
    for tool in tools.tools:
        assert get_json_schema(getattr(env, tool.__name__)) == get_json_schema(tool)
    # TRL lists an environment's tools by name; the evaluation and the warm start render
    # `tools.tools`, so both must be in that order.
    trl_order = [n for n, _ in inspect.getmembers(cls, inspect.isfunction) if n in tools.names]
    assert list(tools.names) == trl_order
    with pytest.raises(ValueError, match="unknown tool"):
        tools.action_for("type_text" if name == "click" else "nope", {"text": "a"})


def test_an_unknown_tool_set_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown tool set 'mouse'; tool sets: computer_13, click"):
        agent.tool_set("mouse")


# --- the real model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(task_set, tmp_path_factory):
    from envab.trainer import tiny_model
    from envab.trainer.model import load
    from envab.trainer.tiny_spec import TinySpec

    tasks, _ = task_set
    out = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model.build(sorted({t["instruction"] for t in tasks.values()}), out, TinySpec())
    return load(out)


def test_a_demonstration_runs_through_the_model_with_every_screenshot(task_set, tiny):
    import torch

    from envab.trainer.sft import demonstration
    from envab.trainer.warm_start import demonstration_collator

    model, processor = tiny
    tasks, solutions = task_set
    task_id = next(t for t in sorted(tasks) if len(solutions[t]["oracle"]) >= 2)
    messages = demonstration(
        tasks[task_id], solutions[task_id]["oracle"], COMPUTER_13, LocalBackend()
    )
    screens = 1 + len(solutions[task_id]["oracle"])
    assert sum(m["role"] == "tool" for m in messages) == screens - 1
    batch = demonstration_collator(processor, {task_id: messages}, COMPUTER_13).torch_call(
        [{"task_id": task_id}]
    )
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((batch["input_ids"] == image_pad).sum()) == screens * 16  # 16 tokens per screen
    with torch.no_grad():
        out = model(**{k: v for k, v in batch.items() if k != "labels"})
    assert out.logits.shape[:2] == batch["input_ids"].shape
    # The loss is on the assistant turns only: the tool calls, never the instruction or screens.
    learned = processor.tokenizer.decode(batch["input_ids"][batch["labels"] != -100])
    assert learned.count("<tool_call>") == screens  # the oracle's calls and the final done
    assert tasks[task_id]["instruction"] not in learned
    assert int((batch["labels"] == image_pad).sum()) == 0
    # The warm start learns from the very prompt GRPO and the evaluation render: tools included.
    prompt = processor.apply_chat_template(
        agent.task_prompt(tasks[task_id], agent.first_screenshot(tasks[task_id])),
        tools=list(COMPUTER_13.tools),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    prompt = prompt[0] if isinstance(prompt[0], list) else prompt
    assert batch["input_ids"][0][: len(prompt)].tolist() == list(prompt)


def test_a_turn_ends_right_after_its_first_tool_call(task_set, tiny):
    import torch

    model, processor = tiny
    tasks, _ = task_set
    task = tasks[sorted(tasks)[0]]
    prompt = processor.apply_chat_template(
        agent.task_prompt(task, agent.first_screenshot(task)),
        tools=list(COMPUTER_13.tools),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    call = processor.tokenizer.encode(
        '<tool_call>\n{"name": "done", "arguments": {}}\n</tool_call>', add_special_tokens=False
    )
    # the prompt followed by one complete tool call; per-token fields grow with it (text tokens)
    inputs = {
        k: torch.cat(
            [
                v,
                torch.tensor([call])
                if k == "input_ids"
                else torch.full((1, len(call)), int(k == "attention_mask")),
            ],
            1,
        )
        if k in ("input_ids", "attention_mask", "mm_token_type_ids")
        else v
        for k, v in prompt.items()
    }
    eos = processor.tokenizer.eos_token_id

    def next_tokens(**turn):
        tokens = set()
        for seed in range(8):
            torch.manual_seed(seed)
            out = model.generate(
                **inputs,
                max_new_tokens=1,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                **turn,
            )
            tokens.add(int(out[0, -1]))
        return tokens

    assert next_tokens() != {eos}  # the untrained model would run on after the call ...
    assert next_tokens(**agent.turn_generation_kwargs(processor.tokenizer)) == {eos}  # ... not now


# --- the environment on the embedded host --------------------------------------------------------


def make_run(
    tmp_path,
    backend,
    tasks,
    group=2,
    faults=None,
    heldout=frozenset(),
    screens=None,
    prefix=(),
    settle_s=0.0,
    parallel=1,
):
    ledger = Ledger(
        str(tmp_path / "trajectories.jsonl"),
        str(tmp_path / "checkpoints.jsonl"),
        arm="a",
        seed=1,
        checkpoint_interval=2,
        prices=Prices(0.1, 0.2),
    )
    return Run(
        tasks,
        screens or agent.rendered_first_screens(tasks),
        HeldoutGuard(heldout),
        ledger,
        ForkGroups(backend, group, faults, prefix=prefix, settle_s=settle_s, parallel=parallel),
        tools=COMPUTER_13,
        max_turns=6,
        clock=GenerationClock(),
    )


def play(env, task_id: str, actions) -> list[list[dict]]:
    results = []
    for action in actions:
        name, arguments = agent.call_for(action, COMPUTER_13)
        results.append(getattr(env, name)(**arguments))
    results.append(env.done())
    return results


@pytest.mark.parametrize("mode, parallel", [("restore", 1), ("restore", 2), ("fork", 1)])
def test_oracle_through_the_tools_scores_1_and_is_recorded(
    tmp_path, task_set, mode, parallel, monkeypatch
):
    tasks, solutions = task_set
    task_id = sorted(tasks)[0]
    arm = {"backend": "drums", "url": "embedded", "mode": mode}
    monkeypatch.setenv("DRUMS_RECORD", str(tmp_path / "drums-record.jsonl"))
    with open_arm(arm) as backend:
        run = make_run(tmp_path, backend, {task_id: tasks[task_id]}, parallel=parallel)
        cls = environment_class(COMPUTER_13)
        envs = [cls(run), cls(run)]  # one GRPO group of 2
        first = agent.first_screenshot(tasks[task_id])
        for env in envs:  # the first turn: the environment's screenshot, then the instruction
            turn = env.reset(task_id=task_id)
            assert [b["type"] for b in turn] == ["image", "text"]
            assert agent.screenshot_sha256(turn[0]["image"]) == agent.screenshot_sha256(first)
        oracle = solutions[task_id]["oracle"]
        results = play(envs[0], task_id, oracle)
        assert all(r[0]["type"] == "image" for r in results)
        refused = envs[1].click(x=-5, y=3)  # off screen: the desktop refuses, nothing changes
        assert refused[0]["type"] == "text" and refused[0]["text"].startswith("Refused")
        assert [env.get_reward() for env in envs] == [1.0, 0.0]
    lines = [
        json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()
    ]
    assert [line["verdict"] for line in lines] == ["valid", "valid"]
    assert lines[0]["turns"] == len(oracle) + 1 and lines[1]["turns"] == 1
    parents = {line["fork_parent"] for line in lines}
    assert (parents == {None}) if mode == "restore" else (len(parents) == 1 and None not in parents)
    assert run.ledger.valid == 2 and run.ledger.checkpoint_due()
    # The host's audit, per trajectory: trusted (no flag), and the refused action counted.
    assert [(x["trusted"], x["audit_flags"], x["refused"]) for x in lines] == [
        (True, [], 0),
        (True, [], 1),
    ]
    # DRUMS_RECORD: one line per scored trace in drums-verifiers' format.
    record = [json.loads(x) for x in (tmp_path / "drums-record.jsonl").read_text().splitlines()]
    assert [
        (r["env"], r["parent"], r["valid"], r["score"], r["reward"], r["dropped"], r["trusted"])
        for r in record
    ] == [(x["env_id"], x["fork_parent"], True, x["score"], x["reward"], None, True) for x in lines]


def test_each_attempt_records_the_digest_of_the_actions_it_sent(tmp_path, task_set):
    """Same task, same actions: same actions_sha256 (what the reward-consistency check groups
    by); a refused action was sent, so it counts; a call the tools refuse was never sent."""
    tasks, solutions = task_set
    task_id = sorted(tasks)[0]
    run = make_run(tmp_path, LocalBackend(), {task_id: tasks[task_id]}, group=4)
    cls = environment_class(COMPUTER_13)
    envs = [cls(run) for _ in range(4)]
    for env in envs:
        env.reset(task_id=task_id)
    oracle = solutions[task_id]["oracle"]
    play(envs[0], task_id, oracle)
    play(envs[1], task_id, oracle)
    envs[2].click(x=-5, y=3)  # sent, and refused by the desktop
    envs[3].click(x="left", y=3)  # refused by the tools: never reaches the environment
    rewards = [env.get_reward() for env in envs]
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    digests = [line["actions_sha256"] for line in lines]
    sent = [COMPUTER_13.action_for(*agent.call_for(a, COMPUTER_13)) for a in oracle]
    done = COMPUTER_13.action_for("done", {})
    assert digests[0] == digests[1] == sha256_json([*sent, done])
    assert rewards[0] == rewards[1] == 1.0
    assert digests[2] == sha256_json([COMPUTER_13.action_for("click", {"x": -5, "y": 3})])
    assert digests[3] == sha256_json([])
    assert len(set(digests)) == 3


PREFIX_ARMS = {
    "restore": {"backend": "drums", "url": "embedded", "mode": "restore"},
    "fork": {"backend": "drums", "url": "embedded", "mode": "fork"},
    "qemu": {"backend": "qemu", "cache": os.environ.get("ENVAB_QEMU_CACHE", "build/qemu")},
}


@pytest.mark.parametrize("kind", PREFIX_ARMS)
def test_a_prefix_is_played_and_settled_before_every_group(tmp_path, task_set, kind):
    """drums-verifiers' fork_n with a prefix and a settle: the prefix is played on the fork
    parent (on each session where the arm cannot fork), the desktop is let settle, and every
    attempt starts from the screen the prefix reached, as the in-process render says."""
    if kind == "qemu" and shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed (Debian package qemu-system-x86)")
    tasks, solutions = task_set
    task_id = next(t for t in sorted(tasks) if len(solutions[t]["oracle"]) >= 2)
    task, oracle = tasks[task_id], solutions[task_id]["oracle"]
    prefix, rest = oracle[:1], oracle[1:]
    arm = {**PREFIX_ARMS[kind], **({"vms": 2} if kind == "qemu" else {})}
    with open_arm(arm) as backend:
        screens = agent.rendered_first_screens({task_id: task}, prefix)
        run = make_run(
            tmp_path, backend, {task_id: task}, screens=screens, prefix=prefix, settle_s=0.3
        )
        envs = [environment_class(COMPUTER_13)(run) for _ in range(2)]
        for env in envs:
            turn = env.reset(task_id=task_id)
            shot = agent.screenshot_sha256(turn[0]["image"])
            assert shot == screens[task_id] != agent.screenshot_sha256(agent.first_screenshot(task))
        play(envs[0], task_id, rest)  # the rest of the oracle solves it from there
        envs[1].done()
        assert [env.get_reward() for env in envs] == [1.0, 0.0]
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [x["actions"] for x in lines] == [len(rest) + 1, 1]  # the prefix is not the policy's


def test_a_prefix_the_environment_refuses_stops_the_run_with_one_line(tmp_path, task_set):
    tasks, _ = task_set
    task_id = sorted(tasks)[0]
    off_screen = {"action_type": "CLICK", "parameters": {"x": 999, "y": 1}}
    run = make_run(tmp_path, LocalBackend(), {task_id: tasks[task_id]}, prefix=[off_screen])
    with pytest.raises(RuntimeError, match=r"training.grpo.prefix\[0\] .* was refused"):
        environment_class(COMPUTER_13)(run).reset(task_id=task_id)


def refusals(backend, tmp_path, tasks, task_id) -> list:
    """What the policy reads after actions every desktop refuses (nothing changes)."""
    run = make_run(tmp_path, backend, {task_id: tasks[task_id]}, group=1)
    env = environment_class(COMPUTER_13)(run)
    env.reset(task_id=task_id)
    read = [env.click(x=-5, y=3), env.click(x=3, y=500)]
    assert env.get_reward() == 0.0  # refused actions are the policy's, not the environment's
    return read


def test_a_refused_action_reads_the_same_on_every_arm(tmp_path, task_set):
    """A backend refuses with a ValueError; the Drums client's is an ActionRejected. The note the
    policy reads must not tell the arms apart: a refusal that reached TRL as {"error": ...} on one
    arm and as the note on another would train the arms on different tokens."""
    tasks, _ = task_set
    task_id = sorted(tasks)[0]
    with open_arm({"backend": "drums", "url": "embedded", "mode": "restore"}) as backend:
        drums = refusals(backend, tmp_path / "drums", tasks, task_id)
    local = refusals(LocalBackend(), tmp_path / "local", tasks, task_id)
    assert all(r[0]["type"] == "text" and r[0]["text"].startswith("Refused: ") for r in drums)
    assert local == drums


@pytest.mark.skipif(
    shutil.which("qemu-system-x86_64") is None,
    reason="qemu-system-x86_64 is not installed (Debian package qemu-system-x86)",
)
def test_a_refused_action_reads_the_same_on_the_qemu_arm(tmp_path, task_set):
    """The QEMU pool refuses in the host process, before the guest sees the action."""
    from envab.envs.qemu import QemuConfig, QemuPool

    tasks, _ = task_set
    task_id = sorted(tasks)[0]
    cache = Path(os.environ.get("ENVAB_QEMU_CACHE", REPO / "build/qemu"))
    with QemuPool(QemuConfig(vms=1, cache=cache, step_timeout_s=20.0)) as pool:
        qemu = refusals(pool, tmp_path / "qemu", tasks, task_id)
    assert qemu == refusals(LocalBackend(), tmp_path / "local", tasks, task_id)


# attempt ordinal -> host faults, and the verdict and gate the attempt must end with.
MID_EPISODE = {
    0: ({"kill_at_step": 1}, "env_failure", "worker_alive"),
    1: ({"blank_at_step": 1}, "blank_screen", "screen_not_blank"),
    2: ({"unknown_gate_at_step": 1}, "env_failure", "display_compositor"),
    3: ({"corrupt_restore": True}, "state_mismatch", "state_hash"),
    4: ({"stale_at_step": 1}, "stale_generation", "screen_current"),
}


FAULT_ARMS = {
    "restore": {"backend": "drums", "url": "embedded", "mode": "restore"},
    "fork": {"backend": "drums", "url": "embedded", "mode": "fork"},
    "qemu": {"backend": "qemu", "cache": os.environ.get("ENVAB_QEMU_CACHE", "build/qemu")},
}


@pytest.mark.parametrize("kind", FAULT_ARMS)
def test_a_fault_mid_episode_ends_it_invalid_with_no_reward(tmp_path, task_set, kind, monkeypatch):
    """The same faults on the same attempts on every kind of arm (a fork arm arms each on the
    attempt's own child, the QEMU arm on the VM): each attempt ends invalid with the fault's
    gate, and nothing breaks."""
    if kind == "qemu" and shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed (Debian package qemu-system-x86)")
    tasks, _ = task_set
    task_id = sorted(tasks)[0]
    faults = {n: f for n, (f, _, _) in MID_EPISODE.items()}
    monkeypatch.setenv("DRUMS_RECORD", str(tmp_path / "drums-record.jsonl"))
    with open_arm(FAULT_ARMS[kind], allow_faults=True) as backend:
        run = make_run(tmp_path, backend, {task_id: tasks[task_id]}, faults=faults)
        envs = [environment_class(COMPUTER_13)(run) for _ in MID_EPISODE]
        for env in envs:  # one at a time (the reward closes the session): one VM serves all
            env.reset(task_id=task_id)
            assert env.click(x=10, y=10) == agent.tool_result(note=ENV_FAILED)
            assert env.done() == agent.tool_result(note=ENV_FAILED)  # the episode is over
            assert env.get_reward() is None
    lines = [
        json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()
    ]
    assert [(x["verdict"], x["failed_gates"], x["reward"], x["score"]) for x in lines] == [
        (verdict, [gate], None, None) for _, verdict, gate in MID_EPISODE.values()
    ]
    assert {x["trusted"] for x in lines} == {None}  # verified by nobody: no audit verdict
    record = [json.loads(x) for x in (tmp_path / "drums-record.jsonl").read_text().splitlines()]
    assert [r["dropped"] for r in record] == [
        f"drums_invalid:{verdict}:{gate}" for _, verdict, gate in MID_EPISODE.values()
    ]
    assert run.ledger.invalid == len(MID_EPISODE) and run.ledger.valid == 0


def test_a_first_screen_other_than_the_prompts_is_invalid(tmp_path, task_set):
    tasks, _ = task_set
    task_id = sorted(tasks)[0]
    arm = {"backend": "drums", "url": "embedded", "mode": "fork"}
    with open_arm(arm) as backend:
        run = make_run(
            tmp_path, backend, {task_id: tasks[task_id]}, group=1, screens={task_id: "0" * 64}
        )
        env = environment_class(COMPUTER_13)(run)
        env.reset(task_id=task_id)
        assert env.click(x=10, y=10) == agent.tool_result(note=ENV_FAILED)
        assert env.get_reward() is None
    line = json.loads((tmp_path / "trajectories.jsonl").read_text())
    assert (line["verdict"], line["failed_gates"]) == ("state_mismatch", ["state_hash"])


def test_a_held_out_id_fails_the_run(tmp_path, task_set):
    tasks, _ = task_set
    heldout, train = sorted(tasks)[0], sorted(tasks)[1]
    arm = {"backend": "drums", "url": "embedded", "mode": "restore"}
    with open_arm(arm) as backend:
        run = make_run(tmp_path, backend, {train: tasks[train]}, heldout=frozenset({heldout}))
        with pytest.raises(GuardError, match="held-out task"):
            environment_class(COMPUTER_13)(run).reset(task_id=heldout)
        with pytest.raises(GuardError, match="not in the training split"):
            environment_class(COMPUTER_13)(run).reset(task_id="no-such-task")
        with pytest.raises(GuardError, match="held-out task ids in the training data"):
            run.guard.check_dataset([train, heldout])
    assert not (tmp_path / "trajectories.jsonl").exists()


def test_a_group_must_be_one_task(task_set):
    tasks, _ = task_set
    a, b = sorted(tasks)[:2]

    class NoFork:
        can_fork = False

        def create(self, task):
            return task["id"]

    groups = ForkGroups(NoFork(), group_size=2)
    groups.start(tasks[a])
    with pytest.raises(RuntimeError, match="GRPO group broken"):
        groups.start(tasks[b])


def test_a_group_that_cannot_fork_is_created_side_by_side_in_its_attempts_order(task_set):
    tasks, _ = task_set
    task = tasks[sorted(tasks)[0]]

    class SlowRestores:
        can_fork = False

        def __init__(self):
            self.lock, self.open, self.most, self.closed = threading.Lock(), 0, 0, []

        def create(self, task, faults=None):
            with self.lock:
                self.open += 1
                self.most = max(self.most, self.open)
            time.sleep(0.2)
            with self.lock:
                self.open -= 1
            if (faults or {}).get("fail"):
                raise RuntimeError("out of machines")
            return types.SimpleNamespace(
                faults=faults, env_id=len(self.closed), close=lambda: self.closed.append(1)
            )

    backend = SlowRestores()
    groups = ForkGroups(backend, 4, {1: {"blank_at_step": 1}}, parallel=4)
    starts = [groups.start(task) for _ in range(4)]
    assert backend.most == 4  # all four restores at once
    assert [s.session.faults for s in starts] == [None, {"blank_at_step": 1}, None, None]
    assert all(s.fork_parent is None and 0.2 <= s.env_seconds * 4 < 0.6 for s in starts)
    failing = ForkGroups(backend, 4, {6: {"fail": True}}, parallel=2)
    for _ in range(4):
        failing.start(task)
    with pytest.raises(RuntimeError, match="out of machines"):
        failing.start(task)  # the second group: one create fails, the three made are closed
    assert len(backend.closed) == 3


def test_generation_seconds_are_the_batch_span_less_environment_time():
    now = [0.0]
    clock = GenerationClock(clock=lambda: now[0])
    for t in (1.0, 2.0, 3.0, 4.0):  # four resets; the last at t=4
        now[0] = t
        clock.reset_done()
    clock.env_call(2.0)  # tool calls inside the generation phase
    now[0] = 14.0  # first reward: 10 s since the last reset, 2 of them in the environment
    assert [clock.reward_share() for _ in range(4)] == [2.0] * 4
    now[0] = 20.0
    clock.reset_done()  # a new batch starts from zero
    now[0] = 21.0
    assert clock.reward_share() == 1.0
