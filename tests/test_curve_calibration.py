"""The curve tests on simulated A/A pairs (analysis/calibration.py): the paired t-test over seeds
that judges the controls without bit-determinism keeps its false "differ" rate at alpha with 2, 3
and 5 seeds per arm, whatever the training noise; with one seed per arm it makes no claim, where
the bootstrap band says "differ" for a third of A/A pairs. Numbers: bench/curve_calibration.py,
docs/results/2026-12-03-statistics.md."""

from __future__ import annotations

import math

import pytest

from envab.analysis.calibration import Scenario, differ_rate, rate_gap
from envab.analysis.curve_difference import paired_curve_test

SIMULATIONS = 150
NOISY = Scenario(run_sd=0.6, run_task_sd=0.5)  # training noise well above evaluation noise


def upper(rate: float, n: int = SIMULATIONS) -> float:
    """Three binomial standard errors above `rate`: room for simulation noise."""
    return rate + 3 * math.sqrt(rate * (1 - rate) / n)


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("scenario", [Scenario(), NOISY], ids=["default", "noisy"])
def test_the_paired_curve_test_says_differ_on_a_a_pairs_at_most_alpha(scenario, seeds):
    result = differ_rate(scenario, seeds, SIMULATIONS, margin=0.075, samples=200)
    assert result["paired_t_differ"] <= upper(0.05)


def test_with_one_seed_per_arm_the_band_is_not_calibrated_and_no_claim_is_made():
    result = differ_rate(Scenario(), 1, SIMULATIONS, margin=0.075, samples=200)
    assert result["paired_t_differ"] is None
    assert result["band_differ"] > upper(0.05)  # evaluation noise only: training noise unseen


def test_the_paired_curve_test_has_power_at_a_stated_gap():
    scenario = Scenario()
    assert rate_gap(scenario, 1.0) == pytest.approx(0.15, abs=0.01)
    result = differ_rate(scenario, 5, SIMULATIONS, margin=0.075, gap=1.0, samples=200)
    assert result["paired_t_differ"] >= 0.9


def test_identical_curves_do_not_differ_and_a_constant_gap_does():
    curve = {0: {"t": [1, 0]}, 64: {"t": [1, 1, 0, 0]}}
    lower = {0: {"t": [1, 0]}, 64: {"t": [0, 0, 0, 0]}}
    same = paired_curve_test({1: curve, 2: curve}, {1: curve, 2: curve}, 0.05)
    assert (same["p_value"], same["verdict"]) == (1.0, "not shown to differ")
    apart = paired_curve_test({1: curve, 2: curve}, {1: lower, 2: lower}, 0.05)
    assert apart["verdict"] == "differ" and apart["mean_difference"] == 0.5
    assert apart["checkpoints"] == [64]  # the warm start is left out
