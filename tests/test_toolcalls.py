"""A turn's tool calls run on their environments at once (trainer/toolcalls.py): the calls TRL's
loop would make one after another are run side by side, bounded by the width, each on its own
environment in its own order, and TRL gets exactly the results it would have got. First on a
stand-in for TRL's loop (the calling pattern of TRL 1.16's `_tool_call_loop`), then through TRL's
GRPOTrainer itself, multi-turn, with the tiny model on the embedded host's fork arm: the same
trajectories and the same training batch as TRL's own loop, one call after another."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
from tiny_grpo import arm_run, call_ids, grpo_args, record_batches

from envab.envs.arms import open_arm
from envab.envs.tasks.build import build
from envab.trainer import agent
from envab.trainer import model as pin
from envab.trainer.environment import environment_factory
from envab.trainer.generation import GuardedGenerationMixin
from envab.trainer.step_times import StepTimes
from envab.trainer.toolcalls import ConcurrentToolsMixin, ToolCalls, TurnMismatch, in_batch

# --- the batch, on a stand-in for TRL's loop ------------------------------------------------------


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(*calls) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


def trl_turn(tool_dicts, completions, with_tool: list[int]) -> dict[int, list]:
    """One iteration of TRL 1.16's `_tool_call_loop`, as it calls the tools: completion after
    completion, each call of one after the other, an exception answered with {"error": ...}, the
    tool messages appended once a completion's calls are done."""
    results = {}
    for i in with_tool:
        results[i] = []
        for c in completions[i][-1]["tool_calls"]:
            if c["type"] != "function":
                continue
            name = c["function"]["name"]
            try:
                if name not in tool_dicts[i]:
                    raise ValueError(f"Tool {name} not found.")
                result = tool_dicts[i][name](**c["function"]["arguments"])
            except Exception as e:
                result = {"error": str(e)}
            results[i].append(result)
        for result in results[i]:
            completions[i].append({"role": "tool", "name": "x", "content": str(result)})
    return results


class Recorder:
    """Tools that record which environment got which call, from which thread."""

    def __init__(self, n: int, barrier: threading.Barrier | None = None):
        self.log = []
        self.threads = set()
        self.batched = set()  # in_batch() as each call saw it
        self.barrier = barrier
        self.dicts = [{"click": self.tool(i), "fail": self.failing(i)} for i in range(n)]

    def tool(self, i):
        def click(x: int, y: int):
            self.threads.add(threading.get_ident())
            self.batched.add(in_batch())
            if self.barrier is not None:
                self.barrier.wait()  # every environment of the batch is inside its call at once
            self.log.append((i, x, y))
            return [{"type": "text", "text": f"env {i} clicked {x},{y}"}]

        return click

    def failing(self, i):
        def fail():
            raise ValueError(f"env {i} refused")

        return fail


def test_a_turns_calls_run_at_once_and_each_result_goes_back_to_its_completion():
    n = 4
    tools = Recorder(n, threading.Barrier(n, timeout=10))
    completions = [[assistant(call("click", x=i, y=10 * i))] for i in range(n)]
    calls = ToolCalls(None)
    loop = calls.loop(tools.dicts, completions)
    results = trl_turn(loop.tool_dicts, completions, list(range(n)))
    loop.finish()
    assert results == {
        i: [[{"type": "text", "text": f"env {i} clicked {i},{10 * i}"}]] for i in range(n)
    }
    assert len(tools.threads) == n and threading.get_ident() not in tools.threads
    assert not in_batch()
    assert calls.summary() | {"wall_s": 0, "busy_s": 0} == {
        "parallel_steps": None,
        "batches": 1,
        "calls": n,
        "widest": n,
        "wall_s": 0,
        "busy_s": 0,
    }


