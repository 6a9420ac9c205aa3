"""Crossing rules: the old first-crossing rule is tripped by evaluation noise; the pre-registered
rules are not (much), still accept a real crossing, and a confirmatory evaluation is sized right."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, binomtest
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_confint, proportion_effectsize

from envab.analysis.crossing import (
    NULLS,
    CrossingRule,
    accepted_crossing,
    approximate_episodes,
    confirm,
    confirmation_power,
    confirmation_rates,
    confirmatory_episodes,
    crossing_power,
    crossing_probability,
    false_crossing_probability,
    null_statement,
    reached_probability,
    wilson_lower_bound,
)

FIRST = {"rule": "first_crossing"}
LOWER = {"rule": "lower_bound", "confidence": 0.95}
CONSECUTIVE = {"rule": "consecutive", "checkpoints": 2}
SIMULATIONS = 20000
EPISODES, THRESHOLD = 64, 0.75


def exact_probability(true_rate, threshold, episodes, looks, rule) -> float:
    """Reference, independent of the module's simulation: per-look pass probability from the
    binomial, then independent looks (a run-length Markov chain for `consecutive`)."""
    rule = CrossingRule.from_dict(rule)
    s = np.arange(episodes + 1)
    if rule.kind == "lower_bound":
        passing = [
            k for k in s if wilson_lower_bound(int(k), episodes, rule.confidence) >= threshold
        ]
    else:
        passing = [k for k in s if k / episodes >= threshold]
    q = float(binom.pmf(passing, episodes, true_rate).sum())
    need = rule.consecutive if rule.kind == "consecutive" else 1
    state = np.zeros(need + 1)  # run length 0..need-1, absorbed at need
    state[0] = 1.0
    for _ in range(looks):
        nxt = np.zeros_like(state)
        nxt[need] = state[need]
        nxt[0] += state[:need].sum() * (1 - q)
        nxt[1 : need + 1] += state[:need] * q
        state = nxt
    return float(state[need])


def mc_error(p: float) -> float:
    return 4 * math.sqrt(max(p * (1 - p), 1e-4) / SIMULATIONS)


def test_first_crossing_is_tripped_by_noise():
    # One look: exactly P(Binom(64, 0.70) >= 48) = 0.2334.
    exact_one = float(binom.sf(47, EPISODES, 0.70))
    assert 0.22 < exact_one < 0.25
    one = false_crossing_probability(0.70, THRESHOLD, EPISODES, 1, FIRST)
    assert abs(one - exact_one) < mc_error(exact_one)
    # Five looks: 1 - (1 - 0.2334)^5 = 0.735; the simulation gives 0.734 at seed 0.
    exact_five = 1 - (1 - exact_one) ** 5
    five = false_crossing_probability(0.70, THRESHOLD, EPISODES, 5, FIRST)
    assert abs(five - exact_five) < mc_error(exact_five)
    assert five > 0.65


@pytest.mark.parametrize("rule", [FIRST, LOWER, CONSECUTIVE], ids=["first", "lower", "consec"])
@pytest.mark.parametrize("true_rate", [0.70, 0.75, 0.85])
def test_simulation_matches_exact_probability(rule, true_rate):
    simulated = crossing_power(true_rate, THRESHOLD, EPISODES, 5, rule)
    exact = exact_probability(true_rate, THRESHOLD, EPISODES, 5, rule)
    assert abs(simulated - exact) < mc_error(exact)


def test_strict_rules_suppress_false_crossings_and_keep_power():
    first = false_crossing_probability(0.70, THRESHOLD, EPISODES, 5, FIRST)  # ~0.73
    lower = false_crossing_probability(0.70, THRESHOLD, EPISODES, 5, LOWER)  # ~0.03
    consecutive = false_crossing_probability(0.70, THRESHOLD, EPISODES, 5, CONSECUTIVE)  # ~0.18
    assert lower < 0.1
    assert consecutive < 0.25 < first / 2
    # A real 0.85 policy is still accepted within five looks: ~0.99 and ~1.00.
    assert crossing_power(0.85, THRESHOLD, EPISODES, 5, LOWER) > 0.95
    assert crossing_power(0.85, THRESHOLD, EPISODES, 5, CONSECUTIVE) > 0.95


def test_simulation_is_reproducible_and_short_runs_cannot_cross():
    a = crossing_power(0.8, THRESHOLD, EPISODES, 5, LOWER, simulations=2000, seed=3)
    b = crossing_power(0.8, THRESHOLD, EPISODES, 5, LOWER, simulations=2000, seed=3)
    assert a == b
    assert crossing_power(0.99, THRESHOLD, EPISODES, 1, CONSECUTIVE) == 0.0


V5 = (0.672, 0.750, 0.781, 0.734, 0.703)


def v5_points():
    return [(256 * i, round(rate * EPISODES), EPISODES) for i, rate in enumerate(V5)]


def test_curve_crossed_by_noise_is_not_accepted():
    points = v5_points()
    assert [p[1] for p in points] == [43, 48, 50, 47, 45]
    assert accepted_crossing(points, THRESHOLD, FIRST) == 1  # at 0.750
    assert accepted_crossing(points, THRESHOLD, LOWER) is None
    # Two looks in a row at or above 0.75 (48, 50): consecutive(2) accepts it; (3) does not.
    assert accepted_crossing(points, THRESHOLD, CONSECUTIVE) == 1
    assert accepted_crossing(points, THRESHOLD, {"rule": "consecutive", "checkpoints": 3}) is None


def test_lower_bound_accepts_a_clear_crossing():
    points = [(0, 40, 64), (256, 50, 64), (512, 54, 64), (768, 60, 64)]
    assert wilson_lower_bound(53, 64) < THRESHOLD <= wilson_lower_bound(54, 64)
    assert accepted_crossing(points, THRESHOLD, LOWER) == 2


def test_one_sided_wilson_lower_bound():
    # By hand: z = Phi^-1(0.95) = 1.644854, p = 48/64, n = 64.
    z, n, p = 1.6448536269514722, 64, 0.75
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson_lower_bound(48, 64, 0.95) == pytest.approx(centre - half, abs=1e-12)
    assert wilson_lower_bound(48, 64, 0.95) == pytest.approx(0.652066485, abs=1e-9)
    # Not the lower end of the two-sided 95% interval (that is z = 1.96, 0.6318).
    assert wilson_lower_bound(48, 64, 0.95) > proportion_confint(48, 64, 0.05, "wilson")[0] + 0.01
    for successes, episodes in [(0, 10), (3, 10), (48, 64), (60, 64), (64, 64), (150, 200)]:
        for confidence in (0.8, 0.9, 0.95, 0.975, 0.99):
            reference = proportion_confint(
                successes, episodes, alpha=2 * (1 - confidence), method="wilson"
            )[0]
            got = wilson_lower_bound(successes, episodes, confidence)
            assert got == pytest.approx(reference, abs=1e-12)


def test_unscored_checkpoints_break_runs_and_are_never_accepted():
    rule = CrossingRule("consecutive", consecutive=2)
    broken = [(0, 50, 64), (256, None, None), (512, 50, 64), (768, 40, 64)]
    assert accepted_crossing(broken, THRESHOLD, rule) is None
    assert accepted_crossing(broken + [(1024, 50, 64), (1280, 51, 64)], THRESHOLD, rule) == 4
    records = [
        {"scored": True, "successes": 50, "episodes": 64},
        {"scored": False, "successes": 60, "episodes": 63},  # short of valid episodes
        None,  # no evaluation at all
        {"scored": True, "successes": 50, "episodes": 64},
        {"scored": True, "successes": 49, "episodes": 64},
    ]
    assert accepted_crossing(records, THRESHOLD, rule) == 3
    # Even the old rule never accepts an unscored record, whatever counts it carries.
    assert accepted_crossing(records[1:3], THRESHOLD, FIRST) is None
    assert accepted_crossing(records[1:], THRESHOLD, FIRST) == 2


def test_points_must_be_in_order():
    with pytest.raises(ValueError, match="ordered"):
        accepted_crossing([(512, 50, 64), (256, 50, 64)], THRESHOLD, FIRST)


def test_rule_from_the_preregistration_section():
    assert CrossingRule.from_dict(LOWER) == CrossingRule("lower_bound", confidence=0.95)
    assert CrossingRule.from_dict(CONSECUTIVE) == CrossingRule("consecutive", consecutive=2)
    assert CrossingRule.from_dict(FIRST).kind == "first_crossing"
    for section in (LOWER, CONSECUTIVE, FIRST):
        assert CrossingRule.from_dict(section).to_dict() == section
    for bad in (
        {"rule": "best_of_three"},
        {"rule": "lower_bound", "checkpoints": 2},
        {"rule": "lower_bound", "confidence": 0.4},
        {"rule": "consecutive", "checkpoints": 0},
        {"rule": "consecutive", "checkpoints": 1.5},
    ):
        with pytest.raises(ValueError):
            CrossingRule.from_dict(bad)


def test_the_approximation_matches_statsmodels_and_falls_short_of_its_power():
    n = approximate_episodes(0.75, delta=0.05, alpha=0.05, power=0.8)
    effect = proportion_effectsize(0.75, 0.70)
    solved = NormalIndPower().solve_power(effect, None, 0.05, 0.8, ratio=0, alternative="larger")
    assert n == math.ceil(solved) == 493
    # Textbook one-sample formula on the arcsine scale: n = ((z_a + z_b) / h)^2.
    assert n == math.ceil(((1.6448536269514722 + 0.8416212335729143) / effect) ** 2)
    # v8's numbers: 542 asked for, 17 seeds x 32 tasks = 544 played, exact power 0.782 < 0.8
    assert approximate_episodes(0.70, 0.05) == 542
    assert confirmation_power(0.70, 544, 0.70) == pytest.approx(0.782, abs=5e-4)


def test_confirmatory_episodes_give_the_exact_power_at_the_n_played():
    for threshold, step, null in ((0.75, 1, NULLS[0]), (0.70, 32, NULLS[0]), (0.70, 32, NULLS[1])):
        n = confirmatory_episodes(threshold, 0.05, 0.05, 0.8, step, null)
        low, high = confirmation_rates(threshold, 0.05, null)
        assert n % step == 0
        # the exact power at n, from scipy's binomial test directly (no project code)
        k = next(k for k in range(n + 1) if binomtest(k, n, low, "greater").pvalue <= 0.05)
        assert float(binom.sf(k - 1, n, high)) >= 0.8
        assert confirmation_power(high, n, threshold, 0.05, 0.05, null) >= 0.8
        assert confirmation_power(low, n, threshold, 0.05, 0.05, null) <= 0.05
        # and one seed fewer falls short
        assert confirmation_power(high, n - step, threshold, 0.05, 0.05, null) < 0.8
    assert confirmatory_episodes(0.70, 0.05, step=32) == 576  # 18 seeds of 32: power 0.811
    assert confirmatory_episodes(0.75, delta=0.03) > confirmatory_episodes(0.75, delta=0.1)


def test_the_null_is_stated_and_a_checkpoint_just_under_the_bar_is_rarely_confirmed_at_it():
    n = confirmatory_episodes(0.70, 0.05, step=32)
    # v8's null (0.65): a checkpoint truly at 0.68 is confirmed 44 % of the time at 576
    assert confirmation_power(0.68, n, 0.70) == pytest.approx(0.437, abs=1e-3)
    assert "not a rate between 0.65 and 0.7" in null_statement(0.70, 0.05)
    m = confirmatory_episodes(0.70, 0.05, step=32, null="threshold")
    assert confirmation_power(0.68, m, 0.70, null="threshold") < 0.01
    assert confirmation_power(0.70, m, 0.70, null="threshold") <= 0.05
    assert "the threshold itself" in null_statement(0.70, 0.05, "threshold")
    with pytest.raises(ValueError):
        confirmation_rates(0.98, 0.05, "threshold")  # no room above the bar


def test_false_reached_rate_of_the_registered_analysis():
    """v8's analysis (lower_bound 0.95, 128 episodes, 4 looks after the warm start, confirmation
    at 576 episodes against 0.65): a flat policy just under the bar is 'reached' far less often
    than the crossing alone accepts it, and the product is what simulation gives."""
    rule = {"rule": "lower_bound", "confidence": 0.95}
    n = confirmatory_episodes(0.70, 0.05, step=32)
    # confirm() judged once per possible count, then looked up
    verdicts = np.array([confirm(k, n, 0.70).verdict == "confirmed" for k in range(n + 1)])
    for rate in (0.65, 0.69, 0.70):
        crossed = crossing_probability(rate, 0.70, 128, 4, rule, SIMULATIONS)
        reached = reached_probability(rate, 0.70, 128, 4, rule, n, 0.05, 0.05)
        assert reached == pytest.approx(crossed * confirmation_power(rate, n, 0.70))
        # simulated end to end: crossing draws, then fresh confirmation draws
        rng = np.random.default_rng(1)
        table = [wilson_lower_bound(k, 128) >= 0.70 for k in range(129)]
        crossed_sim = np.array(table)[rng.binomial(128, rate, (SIMULATIONS, 4))].any(axis=1)
        confirmed_sim = verdicts[rng.binomial(n, rate, SIMULATIONS)]
        simulated = float(np.mean(crossed_sim & confirmed_sim))
        assert abs(simulated - reached) < mc_error(reached), (rate, simulated, reached)
    assert reached_probability(0.69, 0.70, 128, 4, rule, n) < 0.75 * crossing_probability(
        0.69, 0.70, 128, 4, rule
    )
    assert reached_probability(0.69, 0.70, 128, 4, rule, n, null="threshold") < 0.005


def test_confirm():
    yes = confirm(180, 200, 0.75, delta=0.05, alpha=0.05)
    assert yes.verdict == "confirmed"
    assert yes.p_value == pytest.approx(float(binom.sf(179, 200, 0.70)))
    assert yes.lower_bound > 0.70
    no = confirm(150, 200, 0.75)
    assert no.verdict == "not confirmed"
    assert no.p_value == pytest.approx(float(binom.sf(149, 200, 0.70)))  # 0.070
    assert no.lower_bound < 0.70
    assert no.to_dict()["null_rate"] == pytest.approx(0.70)
