"""Step times: exclusive spans add up to each step's period, with the rest as `between`."""

from __future__ import annotations

import pytest

from envab.trainer.step_times import PARTS, StepTimes


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


def test_spans_are_exclusive_and_a_step_adds_up_to_its_period():
    clock = Clock()
    times = StepTimes(clock)
    times.begin_step()
    clock.tick(0.5)  # before the rollout: between
    with times.span("rollout"):
        clock.tick(1.0)  # TRL's glue
        with times.span("generation"):
            clock.tick(3.0)
        with times.span("environment"):
            clock.tick(2.0)
        with times.span("logprobs"):
            clock.tick(0.25)
        clock.tick(0.25)  # glue again
    with times.span("learning"):
        clock.tick(4.0)
    times.enter("learning")  # the optimizer, from the callback's two hooks
    clock.tick(1.0)
    times.leave()
    clock.tick(0.5)  # our callback's checkpoint
    times.begin_step()
    clock.tick(2.0)
    times.end()
    first, second = times.steps
    assert first == {
        "step_s": 12.5, "generation": 3.0, "environment": 2.0, "logprobs": 0.25,
        "learning": 5.0, "rollout": 1.25, "between": 1.0,
    }  # fmt: skip
    assert second == {"step_s": 2.0, **{k: 0.0 for k in PARTS}, "between": 2.0}
    summary = times.summary()
    assert summary["steps"] == 2 and summary["total_s"]["step_s"] == 14.5
    assert summary["after_first_s"]["between"] == 2.0
    assert summary["overhead_fraction"] == pytest.approx((1.25 + 1.0 + 2.0) / 14.5, abs=1e-4)


def test_a_span_that_raises_still_closes():
    clock = Clock()
    times = StepTimes(clock)
    times.begin_step()
    with pytest.raises(RuntimeError), times.span("environment"):
        clock.tick(1.0)
        raise RuntimeError("the arm died")
    assert times.current() is None
    times.end()
    assert times.steps[0]["environment"] == 1.0