def test_the_width_bounds_how_many_run_at_once():
    """Three environments wait for each other; two at a time cannot all be inside at once."""
    tools = Recorder(3, threading.Barrier(3, timeout=1))
    completions = [[assistant(call("click", x=i, y=0))] for i in range(3)]
    loop = ToolCalls(2).loop(tools.dicts, completions)
    results = trl_turn(loop.tool_dicts, completions, [0, 1, 2])
    loop.finish()
    assert all(r == [{"error": ""}] for r in results.values())  # threading.BrokenBarrierError


def test_several_turns_several_calls_in_order_errors_kept_as_trl_would_have_them():
    """A completion's calls run in their order on its environment; a tool's exception reaches
    TRL as TRL would have caught it; completions without calls, or done, are left alone."""
    tools = Recorder(3)
    completions = [
        [assistant(call("click", x=1, y=1), call("fail"), call("click", x=2, y=2))],
        [{"role": "assistant", "content": "no call"}],
        [assistant(call("click", x=3, y=3), {"type": "other"}, call("nope"))],
    ]
    sequential = Recorder(3)
    plain = [list(map(dict, c)) for c in completions]
    expected = trl_turn(sequential.dicts, plain, [0, 2])
    loop = ToolCalls(None).loop(tools.dicts, completions)
    assert trl_turn(loop.tool_dicts, completions, [0, 2]) == expected
    # the next turn: completion 0 calls again, completion 2 is done
    completions[0].append(assistant(call("click", x=4, y=4)))
    plain[0].append(assistant(call("click", x=4, y=4)))
    assert trl_turn(loop.tool_dicts, completions, [0]) == trl_turn(sequential.dicts, plain, [0])
    loop.finish()
    assert sorted(tools.log) == sorted(sequential.log)
    assert tools.batched == {True} and sequential.batched == {False}
    assert [e for e in tools.log if e[0] == 0] == [(0, 1, 1), (0, 2, 2), (0, 4, 4)]


def test_a_call_trl_makes_that_was_not_run_for_it_is_refused_then_raised():
    tools = Recorder(2)
    completions = [[assistant(call("click", x=1, y=1))], [assistant(call("click", x=2, y=2))]]
    loop = ToolCalls(None).loop(tools.dicts, completions)
    with pytest.raises(TurnMismatch, match="the batch ran click"):
        loop.tool_dicts[0]["click"](x=9, y=9)  # not the call the completion holds
    with pytest.raises(TurnMismatch, match="never asked for"):
        loop.finish()


def test_a_batch_is_one_environment_span_and_one_clock_call():
    times, seen = StepTimes(), []
    tools = Recorder(2)
    completions = [[assistant(call("click", x=i, y=i))] for i in range(2)]
    calls = ToolCalls(None, times, seen.append)
    times.begin_step()
    loop = calls.loop(tools.dicts, completions)
    trl_turn(loop.tool_dicts, completions, [0, 1])
    loop.finish()
    times.end()
    assert len(seen) == 1 and seen[0] == pytest.approx(calls.wall_s)
    assert times.steps[0]["environment"] == pytest.approx(calls.wall_s, abs=1e-3)


def test_a_width_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        ToolCalls(0)
    assert not ToolCalls(1).concurrent and ToolCalls(None).concurrent and ToolCalls(3).concurrent


# --- through TRL's GRPOTrainer, multi-turn, on the fork arm ---------------------------------------

TURNS = 2
GROUP, PROMPTS = 2, 2


@pytest.fixture(scope="module")
def tasks():
    built, _ = build(seed=1, per_family=2)
    return {t["id"]: t for t in built if t["family"] == "click_button"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tasks):
    out = tmp_path_factory.mktemp("tiny") / "model"
    return pin.build_builtin(pin.BuiltinSource(), [t["instruction"] for t in tasks.values()], out)


