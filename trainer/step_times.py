"""Where a GRPO step's wall-clock goes: generation, environment, log-probs, learning, overhead.

Spans are timed exclusively (a span's time excludes the spans opened inside it), so the parts of a
step add up to its wall-clock without double counting. The trainer opens them around TRL's own
methods (trainer/resume.py) and the environment around every call to the arm (reset, tool, reward;
trainer/environment.py):

    rollout      TRL's `_prepare_inputs`: its own glue (tokenizing, the processor, tool parsing,
                 rewards' bookkeeping) once the parts below are taken out
    generation   `_generate_single_turn`: the policy's forward passes that write completions
    environment  every call into the arm (reset/fork, step, verify, close)
    logprobs     `_get_per_token_logps_and_entropies` during the rollout (old and reference)
    learning     the rest of `training_step` (the loss's forward and backward) and the optimizer

A step's period runs from its `on_step_begin` to the next one's, so what happens between steps
(our callback's checkpoints and journal, TRL's logging, the data loader) is in it too, as
`between`. The pipeline's overhead is `rollout` + `between`: the time neither the model nor the
environment is working.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

WORK = ("generation", "environment", "logprobs", "learning")
OVERHEAD = ("rollout", "between")
PARTS = WORK + OVERHEAD


class StepTimes:
    """Exclusive span totals per GRPO step; one per run, used from the trainer's thread only."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self._stack: list[list] = []  # [name, since] of the open spans, innermost last
        self._spans: Counter[str] = Counter()
        self._began: float | None = None
        self.steps: list[dict[str, float]] = []

    def enter(self, name: str) -> None:
        now = self.clock()
        if self._stack:
            outer = self._stack[-1]
            self._spans[outer[0]] += now - outer[1]
        self._stack.append([name, now])

    def leave(self) -> None:
        now = self.clock()
        inner = self._stack.pop()
        self._spans[inner[0]] += now - inner[1]
        if self._stack:
            self._stack[-1][1] = now

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.leave()

    def current(self) -> str | None:
        return self._stack[-1][0] if self._stack else None

    def begin_step(self) -> None:
        """A step starts: the previous one's period ends here."""
        now = self.clock()
        if self._began is not None:
            self._close(now)
        self._began = now

    def end(self) -> None:
        """Training ended: the last step's period ends now."""
        if self._began is not None:
            self._close(self.clock())
            self._began = None

    def _close(self, now: float) -> None:
        period = now - self._began
        parts = {name: self._spans.get(name, 0.0) for name in PARTS if name != "between"}
        parts["between"] = max(period - sum(parts.values()), 0.0)
        self.steps.append({"step_s": period, **parts})
        self._spans.clear()

    def last(self) -> dict[str, float] | None:
        return self.steps[-1] if self.steps else None

    def summary(self) -> dict:
        """Totals over the run's steps (the first, which warms up, as well as apart)."""
        if not self.steps:
            return {"steps": 0}
        total = {key: sum(s[key] for s in self.steps) for key in ("step_s", *PARTS)}
        rest = self.steps[1:]
        return {
            "steps": len(self.steps),
            "total_s": {k: round(v, 4) for k, v in total.items()},
            "first_step_s": {k: round(v, 4) for k, v in self.steps[0].items()},
            "after_first_s": {
                key: round(sum(s[key] for s in rest), 4) for key in ("step_s", *PARTS)
            },
            "overhead_fraction": round(sum(total[k] for k in OVERHEAD) / total["step_s"], 4)
            if total["step_s"]
            else None,
        }


class TimedGRPOTrainer:
    """A mixin for TRL's GRPOTrainer that opens the spans above around its own methods (their
    names and roles as in TRL 1.16's grpo_trainer.py). The optimizer's step is timed by the
    trainer's callback (`on_pre_optimizer_step` to `on_optimizer_step`)."""

    step_times: StepTimes

    def training_step(self, *args, **kwargs):
        with self.step_times.span("learning"):
            return super().training_step(*args, **kwargs)

    def _prepare_inputs(self, *args, **kwargs):
        with self.step_times.span("rollout"):
            return super()._prepare_inputs(*args, **kwargs)

    def _generate_single_turn(self, *args, **kwargs):
        with self.step_times.span("generation"):
            return super()._generate_single_turn(*args, **kwargs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        if self.step_times.current() == "learning":  # the loss's own forward pass
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        with self.step_times.span("logprobs"):
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
