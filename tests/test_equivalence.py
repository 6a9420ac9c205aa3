"""Learning-curve equivalence (simultaneous band, TOST-like verdicts), margin rule, x-axis ratio."""

from __future__ import annotations

import time

import pytest

from envab.analysis.equivalence import (
    check_margin,
    convergence_ratio,
    curve_equivalence,
    margin_for,
)

THRESHOLD, WARM_START = 0.75, 0.625  # preregistration/target.yaml and its measured warm start
MARGIN = margin_for(THRESHOLD, WARM_START, 0.5)  # 0.0625


def curve(rates: dict[int, float], tasks: int = 40, episodes: int = 5, seed=0):
    """One seed; the first round(rate * tasks) tasks succeed on every episode."""
    return {
        seed: {
            c: {f"t{i:03d}": [int(i < round(rate * tasks))] * episodes for i in range(tasks)}
            for c, rate in rates.items()
        }
    }


def test_curves_that_swap_are_not_equivalent():
    # mean difference over checkpoints is 0: a mean-difference check calls these "coincide"
    a = curve({256: 0.5, 512: 0.9})
    b = curve({256: 0.9, 512: 0.5})
    result = curve_equivalence(a, b, margin=MARGIN)
    assert [c.difference for c in result.checkpoints] == pytest.approx([-0.4, 0.4])
    assert result.verdict == "differ"
    assert result.excludes_zero_at == [256, 512]
    assert result.max_abs_difference == pytest.approx(0.4)


def paired_by_task(rates: list[float], tasks: int = 32, episodes: int = 2):
    """A learning curve and a flat never-learning curve at the warm start, paired by task.

    Warm start 0.625 of 64 episodes: tasks 0..19 succeed on both episodes, 20..31 fail on both.
    The flat curve keeps the warm start's outcomes at every checkpoint; the learning curve flips
    the warm start's first k failures (task by task: both episodes of a task, then the next) to
    successes, k = round(rate * 64) - 40. Flipping whole tasks is the less favourable pairing
    for "differ" (more between-task variance than one flip per task).
    """
    warm = {f"t{i:02d}": [int(i < 20)] * episodes for i in range(tasks)}
    failures = [(t, e) for t in sorted(warm) for e in range(episodes) if not warm[t][e]]
    start = sum(map(sum, warm.values()))
    learning, flat = {}, {}
    for j, rate in enumerate(rates):
        at = 256 * (j + 1)
        outcomes = {t: list(v) for t, v in warm.items()}
        for t, e in failures[: round(rate * tasks * episodes) - start]:
            outcomes[t][e] = 1
        learning[at] = outcomes
        flat[at] = {t: list(v) for t, v in warm.items()}
    return {0: learning}, {0: flat}


def test_a_learning_curve_differs_from_a_flat_never_learning_curve():
    learning, flat = paired_by_task([0.672, 0.750, 0.781, 0.734, 0.703])
    result = curve_equivalence(learning, flat, margin=MARGIN)
    assert [c.rate_b for c in result.checkpoints] == [0.625] * 5
    assert [c.rate_a for c in result.checkpoints] == pytest.approx(
        [43 / 64, 48 / 64, 50 / 64, 47 / 64, 45 / 64]
    )
    assert [c.episodes_a for c in result.checkpoints] == [64] * 5
    assert result.verdict == "differ"
    assert result.max_at == 768 and result.max_abs_difference == pytest.approx(10 / 64)
    assert result.max_abs_difference > result.half_width
    assert result.tasks == 32 and result.seeds_a == [0]


def test_identical_arms_are_equivalent_with_a_zero_band():
    learning, _ = paired_by_task([0.672, 0.750, 0.781, 0.734, 0.703])
    result = curve_equivalence(learning, learning, margin=MARGIN)
    assert result.verdict == "equivalent"
    assert result.half_width == 0.0  # every resample moves both arms alike
    assert result.max_abs_difference == 0.0


