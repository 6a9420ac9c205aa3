"""The tool calls of one turn of a generation batch, run on their environments at once.

TRL 1.16's multi-turn loop (`GRPOTrainer._tool_call_loop`) runs the tool calls of a turn one
completion after another: it calls a completion's tools, appends their results, moves to the next
completion, and generates the next turn once every completion has its results. With 16
completions a turn waits on 16 environment calls in a row, so the loop, not the environment,
multiplies an arm's step latency; and a restore arm's and a fork arm's latencies would differ by
16 times what they differ by.

This layer keeps TRL's loop, its masking and its tokenisation of tool results
(`_get_tool_suffix_ids` and everything after the calls are untouched), and changes only when the
calls run. At the first call of a turn it reads every call the turn will make from the
completions TRL holds: each completion whose last message is an assistant message with tool
calls not yet run (exactly TRL's `idxs_with_tool`), and of its calls those TRL hands to a
synchronous tool (a function call whose name the completion's tool dict holds and whose
arguments are an object). It runs each completion's calls in their order on its own environment,
up to `width` completions at once, then hands TRL each result, or the exception the tool raised,
when TRL asks for it. So every action goes to the session TRL would send it to, in the order TRL
would send it within that session, and nothing that draws a random number runs in another order:
the environments draw none while stepping (rewards, whose control arm draws, are asked for
afterwards, by TRL, in order).

Every call TRL makes must be one that was run for it (the same completion, message, name and
arguments, in order), and every call run must be asked for; anything else is a `TurnMismatch`
raised once TRL's loop returns (TRL turns an exception inside a tool into an `{"error": ...}`
result, so it cannot be raised from there). `width` 1 leaves TRL's own loop alone.

The batch is timed from the trainer's thread, as one span of environment time
(trainer/step_times.py) and one environment call of the generation clock (trainer/environment.py);
a call running inside a batch sees `in_batch()` and times only its own attempt.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

_worker = threading.local()


def in_batch() -> bool:
    """Whether this thread runs a call of a batch (whose time the trainer's thread counts)."""
    return getattr(_worker, "active", False)


class TurnMismatch(RuntimeError):
    """TRL asked for a tool call other than the ones run for its turn: its loop changed."""


class ToolCalls:
    """The run's setting (`training.grpo.parallel_steps`) and what its batches did."""

    def __init__(
        self,
        width: int | None,
        times=None,  # the run's StepTimes: a batch is one "environment" span
        on_batch: Callable[[float], None] | None = None,  # the batch's wall seconds
        clock: Callable[[], float] = time.monotonic,
    ):
        if width is not None and width < 1:
            raise ValueError(f"parallel_steps must be at least 1 or None, not {width}")
        self.width = width
        self.times, self.on_batch, self.clock = times, on_batch, clock
        self.batches = 0  # turns run as a batch
        self.calls = 0  # tool calls run in them
        self.widest = 0  # the most completions of one batch run at once
        self.wall_s = 0.0  # the batches' wall-clock
        self.busy_s = 0.0  # the calls' own seconds, summed

    @property
    def concurrent(self) -> bool:
        return self.width != 1

    def loop(self, tool_dicts: Sequence[Mapping], completions: list[list[dict]]) -> _Loop:
        return _Loop(self, tool_dicts, completions)

    def summary(self) -> dict:
        """For run.json: the width and what the batches did (all zero where TRL's loop ran)."""
        return {
            "parallel_steps": self.width,
            "batches": self.batches,
            "calls": self.calls,
            "widest": self.widest,
            "wall_s": round(self.wall_s, 4),
            "busy_s": round(self.busy_s, 4),
        }


class _Tools:
    """A completion's tool dict as TRL reads it (`name in d`, `d[name](**arguments)`), whose
    calls are answered from the turn's batch."""

    def __init__(self, loop: _Loop, index: int, original: Mapping):
        self.loop, self.index, self.original = loop, index, original

    def __contains__(self, name) -> bool:
        return name in self.original

    def __getitem__(self, name):
        return lambda **arguments: self.loop.answer(self.index, name, arguments)


class _Loop:
    """One `_tool_call_loop`: its turns' batches, and the check that TRL asked for each call."""

    def __init__(self, owner: ToolCalls, tool_dicts: Sequence[Mapping], completions: list):
        self.owner = owner
        self.originals = list(tool_dicts)
        self.completions = completions
        self.tool_dicts = [_Tools(self, i, d) for i, d in enumerate(self.originals)]
        self.queues: dict[int, deque] = {}  # completion -> its calls' outcomes, in order
        self.messages: dict[int, dict] = {}  # completion -> the message its queue answers
        self.served: list[dict] = []  # messages whose calls ran, kept so their ids stay theirs
        self.problems: list[str] = []

    def answer(self, index: int, name, arguments: dict):
        queue = self.queues.get(index)
        if not queue:  # the first call of a turn (or a call nothing was run for)
            self._turn()
            queue = self.queues.get(index)
        message = self.completions[index][-1]
        if not queue or self.messages.get(index) is not message:
            return self._mismatch(f"completion {index} called {name}: nothing was run for it")
        planned, planned_arguments, outcome = queue.popleft()
        if (planned, planned_arguments) != (name, arguments):
            return self._mismatch(
                f"completion {index} called {name}({arguments}), the batch ran "
                f"{planned}({planned_arguments})"
            )
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _mismatch(self, problem: str):
        self.problems.append(problem)
        raise TurnMismatch(problem)

    def finish(self) -> None:
        left = {i: len(q) for i, q in self.queues.items() if q}
        if left:
            self.problems.append(f"calls run and never asked for, by completion: {left}")
        if self.problems:
            raise TurnMismatch("; ".join(self.problems))

    def _calls(self, index: int, message: dict) -> list[tuple[str, dict]]:
        """The calls of `message` TRL hands to a synchronous tool (as `_tool_call_loop` does)."""
        calls = []
        for call in message.get("tool_calls") or []:
            if not isinstance(call, Mapping) or call.get("type") != "function":
                continue
            function = call.get("function") or {}
            name, arguments = function.get("name"), function.get("arguments")
            if name not in self.originals[index] or not isinstance(arguments, Mapping):
                continue
            if not all(isinstance(k, str) for k in arguments):
                continue
            calls.append((name, dict(arguments)))
        return calls

    def _turn(self) -> None:
        left = {i: len(q) for i, q in self.queues.items() if q}
        if left:
            self.problems.append(f"a turn began with calls never asked for, by completion: {left}")
        served = {id(m) for m in self.served}
        plan: dict[int, list] = {}
        for index, messages in enumerate(self.completions):
            last = messages[-1] if messages else None
            if not isinstance(last, dict) or last.get("role") == "tool" or id(last) in served:
                continue
            if not last.get("tool_calls"):
                continue
            self.served.append(last)
            calls = self._calls(index, last)
            if calls:
                plan[index] = calls
                self.messages[index] = last
        self.queues = {}
        if not plan:
            return
        owner = self.owner
        width = min(owner.width or len(plan), len(plan))
        span = owner.times.span("environment") if owner.times is not None else nullcontext()
        with span:
            started = owner.clock()
            with ThreadPoolExecutor(width, thread_name_prefix="envab-tools") as pool:
                futures = {i: pool.submit(self._run, i, calls) for i, calls in plan.items()}
            wall = owner.clock() - started
        for index, future in futures.items():
            outcomes, busy = future.result()  # an error outside the tools is raised here
            self.queues[index] = outcomes
            owner.busy_s += busy
        owner.batches += 1
        owner.calls += sum(len(calls) for calls in plan.values())
        owner.widest = max(owner.widest, width)
        owner.wall_s += wall
        if owner.on_batch is not None:
            owner.on_batch(wall)

    def _run(self, index: int, calls: list[tuple[str, dict]]) -> tuple[deque, float]:
        """One completion's calls, in order, on its environment (in a worker thread)."""
        _worker.active = True
        tools = self.originals[index]
        outcomes, busy = deque(), 0.0
        try:
            for name, arguments in calls:
                started = time.monotonic()
                try:
                    outcome = tools[name](**arguments)
                except Exception as e:  # TRL answers it with {"error": ...}; so do we
                    outcome = e
                busy += time.monotonic() - started
                outcomes.append((name, arguments, outcome))
        finally:
            _worker.active = False
        return outcomes, busy


class ConcurrentToolsMixin:
    """A mixin for TRL's GRPOTrainer (its `_tool_call_loop` and `_sync_tool_dicts`, as in TRL
    1.16's grpo_trainer.py): each turn's tool calls run as one batch (`tool_calls`)."""

    tool_calls: ToolCalls | None = None

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, *args, **kwargs):
        calls = self.tool_calls
        if calls is None or not calls.concurrent or not self.environments:
            return super()._tool_call_loop(
                prompts, prompt_ids, completion_ids, completions, *args, **kwargs
            )
        loop = calls.loop(self._sync_tool_dicts, completions)
        self._sync_tool_dicts = loop.tool_dicts
        result = super()._tool_call_loop(
            prompts, prompt_ids, completion_ids, completions, *args, **kwargs
        )
        loop.finish()
        return result
