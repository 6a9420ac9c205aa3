"""The curve test over training seeds x held-out tasks (analysis/curve_difference.py): its false
"differ" rate on simulated A/A pairs at most alpha and its power at a stated gap, at 3 and 5
seeds per arm (none with one: no claim); its arithmetic; and a reward corruption judged on curves
only where the test is powered for the registered flip. Numbers: bench/curve_calibration.py,
docs/results/2026-12-03-curve-test.md."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from test_controls_without_determinism import prereg, simulated_run

from envab.analysis.calibration import Scenario, differ_rate, rate_gap
from envab.analysis.controls import NOT_DETERMINISTIC, judge
from envab.analysis.curve_difference import (
    cluster_curve_test,
    detectable_gap,
    paired_curve_test,
    power_at,
    two_way,
)
from envab.preregistration import Control

SIMULATIONS = 100


def upper(rate: float, n: int = SIMULATIONS) -> float:
    """Three binomial standard errors above `rate`: room for simulation noise."""
    return rate + 3 * math.sqrt(rate * (1 - rate) / n)


NOISY = Scenario(run_sd=0.6, run_task_sd=0.5)  # training noise well above evaluation noise


@pytest.mark.parametrize(
    ("seeds", "scenario"), [(3, NOISY), (5, Scenario())], ids=["3-noisy", "5-default"]
)
def test_on_a_a_pairs_it_says_differ_at_most_alpha(seeds, scenario):
    result = differ_rate(scenario, seeds, SIMULATIONS, margin=0.075, samples=0, seed=seeds)
    assert result["cluster_differ"] <= upper(0.05)


def test_with_one_seed_per_arm_it_makes_no_claim():
    result = differ_rate(Scenario(), 1, 20, margin=0.075, samples=0)
    assert result["cluster_differ"] is None


def test_it_has_power_at_a_stated_gap():
    scenario = Scenario()
    assert rate_gap(scenario, 1.0) == pytest.approx(0.15, abs=0.01)
    five = differ_rate(scenario, 5, SIMULATIONS, margin=0.075, gap=1.0, samples=0, seed=1)
    assert five["cluster_differ"] >= 0.9


def test_it_never_says_differ_where_the_paired_t_test_does_not():
    """Its variance adds the task term to the seed term, on the same degrees of freedom."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        d = rng.normal(0.02, 0.1, (3, 12)) + rng.normal(0, 0.05, (3, 1))
        ours = two_way(d)
        t = stats.ttest_1samp(d.mean(axis=1), 0.0)
        assert ours["p_value"] >= t.pvalue - 1e-12
        if ours["ms_task"] <= ours["ms_resid"]:  # the task term floored: the paired t-test
            assert ours["p_value"] == pytest.approx(t.pvalue)


def test_the_task_term_counts_where_the_arms_differ_task_by_task():
    """Seeds agree, tasks do not: the fixed task set differs, tasks in general are not shown to."""
    gaps = np.array([0.5, -0.4, 0.45, -0.3, 0.4, -0.35])
    a = {s: {64: {f"t{k}": [1] * 4 for k in range(6)}} for s in (1, 2, 3)}
    b = {
        s: {
            64: {
                f"t{k}": [1] * round(4 * (1 - g)) + [0] * (4 - round(4 * (1 - g)))
                for k, g in enumerate(gaps + 0.1 * (s - 2) * (gaps > 0))
            }
        }
        for s in (1, 2, 3)
    }
    assert paired_curve_test(a, b, 0.05)["verdict"] == "differ"
    result = cluster_curve_test(a, b, 0.05)
    assert result["verdict"] == "not shown to differ" and result["ms_task"] > result["ms_resid"]


def test_identical_curves_do_not_differ_and_a_constant_gap_does():
    curve = {0: {"t": [1, 0], "u": [0, 0]}, 64: {"t": [1, 1, 0, 0], "u": [1, 0]}}
    lower = {0: {"t": [1, 0], "u": [0, 0]}, 64: {"t": [0, 0, 0, 0], "u": [0, 0]}}
    same = cluster_curve_test({1: curve, 2: curve}, {1: curve, 2: curve}, 0.05)
    assert (same["p_value"], same["verdict"]) == (1.0, "not shown to differ")
    apart = cluster_curve_test({1: curve, 2: curve}, {1: lower, 2: lower}, 0.05)
    assert apart["verdict"] == "differ" and apart["checkpoints"] == [64]


def test_no_claim_with_one_seed_or_one_task():
    curve = {64: {"t": [1, 0]}}
    assert cluster_curve_test({1: curve}, {1: curve}, 0.05)["verdict"] == "no arm-level claim"
    result = cluster_curve_test({1: curve, 2: curve}, {1: curve, 2: curve}, 0.05)
    assert result["verdict"] == "no arm-level claim" and "one held-out task" in result["reason"]


def test_its_power_is_alpha_at_no_gap_and_the_detectable_gap_has_the_stated_power():
    result = {"p_value": 0.5, "se": 0.02, "df": 4}
    assert power_at(result, 0.0, 0.05) == pytest.approx(0.05, abs=1e-6)
    gap = detectable_gap(result, 0.05, 0.8)
    assert power_at(result, gap, 0.05) == pytest.approx(0.8, abs=1e-4)
    # Against scipy's noncentral t where it is finite.
    critical = stats.t.ppf(0.975, 4)
    exact = stats.nct.sf(critical, 4, 2.5) + stats.nct.cdf(-critical, 4, 2.5)
    assert power_at(result, 0.05, 0.05) == pytest.approx(exact, abs=1e-6)


SIX = (1, 2, 3, 4, 5, 6)


def corruption(flip: float, gap: float, seeds) -> dict:
    """A reward corruption registered at `flip` whose reward disagreement cannot be seen (every
    attempt its own action sequence, almost) and whose curve is shifted by `gap` (logit)."""
    control = Control("corruption", "drums", "differ", flip_rewards=flip)
    base = [simulated_run("drums", s, replay=False) for s in seeds]
    runs = [
        simulated_run("drums-corruption", s, replay=False, gap=gap, sequences=4000) for s in seeds
    ]
    return judge(control, base, runs, prereg(), rules=NOT_DETERMINISTIC)


def test_a_corruption_the_curve_test_cannot_see_is_not_powered_even_where_curves_differ():
    judged = corruption(0.1, -1.5, (1, 2, 3))
    assert judged["rewards"]["power"] < 0.8
    sized = judged["curve_test"]["corruption"]
    assert sized["verdict"] == "not powered" and sized["power"] < 0.8
    assert abs(sized["predicted_gap"]) < sized["detectable_gap"]
    assert judged["verdict"] == "not powered"
    assert (
        "curve test not powered for this corruption (predicted gap -2 x 0.1 x base gain"
        in (judged["reasons"][1])
    )


def test_a_corruption_the_curve_test_is_powered_for_passes_or_fails_on_curves():
    seen = corruption(0.5, -1.5, SIX)
    assert seen["curve_test"]["corruption"]["verdict"] == "powered"
    assert seen["curve_test"]["verdict"] == "differ"
    assert seen["verdict"] == "as expected"
    missed = corruption(0.5, 0.0, SIX)
    assert missed["curve_test"]["corruption"]["verdict"] == "powered"
    assert missed["curve_test"]["verdict"] == "not shown to differ"
    assert missed["verdict"] == "NOT as expected"
