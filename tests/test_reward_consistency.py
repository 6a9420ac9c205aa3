"""Reward consistency (analysis/reward_consistency.py): the same task with the same actions gets
the same reward; counted per run, compared between runs by a one-sided exact test, with the power
of that test to see a registered flip_rewards checked against a simulation of the flips."""

from __future__ import annotations

import numpy as np
import pytest

from envab.analysis.reward_consistency import consistency, excess, flip_power, pooled


def attempt(task, actions, reward, verdict="valid", digest=True):
    line = {"task_id": task, "verdict": verdict, "reward": reward}
    return {**line, "actions_sha256": actions} if digest else line


def test_valid_attempts_are_grouped_by_task_and_actions():
    lines = [
        attempt("a", "x", 1.0),
        attempt("a", "x", 1.0),  # a agreeing pair
        attempt("a", "y", 0.0),  # alone: not comparable
        attempt("b", "x", 1.0),  # another task, same actions: another group
        attempt("b", "x", 0.0),
        attempt("b", "x", 1.0),  # a disagreeing group of three
        attempt("a", "y", None, verdict="env_failure"),  # invalid: no reward to compare
    ]
    c = consistency(lines)
    assert (c["valid_attempts"], c["comparable_groups"], c["disagreeing_groups"]) == (6, 2, 1)
    assert c["group_sizes"] == {"2": 1, "3": 1} and c["disagreement_rate"] == 0.5
    assert c["examples"] == [{"task_id": "b", "actions_sha256": "x", "rewards": [1.0, 0.0, 1.0]}]
    assert c["verdict"] == "disagreement"


def test_a_run_recorded_before_the_digest_existed_is_not_checked():
    old = [attempt("a", "x", 1.0, digest=False)] * 3
    assert consistency(old)["verdict"] == "not checked"
    assert consistency(None)["reason"] == "no trajectories.jsonl"


def test_excess_disagreement_is_one_sided():
    clean = {"comparable_groups": 50, "disagreeing_groups": 0}
    flaky = {"comparable_groups": 50, "disagreeing_groups": 10}
    assert excess(flaky, clean) < 0.001
    assert excess(clean, flaky) == 1.0
    assert excess(clean, {"comparable_groups": 0, "disagreeing_groups": 0}) is None
    both = pooled([{**flaky, "group_sizes": {"2": 50}}, {**clean, "group_sizes": {"2": 40}}])
    assert (both["comparable_groups"], both["disagreeing_groups"]) == (100, 10)
    assert both["group_sizes"] == {2: 90} and both["runs"] == 2


@pytest.mark.parametrize("flip", [0.05, 0.1])
def test_the_power_to_see_flipped_rewards_matches_a_simulation_of_the_flips(flip):
    """Groups of 2 and 5 attempts with one true reward each; every reward flipped with
    probability `flip`; the test against a clean base of 60 groups."""
    sizes = {"2": 30, "5": 6}
    run = {"comparable_groups": 36, "disagreeing_groups": 0, "group_sizes": sizes}
    base = {"comparable_groups": 60, "disagreeing_groups": 1}
    predicted = flip_power(run, base, flip, 0.05)
    rng = np.random.default_rng(0)
    hits = 0
    draws = 2000
    for _ in range(draws):
        disagreeing = 0
        for size, count in sizes.items():
            flips = rng.random((count, int(size))) < flip
            disagreeing += int((flips.any(axis=1) & ~flips.all(axis=1)).sum())
        hits += excess({"comparable_groups": 36, "disagreeing_groups": disagreeing}, base) <= 0.05
    assert hits / draws == pytest.approx(predicted, abs=0.035)
    assert flip_power({**run, "comparable_groups": 0, "group_sizes": {}}, base, flip, 0.05) == 0