def test_arms_a_little_apart_with_many_tasks_are_equivalent():
    a = curve({256: 0.30, 512: 0.50, 768: 0.70}, tasks=400, episodes=2)
    b = curve({256: 0.31, 512: 0.50, 768: 0.69}, tasks=400, episodes=2)
    result = curve_equivalence(a, b, margin=MARGIN)
    assert result.verdict == "equivalent"
    assert result.max_abs_difference + result.half_width <= MARGIN
    assert 0 < result.half_width < MARGIN


def test_too_few_tasks_is_inconclusive_not_rounded():
    a = curve({256: 0.5, 512: 0.625}, tasks=8, episodes=1)
    b = curve({256: 0.5, 512: 0.5}, tasks=8, episodes=1)
    result = curve_equivalence(a, b, margin=MARGIN)
    assert result.verdict == "inconclusive"
    assert result.max_abs_difference == pytest.approx(0.125)
    assert result.half_width >= 0.125 and result.max_abs_difference + result.half_width > MARGIN


def test_one_task_one_seed_has_a_single_resample_and_no_band():
    # hand-checkable: every resample redraws the only seed and the only task, so d* = d
    a = {7: {256: {"only": [1, 1]}, 512: {"only": [1, 0]}}}
    b = {7: {256: {"only": [0, 1]}, 512: {"only": [1, 0]}}}
    result = curve_equivalence(a, b, margin=MARGIN, samples=50)
    assert result.half_width == 0.0
    assert [c.difference for c in result.checkpoints] == [0.5, 0.0]
    assert [c.band for c in result.checkpoints] == [(0.5, 0.5), (0.0, 0.0)]
    assert result.verdict == "differ" and result.excludes_zero_at == [256]
    same = curve_equivalence(b, b, margin=MARGIN, samples=50)
    assert same.verdict == "equivalent" and same.half_width == 0.0


def seeded(seed_rates: dict, shift: float, tasks: int = 40):
    """Arms with large seed effects (the seed's rate) and a small, seed-independent arm shift."""
    return {
        s: {c: curve({c: rate + shift}, tasks=tasks, episodes=2)[0][c] for c in (256, 512)}
        for s, rate in seed_rates.items()
    }


def test_paired_seeds_are_resampled_jointly():
    # Seed effects (0.1 / 0.5 / 0.9) are large but identical across arms; the arm shift is 0.05.
    # Jointly resampled seeds move both arms alike, so the seed effect cancels in d* and the band
    # is narrow. The same numbers under unrelated seed ids are resampled independently: a resample
    # can give arm A the 0.9 seed and arm B the 0.1 seed, and the band is wide.
    a = seeded({0: 0.10, 1: 0.50, 2: 0.90}, shift=0.05)
    b = seeded({0: 0.10, 1: 0.50, 2: 0.90}, shift=0.0)
    paired = curve_equivalence(a, b, margin=MARGIN)
    b_unpaired = {s + 10: v for s, v in b.items()}
    unpaired = curve_equivalence(a, b_unpaired, margin=MARGIN)
    assert paired.paired_seeds and not unpaired.paired_seeds
    assert [c.difference for c in paired.checkpoints] == pytest.approx([0.05, 0.05])
    assert paired.half_width < 0.06
    assert unpaired.half_width > 0.3
    assert paired.verdict == "differ" and unpaired.verdict == "inconclusive"


def test_the_band_is_simultaneous_over_checkpoints():
    # Same seed, same tasks: the same resamples, so the max over all checkpoints is at least the
    # max over any one of them, draw by draw; q for the whole curve is at least each single q.
    learning, flat = paired_by_task([0.672, 0.750, 0.781, 0.734, 0.703])
    whole = curve_equivalence(learning, flat, margin=MARGIN).half_width
    singles = []
    for c in learning[0]:
        one = curve_equivalence({0: {c: learning[0][c]}}, {0: {c: flat[0][c]}}, margin=MARGIN)
        singles.append(one.half_width)
    assert all(whole >= q for q in singles)
    assert whole > min(singles)