class Scripted:
    """A policy that calls click on every turn but the last, at a point its completion's own
    (its place in the batch and the turn), so a call sent to another session would show; the
    last turn ends without a call. TRL's loop parses, runs and tokenises everything as usual."""

    turn = 0

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        tokenizer = self.processing_class.tokenizer
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        turn, self.turn = self.turn, self.turn + 1
        out = []
        for j in range(len(prompt_ids)):
            if turn < TURNS:
                point = {"x": 8 + 16 * j + 4 * turn, "y": 20 + 40 * turn}
                ids = call_ids(self.processing_class, "click", point)
            else:
                ids = [*tokenizer.encode("ok"), end]
            out.append(ids)
        return out, None


def train_once(tiny, tasks, backend, tmp_path, width):
    """One GRPO step of a batch of GROUP x PROMPTS completions, TURNS turns each."""
    from trl import GRPOTrainer

    model, processor = pin.load(tiny)
    args = grpo_args(
        tmp_path / "trl",
        processor.tokenizer,
        num_generations=GROUP,
        prompts_per_step=PROMPTS,
        max_turns=TURNS,
        max_completion_length=512,
        parallel_steps=width,
    )
    args.max_steps = 1
    run = arm_run(tasks, backend, tmp_path, GROUP, TURNS)
    cls = type("Trainer", (GuardedGenerationMixin, ConcurrentToolsMixin, Scripted, GRPOTrainer), {})
    from datasets import Dataset

    trainer = cls(
        model=model,
        processing_class=processor,
        args=args,
        train_dataset=Dataset.from_list(agent.training_rows(tasks)),
        environment_factory=environment_factory(run),
    )
    trainer.tool_calls = ToolCalls(width, run.times, run.clock.env_call)
    batches = record_batches(trainer)
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    return trainer, batches[0], lines


@pytest.mark.integration  # a gVisor sandbox or a QEMU VM per session (docs/reference/tests.md)
@pytest.mark.parametrize(
    "arm",
    [
        {"backend": "drums", "url": "embedded", "mode": "fork"},
        {"backend": "qemu", "vms": 4, "max_vms": 4, "memory_mib": 256, "accel": "auto"},
    ],
    ids=["fork", "qemu"],
)
def test_grpo_multi_turn_same_trajectories_and_batch_as_trls_own_loop(arm, tiny, tasks, tmp_path):
    if arm["backend"] == "qemu" and shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 not found: the QEMU arm needs it (setup installs it)")
    with open_arm(arm) as backend:
        assert backend.can_fork == (arm["backend"] == "drums")
        started = time.monotonic()
        one, one_batch, one_lines = train_once(tiny, tasks, backend, tmp_path / "one", 1)
        batched, batch, lines = train_once(tiny, tasks, backend, tmp_path / "all", None)
        assert time.monotonic() - started < 600
    assert one.tool_calls.summary()["batches"] == 0  # TRL's own loop, one call after another
    summary = batched.tool_calls.summary()
    n = GROUP * PROMPTS
    assert (summary["batches"], summary["calls"], summary["widest"]) == (TURNS, TURNS * n, n)

    kept = ("task_id", "verdict", "failed_gates", "score", "turns", "actions", "refused")
    same = [{k: line[k] for k in (*kept, "actions_sha256")} for line in lines]
    assert same == [{k: line[k] for k in (*kept, "actions_sha256")} for line in one_lines]
    assert [line["turns"] for line in lines] == [TURNS] * n
    assert all(line["verdict"] == "valid" for line in lines)
    assert len({line["actions_sha256"] for line in lines}) == n  # each session its own actions
    # a fork arm's group shares a parent; a restore arm's sessions have none
    assert {line["fork_parent"] is not None for line in lines} == {arm["backend"] == "drums"}

    import torch

    for key in ("prompt_ids", "completion_ids", "completion_mask", "tool_mask", "advantages"):
        assert torch.equal(batch[key], one_batch[key]), key
    assert int(batch["tool_mask"].eq(0).sum()) > 0  # tool results, masked as TRL masks them
    for key in ("pixel_values", "image_grid_thw"):
        assert torch.equal(batch[key], one_batch[key]), key
