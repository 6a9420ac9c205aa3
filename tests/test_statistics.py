"""Binomial intervals and the coincidence verdicts."""

from __future__ import annotations

import pytest

from envab.analysis.statistics import coincidence, wilson_interval


def test_wilson_interval_brackets_the_rate_and_narrows_with_n():
    low, high = wilson_interval(5, 10)
    assert low < 0.5 < high
    low_big, high_big = wilson_interval(500, 1000)
    assert high_big - low_big < high - low
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    # the textbook value: 95 % Wilson interval of 8/10 is about (0.490, 0.943)
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-3)


def curve(rate_by_checkpoint: dict[int, float], tasks: int = 40, episodes: int = 5):
    """Deterministic outcomes: the first round(rate * tasks) tasks succeed on every episode."""
    return {
        c: {f"t{i}": [int(i < round(rate * tasks))] * episodes for i in range(tasks)}
        for c, rate in rate_by_checkpoint.items()
    }


def test_identical_curves_coincide():
    a = curve({32: 0.2, 64: 0.5, 96: 0.7})
    result = coincidence(a, a, margin=0.1)
    assert result.verdict == "coincide" and result.difference == 0.0


def test_a_large_gap_differs():
    result = coincidence(curve({32: 0.8, 64: 0.9}), curve({32: 0.1, 64: 0.2}), margin=0.1)
    assert result.verdict == "differ" and result.difference == pytest.approx(0.7)
    assert result.interval[0] > 0.1


def test_too_few_tasks_is_inconclusive_not_coincide():
    result = coincidence(curve({32: 0.5}, tasks=4), curve({32: 0.25}, tasks=4), margin=0.2)
    assert result.verdict == "inconclusive"


def test_only_matched_checkpoints_are_compared():
    a = curve({32: 0.5, 64: 0.5, 96: 0.9})
    b = curve({32: 0.5, 64: 0.5})
    result = coincidence(a, b, margin=0.1)
    assert result.matched_checkpoints == [32, 64] and result.verdict == "coincide"
    with pytest.raises(ValueError, match="matched"):
        coincidence(curve({32: 0.5}), curve({64: 0.5}), margin=0.1)
