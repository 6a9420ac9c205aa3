"""Time-to-target across seeds as censored data: hand-computed cases and the libraries' own."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from lifelines import KaplanMeierFitter
from lifelines.statistics import logrank_test
from rliable.metrics import probability_of_improvement as rliable_poi
from statsmodels.stats.power import TTestPower

from envab.analysis.survival import (
    SeedTime,
    _poi_vectorized,
    across_seeds,
    kaplan_meier,
    kaplan_meier_interval,
    logrank,
    paired_log_ratio,
    probability_of_improvement,
    restricted_mean,
    rmst,
    seeds_needed,
)

BUDGET = 1000.0


def arm(*times: float | None) -> list[SeedTime]:
    """Seeds 0, 1, ... in order; None = never reached (spent the whole budget)."""
    return [
        SeedTime(seed, t is not None, BUDGET if t is None else float(t))
        for seed, t in enumerate(times)
    ]


def curve(result: dict) -> dict[float, float]:
    return {row["time"]: row["not_reached"] for row in result["table"]}


# Kaplan–Meier


def test_kaplan_meier_by_hand_and_against_lifelines():
    runs = [
        SeedTime(0, True, 10),
        SeedTime(1, True, 20),
        SeedTime(2, False, 30),
        SeedTime(3, True, 40),
    ]
    km = kaplan_meier(runs)
    # at risk 4, 3, 2, 1: S = 3/4, 3/4 * 2/3, unchanged at the censoring, then 0
    assert curve(km) == pytest.approx({0.0: 1.0, 10.0: 0.75, 20.0: 0.5, 30.0: 0.5, 40.0: 0.0})
    assert km["median"] == 20.0 and km["median_note"] is None
    assert (km["reached"], km["censored"], km["seeds"]) == (3, 1, 4)
    ref = KaplanMeierFitter().fit([10, 20, 30, 40], [1, 1, 0, 1])
    assert list(curve(km).values()) == pytest.approx(ref.survival_function_.iloc[:, 0].tolist())
    assert km["median"] == ref.median_survival_time_


def test_never_reached_seed_is_censored_not_dropped():
    kept = arm(100, 200, None)
    dropped = arm(100, 200)
    km, km_dropped = kaplan_meier(kept), kaplan_meier(dropped)
    assert km["censored"] == 1 and km["reached"] == 2 and km["seeds"] == 3
    assert curve(km) == pytest.approx({0.0: 1.0, 100.0: 2 / 3, 200.0: 1 / 3, 1000.0: 1 / 3})
    # dropping the seed halves the median and more than halves the restricted mean
    assert km["median"] == 200.0 and km_dropped["median"] == 100.0
    # RMST by hand: area under S up to the budget = 100*1 + 100*2/3 + 800*1/3
    assert restricted_mean(kept, BUDGET) == pytest.approx(100 + 200 / 3 + 800 / 3)
    assert restricted_mean(dropped, BUDGET) == pytest.approx(100 + 50)


def test_median_not_reached_when_most_seeds_never_reach():
    km = kaplan_meier(arm(100, None, None))
    assert km["median"] is None and "not reached" in km["median_note"]


def test_rmst_by_hand_and_between_arms():
    runs = [
        SeedTime(0, True, 10),
        SeedTime(1, True, 20),
        SeedTime(2, False, 30),
        SeedTime(3, True, 40),
    ]
    # 10*1 + 10*0.75 + 20*0.5 (20..40) + 10*0 (40..50)
    assert restricted_mean(runs, 50) == pytest.approx(27.5)
    result = rmst(arm(100, 200, None), arm(100, 200), BUDGET, names=("base", "cand"))
    assert result["by_arm"] == pytest.approx({"base": 1300 / 3, "cand": 150.0})
    assert result["difference_b_minus_a"] == pytest.approx(150 - 1300 / 3)
    assert result["ratio_b_over_a"] == pytest.approx(150 / (1300 / 3))
    assert result["horizon"] == BUDGET


def test_interval_censored_median_is_the_turnbull_range():
    runs = [
        SeedTime(0, True, 10, lower=5),
        SeedTime(1, True, 20, lower=15),
        SeedTime(2, True, 30, lower=25),
        SeedTime(3, False, BUDGET),
    ]
    result = kaplan_meier_interval(runs)
    # two of four seeds surely reached by 20 and surely not by 15: the median lies in (15, 20]
    assert result["median"] == {"low": 15.0, "high": 20.0}
    assert (result["reached"], result["censored"], result["without_lower"]) == (3, 1, [])
    final = result["table"][-1]
    assert final["time"] == BUDGET and final["not_reached_upper"] == pytest.approx(0.25)


def test_interval_censoring_opens_the_left_end_at_shared_checkpoints():
    # seed 1 crossed at checkpoint 200; seed 0 was below target there: no mass can sit at 200 for
    # both, so half the seeds have surely reached by 200 and the median lies in (100, 200]
    runs = [SeedTime(0, True, 300, lower=200), SeedTime(1, True, 200, lower=100)]
    result = kaplan_meier_interval(runs)
    assert result["median"] == {"low": 100.0, "high": 200.0}
    assert all(float(row["time"]).is_integer() for row in result["table"])


def test_interval_censoring_without_lower_bound_spans_from_zero():
    result = kaplan_meier_interval([SeedTime(0, True, 100), SeedTime(1, False, BUDGET)])
    assert result["without_lower"] == [0]
    assert result["median"] == {"low": 0.0, "high": 100.0}
    assert kaplan_meier_interval(arm(None, None))["median"]["high"] is None


# log-rank


@pytest.mark.filterwarnings("ignore::pandas.errors.Pandas4Warning")  # the reference call's
def test_logrank_matches_lifelines_and_is_null_for_identical_arms():
    a, b = arm(100, 150, 300, None), arm(50, 80, 120, 200)
    ours = logrank(a, b)
    ref = logrank_test([100, 150, 300, BUDGET], [50, 80, 120, 200], [1, 1, 1, 0], [1, 1, 1, 1])
    assert ours["p_value"] == pytest.approx(ref.p_value)
    assert ours["statistic"] == pytest.approx(ref.test_statistic)
    assert ours["p_value"] < 0.5
    same = logrank(a, a)
    assert same["statistic"] == pytest.approx(0.0, abs=1e-12)
    assert same["p_value"] == pytest.approx(1.0)


# paired log ratio


def test_paired_log_ratio_by_hand_with_bootstrap_interval():
    result = paired_log_ratio(arm(100, 200, 400), arm(50, 100, 400), BUDGET)
    expected = (math.log(0.5) + math.log(0.5) + 0.0) / 3
    assert result["mean_log_ratio"] == pytest.approx(expected)
    assert result["geometric_mean_ratio"] == pytest.approx(math.exp(expected))
    assert result["pairs"] == 3 and result["estimate_is"].startswith("an estimate")
    low, high = result["interval"]
    assert low <= expected <= high
    # a percentile interval of means stays within the observed per-seed ratios
    assert math.log(0.5) - 1e-12 <= low < high <= 1e-12
    assert result["interval_ratio"] == pytest.approx([math.exp(low), math.exp(high)])
    assert "percentile" in result["interval_method"]


def test_paired_log_ratio_with_fewer_than_three_pairs_has_no_interval():
    result = paired_log_ratio(arm(100, 200), arm(50, 100), BUDGET)
    assert result["mean_log_ratio"] == pytest.approx(math.log(0.5))
    assert result["interval"] is None and result["interval_ratio"] is None
    assert "cannot give an interval" in result["interval_reason"]


def test_paired_log_ratio_censored_pairs_are_bounds():
    a, b = arm(100, 200, 400), arm(50, 100, None)
    result = paired_log_ratio(a, b, BUDGET)
    assert result["censored_pairs"] == {"b_censored": [2], "a_censored": [], "both_censored": []}
    assert result["log_ratios"][2] == {
        "seed": 2,
        "log_ratio": pytest.approx(math.log(BUDGET / 400)),
        "bound": "lower bound",
    }
    assert result["estimate_is"].startswith("a lower bound")
    flipped = paired_log_ratio(b, a, BUDGET)
    assert flipped["censored_pairs"]["a_censored"] == [2]
    assert flipped["estimate_is"].startswith("an upper bound")
    both = paired_log_ratio(arm(100, None, 300), arm(50, None, 600), BUDGET)
    assert both["censored_pairs"]["both_censored"] == [1]
    assert both["log_ratios"][1]["bound"] == "unknown"


def test_single_numbers_are_censored_at_the_budget():
    # a never-reached seed that stopped early still enters at the budget; a crossing past the
    # budget is censored at it: both tie with a never-reached seed on the other arm
    a = [SeedTime(0, False, 800.0), SeedTime(1, True, 1200.0)]
    b = arm(400, None)
    result = paired_log_ratio(a, b, BUDGET)
    assert result["log_ratios"][0]["log_ratio"] == pytest.approx(math.log(400 / BUDGET))
    assert result["log_ratios"][1] == {"seed": 1, "log_ratio": 0.0, "bound": "unknown"}
    assert probability_of_improvement(a, arm(None, None), BUDGET)["estimate"] == 0.5


def test_paired_log_ratio_pairs_by_seed_not_by_position():
    a = [SeedTime(7, True, 100.0), SeedTime(3, True, 400.0)]
    b = [SeedTime(3, True, 200.0), SeedTime(9, True, 50.0)]
    result = paired_log_ratio(a, b, BUDGET)
    assert result["pairs"] == 1 and result["unpaired_seeds"] == [7, 9]
    assert result["mean_log_ratio"] == pytest.approx(math.log(0.5))


# probability of improvement


def test_probability_of_improvement():
    # unpaired (Mann–Whitney over seeds): faster than every seed of the other arm gives 1
    slow, fast = arm(100, 200, 300, 400), arm(50, 60, 70, 90)
    result = probability_of_improvement(slow, fast, BUDGET, names=("slow", "fast"))
    assert (result["of"], result["over"]) == ("fast", "slow")
    assert result["estimate"] > 0.9
    low, high = result["interval"]
    assert low <= result["estimate"] <= high
    same = probability_of_improvement(slow, slow, BUDGET)
    assert same["estimate"] == 0.5
    # never-reached seeds rank below every reached one and tie with each other
    assert probability_of_improvement(arm(None, None), arm(900, None), BUDGET)["estimate"] == 0.75
    assert probability_of_improvement(arm(100, 200), arm(50, 100), BUDGET)["interval"] is None


def test_probability_of_improvement_needs_two_seeds_per_arm():
    result = probability_of_improvement(arm(100), arm(50, 60), BUDGET)
    assert result["estimate"] is None and "needs >= 2 seeds per arm" in result["reason"]


def test_vectorised_statistic_is_rliables():
    rng = np.random.default_rng(1)
    for _ in range(50):
        x = rng.integers(0, 4, size=rng.integers(2, 7)).astype(float)
        y = rng.integers(0, 4, size=rng.integers(2, 7)).astype(float)
        assert _poi_vectorized(x, y) == pytest.approx(rliable_poi(x[:, None], y[:, None]))


# power


def test_seeds_needed_matches_statsmodels():
    for sd in (0.2, 0.3, 0.5, 0.8):
        effect = math.log(1.5) / sd
        nobs = TTestPower().solve_power(effect_size=effect, alpha=0.05, power=0.8)
        assert seeds_needed(1.5, sd) == math.ceil(nobs)  # rounded up, never down
    assert seeds_needed(1.5, 0.5, alpha=0.01, power=0.9) > seeds_needed(1.5, 0.5)
    # the SD of log times within an arm means sqrt(2) times it for the ratio (no correlation)
    assert seeds_needed(1.5, sd_log_time=0.5) == seeds_needed(1.5, 0.5 * math.sqrt(2))


def test_larger_speedup_needs_fewer_seeds():
    needed = [seeds_needed(s, 0.3) for s in (1.1, 1.2, 1.5, 2.0, 3.0, 10.0, 1e6)]
    assert needed == sorted(needed, reverse=True) and needed[0] > needed[2] > needed[-1]
    assert needed[-1] == 2  # never below 2, even where statsmodels' solver gives NaN


def test_seeds_needed_rejects_nonsense():
    with pytest.raises(ValueError):
        seeds_needed(1.5)
    with pytest.raises(ValueError):
        seeds_needed(1.0, 0.3)
    with pytest.raises(ValueError):
        seeds_needed(1.5, 0.3, sd_log_time=0.3)


# the whole summary


def test_one_seed_per_arm_claims_nothing_about_variance():
    result = across_seeds(arm(100), arm(50), BUDGET)
    assert "single draw" in result["claim"]
    assert "claims nothing about variance" in result["claim"]
    # no replication: no p-value anywhere
    assert result["replicated"] is False
    assert result["logrank"]["p_value"] is None and result["paired_t"]["p_value"] is None
    assert "no replication, no arm-level claim" in result["claim"]
    assert result["paired_log_ratio"]["interval"] is None
    assert result["probability_of_improvement"]["estimate"] is None


def test_across_seeds_is_json_and_keeps_every_seed():
    a = [SeedTime(0, True, 100, lower=50), SeedTime(1, True, 300), SeedTime(2, False, BUDGET)]
    b = arm(60, 200, 500)
    result = across_seeds(a, b, BUDGET, names=("base", "cand"))
    assert json.loads(json.dumps(result, allow_nan=False)) == result
    assert set(result) == {
        "names",
        "budget",
        "kaplan_meier",
        "interval_censored",
        "replicated",
        "logrank",
        "paired_t",
        "rmst",
        "paired_log_ratio",
        "probability_of_improvement",
        "claim",
    }
    assert result["kaplan_meier"]["base"]["censored"] == 1
    assert result["interval_censored"]["base"]["without_lower"] == [1]
    assert result["paired_log_ratio"]["censored_pairs"]["a_censored"] == [2]
    assert "seed" in result["claim"] and "single draw" not in result["claim"]
    assert across_seeds(arm(100, 200), arm(50, 60), BUDGET)["interval_censored"] is None


def test_seed_time_validation():
    with pytest.raises(ValueError):
        SeedTime(0, True, 0.0)
    with pytest.raises(ValueError):
        SeedTime(0, False, BUDGET, lower=10.0)
    with pytest.raises(ValueError):
        SeedTime(0, True, 100.0, lower=100.0)
    with pytest.raises(ValueError):
        kaplan_meier([SeedTime(0, True, 1.0), SeedTime(0, True, 2.0)])


def test_every_statistic_censors_a_never_reached_seed_at_the_budget():
    """A run that stopped at its trajectory cap after 300 s never reached the target within the
    1000 s budget either: Kaplan–Meier, log-rank, RMST and the paired ratio all see it at 1000 s.
    Censored at what it spent, log-rank would call the arms alike (p 1.0 here: the capped seeds
    leave the risk set before the other arm's first event)."""
    reaching = arm(500, 550, 600, 650)
    capped = [SeedTime(s, False, 300.0 + 10 * s) for s in range(4)]
    result = across_seeds(reaching, capped, BUDGET, names=("fast", "capped"))
    assert result["kaplan_meier"]["capped"]["table"][-1]["time"] == BUDGET
    assert all(row["time"] in (0.0, BUDGET) for row in result["kaplan_meier"]["capped"]["table"])
    at_budget = [SeedTime(s, False, BUDGET) for s in range(4)]
    same = across_seeds(reaching, at_budget, BUDGET, names=("fast", "capped"))
    for key in ("logrank", "paired_t", "rmst", "paired_log_ratio", "kaplan_meier"):
        assert result[key] == same[key], key
    as_spent = logrank(reaching, capped)["p_value"]
    assert as_spent == 1.0 and result["logrank"]["p_value"] < 0.05, (as_spent, result["logrank"])


def test_paired_t_matches_scipy_and_needs_two_pairs():
    from scipy.stats import ttest_1samp

    from envab.analysis.survival import paired_t

    a, b = arm(100, 200, 400), arm(60, 150, 200)
    logs = [math.log(60 / 100), math.log(150 / 200), math.log(200 / 400)]
    ours = paired_t(a, b, BUDGET)
    ref = ttest_1samp(logs, 0.0)
    assert ours["p_value"] == pytest.approx(ref.pvalue) and ours["pairs"] == 3
    low, high = ref.confidence_interval(0.95)
    assert ours["interval_ratio"] == pytest.approx([math.exp(low), math.exp(high)])
    assert paired_t(arm(100), arm(50), BUDGET)["p_value"] is None


def test_a_seed_neither_arm_reached_is_left_out_of_the_paired_ratio_not_entered_as_one():
    from envab.analysis.survival import paired_t

    reached = [(s, 100.0 + 7 * s, 50.0 + 3 * s) for s in (1, 2, 3)]
    a = [SeedTime(s, True, ta) for s, ta, _ in reached]
    b = [SeedTime(s, True, tb) for s, _, tb in reached]
    alone = paired_t(a, b, budget=1000.0)
    # two seeds that never reached on either arm: learning failures, not speed
    both = paired_t(
        a + [SeedTime(4, False, 1000.0), SeedTime(5, False, 1000.0)],
        b + [SeedTime(4, False, 1000.0), SeedTime(5, False, 1000.0)],
        budget=1000.0,
    )
    assert both["pairs"] == 3 and both["both_censored"] == 2
    assert both["ratio"] == pytest.approx(alone["ratio"])
    assert both["p_value"] == pytest.approx(alone["p_value"])
    # one arm reaching where the other did not still counts, at the budget (a bound)
    one = paired_t(a + [SeedTime(4, True, 300.0)], b + [SeedTime(4, False, 1000.0)], 1000.0)
    assert one["pairs"] == 4 and one["both_censored"] == 0
