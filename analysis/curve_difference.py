"""Do two arms' learning curves differ, with training seeds as the unit of replication?

The test the controls use where training is not bit-deterministic (analysis/controls.py): per
training seed both arms ran, d_s = the mean over the trained checkpoints of the difference in
held-out success (arm a - arm b, each pooled over the held-out tasks evaluated in every run), then
a two-sided one-sample t-test of mean 0 over the seeds (scipy's `ttest_1samp`). "differ" when its
p-value is at most alpha.

Why not `curve_equivalence`'s "differ" (analysis/equivalence.py): its band resamples 2-5 seeds
per arm, and with few seeds a percentile bootstrap underestimates the spread between seeds, so
its false "differ" rate on A/A pairs climbs above alpha once training noise dominates the
evaluation noise (bench/curve_calibration.py: 0.08-0.15 at 2-5 seeds). The t-test on per-seed
differences is exact for normal d_s whatever their variance, since it estimates that variance
from the seeds themselves. The held-out tasks are fixed and shared by both arms, so their
difficulty cancels within a seed; a run's luck on particular tasks is part of d_s and of its
variance. The warm start (0 valid trajectories) is left out: no run has trained there yet, so it
can only add evaluation noise. One number per seed cannot see curves that cross (mean 0); the
controls judge a known change, which moves a curve one way.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from scipy import stats

from envab.analysis.survival import MIN_FOR_TEST, NO_REPLICATION

Arm = Mapping[Hashable, Mapping[int, Mapping[str, Sequence[int]]]]


def seed_differences(arm_a: Arm, arm_b: Arm) -> tuple[list, list[int], dict]:
    """The seeds in both arms, the trained checkpoints every one of their runs has, and per
    seed the mean curve difference a - b over those checkpoints."""
    seeds = sorted(set(arm_a) & set(arm_b))
    if not seeds:
        raise ValueError("no training seed in both arms")
    runs = [arm[s] for arm in (arm_a, arm_b) for s in seeds]
    matched = sorted(set.intersection(*(set(run) for run in runs)))
    trained = [c for c in matched if c > 0] or matched
    if not trained:
        raise ValueError("no checkpoint at a matched number of valid trajectories in every run")
    cells = [run[c] for run in runs for c in trained]
    tasks = sorted(
        set.intersection(*({t for t, o in cell.items() if len(o) > 0} for cell in cells))
    )
    if not tasks:
        raise ValueError("no held-out task evaluated at every matched checkpoint in every run")

    def rate(cell) -> float:
        outcomes = [o for t in tasks for o in cell[t]]
        return sum(outcomes) / len(outcomes)

    differences = {
        s: float(np.mean([rate(arm_a[s][c]) - rate(arm_b[s][c]) for c in trained])) for s in seeds
    }
    return seeds, trained, differences


def paired_curve_test(arm_a: Arm, arm_b: Arm, alpha: float) -> dict:
    """The verdict ("differ" | "not shown to differ" | "no arm-level claim") with its numbers."""
    seeds, trained, differences = seed_differences(arm_a, arm_b)
    d = np.array([differences[s] for s in seeds])
    result = {
        "test": "paired t-test over seeds of the mean held-out success difference",
        "seeds": seeds,
        "checkpoints": trained,
        "seed_differences": differences,
        "mean_difference": float(d.mean()),
        "alpha": alpha,
        "p_value": None,
    }
    if len(seeds) < MIN_FOR_TEST:
        return {**result, "verdict": "no arm-level claim", "reason": NO_REPLICATION}
    # Every seed the same difference leaves no spread to test against: identical curves (a
    # replay) do not differ, a constant non-zero gap on every seed does.
    p = (1.0 if d[0] == 0 else 0.0) if np.ptp(d) == 0 else float(stats.ttest_1samp(d, 0.0).pvalue)
    return {**result, "p_value": p, "verdict": "differ" if p <= alpha else "not shown to differ"}
