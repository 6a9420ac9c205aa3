"""Intervals, the one t test of a mean of zero, and the learning-curve coincidence check, as
pure functions.

The coincidence check compares two arms' held-out success at matched numbers of valid
trajectories. Both arms are evaluated on the same held-out tasks per the frozen protocol, so the
comparison is paired by task: the bootstrap resamples held-out tasks (with all their episodes, at
every matched checkpoint) and recomputes the mean between-arm difference over the matched
checkpoints. Verdicts, against the pre-registered margin m:

- ``coincide``: the whole interval lies inside [-m, m];
- ``differ``: the whole interval lies outside [-m, m] on one side (the environment changed the
  data: a correctness finding that outranks any speed result);
- ``inconclusive``: neither — too few held-out episodes to tell at this margin. Said as such,
  never rounded to either side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from scipy import stats

#: What a record says where every value was the same (`t_test_of_zero`).
NO_SPREAD = "every value the same: the t test's limit as the spread goes to 0"


def t_test_of_zero(values, confidence: float = 0.95, alternative: str = "two-sided") -> dict:
    """scipy's one-sample t test of mean 0 over `values` (log ratios, differences), with its
    interval, and the one rule every endpoint follows where every value is the same: scipy's
    statistic is then undefined, and the answer is the test's limit as the spread goes to 0 -
    p 0 where the mean lies on the alternative's side of 0, p 1 where it does not (a mean of 0:
    identical arms do not differ), the interval the mean itself. Keys: p_value, statistic
    (None without spread), low, high (on the values' scale), no_spread (NO_SPREAD or None)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        raise ValueError("a t test needs at least two values")
    mean = float(x.mean())
    if np.ptp(x) == 0:
        sided = {"two-sided": mean != 0, "greater": mean > 0, "less": mean < 0}[alternative]
        return {
            "p_value": 0.0 if sided else 1.0,
            "statistic": None,
            "low": mean,
            "high": mean,
            "no_spread": NO_SPREAD,
        }
    test = stats.ttest_1samp(x, 0.0, alternative=alternative)
    ci = test.confidence_interval(confidence)
    return {
        "p_value": float(test.pvalue),
        "statistic": float(test.statistic),
        "low": float(ci.low),
        "high": float(ci.high),
        "no_spread": None,
    }


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when there is no data."""
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else centre - half  # exact ends: no 1e-17 residue
    high = 1.0 if successes == n else centre + half
    return low, high


@dataclass(frozen=True)
class Coincidence:
    verdict: str  # coincide | differ | inconclusive
    difference: float  # mean over matched checkpoints of (arm A - arm B) held-out success
    interval: tuple[float, float]
    margin: float
    matched_checkpoints: list[int]
    tasks: int

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "difference": self.difference,
            "interval": list(self.interval),
            "margin": self.margin,
            "matched_valid_trajectories": self.matched_checkpoints,
            "heldout_tasks": self.tasks,
        }


def coincidence(
    arm_a: dict[int, dict[str, list[int]]],
    arm_b: dict[int, dict[str, list[int]]],
    margin: float,
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Coincidence:
    """`arm_x[valid_trajectories][task_id]` is that checkpoint's list of episode outcomes (0/1).

    Only checkpoints present in both arms and tasks present at all of them are compared.
    """
    matched = sorted(set(arm_a) & set(arm_b))
    if not matched:
        raise ValueError("no checkpoint at a matched number of valid trajectories in both arms")
    tasks = sorted(set.intersection(*(set(arm_a[c]) & set(arm_b[c]) for c in matched)))
    if not tasks:
        raise ValueError("no held-out task evaluated at every matched checkpoint in both arms")

    def table(arm) -> tuple[np.ndarray, np.ndarray]:
        # successes and episodes per (checkpoint, task)
        s = np.array([[sum(arm[c][t]) for t in tasks] for c in matched], dtype=float)
        n = np.array([[len(arm[c][t]) for t in tasks] for c in matched], dtype=float)
        return s, n

    (sa, na), (sb, nb) = table(arm_a), table(arm_b)

    def mean_difference(columns) -> float:
        rate_a = sa[:, columns].sum(axis=1) / na[:, columns].sum(axis=1)
        rate_b = sb[:, columns].sum(axis=1) / nb[:, columns].sum(axis=1)
        return float(np.mean(rate_a - rate_b))

    everything = np.arange(len(tasks))
    point = mean_difference(everything)
    rng = np.random.default_rng(seed)
    draws = [mean_difference(rng.integers(0, len(tasks), len(tasks))) for _ in range(samples)]
    alpha = (1 - confidence) / 2
    low, high = (float(q) for q in np.quantile(draws, [alpha, 1 - alpha]))
    if -margin <= low and high <= margin:
        verdict = "coincide"
    elif low > margin or high < -margin:
        verdict = "differ"
    else:
        verdict = "inconclusive"
    return Coincidence(verdict, point, (low, high), margin, matched, len(tasks))