def test_unmatched_checkpoints_and_partial_tasks_are_dropped_and_reported():
    a = {0: {256: {"x": [1], "y": [0]}, 512: {"x": [1], "y": [1]}}, 1: {256: {"x": [0]}}}
    b = {0: {256: {"x": [1], "y": [1]}}, 1: {256: {"x": [1], "y": [0]}, 768: {"x": [1]}}}
    result = curve_equivalence(a, b, margin=MARGIN)
    assert result.matched_checkpoints == [256]
    assert result.unmatched_checkpoints == [512, 768]
    assert result.tasks == 1 and result.dropped_tasks == ["y"]
    assert result.to_dict()["verdict"] == result.verdict


def test_refuses_inputs_it_cannot_compare():
    a = {0: {256: {"x": [1]}}}
    with pytest.raises(ValueError, match="matched"):
        curve_equivalence(a, {0: {512: {"x": [1]}}}, margin=MARGIN)
    with pytest.raises(ValueError, match="held-out task"):
        curve_equivalence(a, {0: {256: {"y": [1]}}}, margin=MARGIN)
    with pytest.raises(ValueError, match="0/1"):
        curve_equivalence(a, {0: {256: {"x": [2]}}}, margin=MARGIN)


def test_fast_enough_for_five_checkpoints_32_tasks_3_seeds():
    arm = {
        s: {
            256 * c: {f"t{t}": [(s + c + t) % 2, (s * t + c) % 3 == 0] for t in range(32)}
            for c in range(5)
        }
        for s in range(3)
    }
    start = time.perf_counter()
    curve_equivalence(arm, arm, margin=MARGIN, samples=2000)
    assert time.perf_counter() - start < 1.0


def test_margin_rule_refuses_the_old_margin():
    assert MARGIN == 0.0625  # 0.5 * 0.125, exact in binary
    with pytest.raises(ValueError, match="not narrower than the gain"):
        check_margin(0.15, THRESHOLD, WARM_START)
    with pytest.raises(ValueError, match="not narrower than the gain"):
        check_margin(0.125, THRESHOLD, WARM_START)  # equal to the gain: also refused
    with pytest.raises(ValueError, match="not narrower than the gain"):
        margin_for(THRESHOLD, WARM_START, 0.15 / 0.125)  # 0.15 as a fraction of the gain
    assert check_margin(0.0625, THRESHOLD, WARM_START) == 0.0625
    with pytest.raises(ValueError, match="no gain"):
        check_margin(0.05, 0.6, WARM_START)


def test_convergence_ratio():
    within = convergence_ratio(1024, 768, band=1.5)
    assert within.verdict == "within band" and within.ratio == pytest.approx(4 / 3)
    assert convergence_ratio(768, 1024, band=1.5).verdict == "within band"
    assert convergence_ratio(512, 768, band=1.5).verdict == "within band"  # exactly 1/band
    assert convergence_ratio(1536, 1024, band=1.5).verdict == "within band"  # exactly band
    outside = convergence_ratio(2048, 1024, band=1.5)
    assert outside.verdict == "outside band" and outside.ratio == 2.0
    assert convergence_ratio(256, 1024, band=1.5).verdict == "outside band"
    one = convergence_ratio(None, 1024, band=1.5)
    assert one.verdict == "not reached by one arm" and one.not_reached == ["candidate"]
    assert one.ratio is None
    assert convergence_ratio(1024, None, band=1.5).not_reached == ["baseline"]
    assert convergence_ratio(None, None, band=1.5).verdict == "not reached by either arm"
    with pytest.raises(ValueError, match="band"):
        convergence_ratio(1024, 1024, band=0.8)
    with pytest.raises(ValueError, match="before training"):
        convergence_ratio(0, 1024, band=1.5)
