"""When has a run crossed the target? A pre-registered rule that noise alone rarely trips.

Held-out success at a checkpoint is a sample: with 64 episodes its standard error near 0.75 is
about 0.054. The old rule ("first_crossing": the first checkpoint whose sampled rate is at or
above the threshold) therefore accepts a flat policy at a true 0.70 against a 0.75 target with
probability ~0.23 at one look and ~0.73 over five looks. Time-to-target would then measure the
evaluation noise, not the arm. Two rules that noise rarely trips:

- ``lower_bound``: the first checkpoint whose one-sided Wilson lower confidence bound on held-out
  success is at or above the threshold (the evidence, not the point estimate, clears the bar);
- ``consecutive``: the first checkpoint that starts a run of k consecutive scored checkpoints whose
  sampled rates are all at or above the threshold (the crossing is dated at the first of them).

An unscored checkpoint (no valid rate) is never accepted and breaks a consecutive run. The rule is
pre-registered (a section of target.yaml), so it cannot be chosen after seeing the curves.

``false_crossing_probability`` / ``crossing_power`` simulate a flat policy to show what a rule
costs in both directions. ``confirmatory_episodes`` / ``confirm`` size and judge a fresh held-out
evaluation of the accepted checkpoint, which separates the threshold from threshold - delta.

The binomial model treats a checkpoint's episodes as independent draws at one rate. For a fixed
held-out task set with per-task rates p_i, the sampling variance sum p_i(1-p_i)/n^2 is at most the
binomial one at the mean rate, so the bounds here err on the safe (wider) side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.stats import binom, binomtest
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_effectsize

from envab.analysis.statistics import wilson_interval
from envab.preregistration import KINDS, CrossingRule  # noqa: F401  (the rule is pre-registered)


def wilson_lower_bound(successes: int, episodes: int, confidence: float = 0.95) -> float:
    """One-sided Wilson lower bound at level `confidence`: the lower end of the two-sided interval
    at 2*confidence - 1 (both put 1 - confidence in the lower tail: z = Phi^-1(confidence))."""
    return wilson_interval(successes, episodes, 2 * confidence - 1)[0]


def _passes(successes: int, episodes: int, threshold: float, rule: CrossingRule) -> bool:
    """Does one scored checkpoint clear the bar alone (lower_bound: its bound; else its rate)?"""
    if rule.kind == "lower_bound":
        return wilson_lower_bound(successes, episodes, rule.confidence) >= threshold
    return successes / episodes >= threshold  # as time_to_target compares success_rate


def _score(point) -> tuple[int, int] | None:
    """(successes, episodes) of a point, or None when it is unscored."""
    if point is None:
        return None
    if isinstance(point, Mapping):
        if not point.get("scored", True):
            return None
        successes, episodes = point.get("successes"), point.get("episodes")
    else:
        _, successes, episodes = point
    if successes is None or not episodes:
        return None
    if not 0 <= successes <= episodes:
        raise ValueError(f"successes {successes} outside [0, {episodes}]")
    return int(successes), int(episodes)


def accepted_crossing(
    points: Sequence, threshold: float, rule: CrossingRule | Mapping
) -> int | None:
    """Index into `points` of the checkpoint the rule accepts as the crossing, or None.

    `points` are the run's checkpoints in order of valid trajectories consumed, each either
    - an evaluation record (eval/<checkpoint>.json: "scored", "successes", "episodes"), or None
      when the checkpoint has no evaluation; or
    - a tuple (valid_trajectories, successes, episodes), successes/episodes None when unscored;
      the valid_trajectories must increase (the order is the time axis, so it is checked).
    An unscored point is never accepted and breaks a consecutive run. The index, not a name, is
    returned so the caller maps it back onto its own ordered checkpoint list.
    """
    rule = CrossingRule.from_dict(rule)
    counts = [t[0] for t in points if t is not None and not isinstance(t, Mapping)]
    if any(b <= a for a, b in zip(counts, counts[1:], strict=False)):
        raise ValueError("points must be ordered by increasing valid_trajectories")
    need = rule.consecutive if rule.kind == "consecutive" else 1
    run_start, run_length = None, 0
    for index, point in enumerate(points):
        score = _score(point)
        if score is None or not _passes(*score, threshold, rule):
            run_start, run_length = None, 0
            continue
        if run_start is None:
            run_start = index
        run_length += 1
        if run_length >= need:
            return run_start
    return None


def crossing_probability(
    true_rate: float,
    threshold: float,
    episodes: int,
    looks: int,
    rule: CrossingRule | Mapping,
    simulations: int = 20000,
    seed: int = 0,
) -> float:
    """Monte Carlo probability that `rule` accepts a crossing for a flat policy at `true_rate`
    evaluated `looks` times with `episodes` fresh episodes each. Below the threshold it is the
    false-crossing rate; above it, the power. Per-look acceptance depends only on the success
    count, so it is tabulated once with the same code accepted_crossing uses, then looked up."""
    rule = CrossingRule.from_dict(rule)
    if episodes < 1 or looks < 0 or simulations < 1:
        raise ValueError("episodes and simulations must be >= 1, looks >= 0")
    need = rule.consecutive if rule.kind == "consecutive" else 1
    if looks < need:
        return 0.0
    table = np.array([_passes(s, episodes, threshold, rule) for s in range(episodes + 1)])
    draws = np.random.default_rng(seed).binomial(episodes, true_rate, size=(simulations, looks))
    passes = table[draws]
    accepted = sliding_window_view(passes, need, axis=1).all(axis=2).any(axis=1)
    return float(accepted.mean())


# The same probability, named for the side of the threshold it is asked about: below it, what
# noise alone buys (a false crossing); above it, what a strict rule costs a real crossing (power).
false_crossing_probability = crossing_probability
crossing_power = crossing_probability


NULLS = ("threshold_minus_delta", "threshold")  # what a confirmation's null may be


def confirmation_rates(
    threshold: float, delta: float, null: str = "threshold_minus_delta"
) -> tuple[float, float]:
    """(null rate, alternative rate) of the confirmatory test. "threshold_minus_delta" (how
    experiments up to embedded-default-v8 registered it): H0 p <= threshold - delta, powered at
    p = threshold, so "confirmed" rules out threshold - delta, not a rate just under the
    threshold. "threshold": H0 p <= threshold itself, powered at threshold + delta, so
    "confirmed" is evidence that the checkpoint is at or above the target."""
    if null not in NULLS:
        raise ValueError(f"confirmation null {null!r}: expected one of {', '.join(NULLS)}")
    rates = (threshold - delta, threshold) if null == NULLS[0] else (threshold, threshold + delta)
    if not (delta > 0 and 0 < rates[0] < rates[1] <= 1):
        raise ValueError(f"need 0 < null < alternative <= 1, got {rates} (delta {delta})")
    return rates


def null_statement(threshold: float, delta: float, null: str = "threshold_minus_delta") -> str:
    """The confirmation's null in words, for the outcome."""
    low, high = confirmation_rates(threshold, delta, null)
    if null == "threshold":
        return f"H0 p <= {low:g} (the threshold itself), powered at {high:g}"
    return (
        f"H0 p <= {low:g} (threshold - delta), powered at the threshold {high:g}: it rules out "
        f"{low:g}, not a rate between {low:g} and {high:g}"
    )


def approximate_episodes(
    threshold: float, delta: float = 0.05, alpha: float = 0.05, power: float = 0.8
) -> int:
    """The normal (arcsine) approximation to the episodes a one-sided one-sample test of
    H0: p <= threshold - delta needs against p = threshold. Kept for comparison only: at 0.70
    against 0.65 it asks for 542, and the 544 a confirmation then plays (17 seeds x 32 tasks) give
    the exact test power 0.782, not 0.8. confirmatory_episodes sizes by the exact power instead.

    One sample, so NormalIndPower with ratio=0 (variance 1/nobs1); the effect size is Cohen's h,
    proportion_effectsize(threshold, threshold - delta)."""
    null = threshold - delta
    if not (delta > 0 and 0 < null < threshold <= 1):
        raise ValueError(f"need 0 < threshold - delta < threshold <= 1, got {threshold}, {delta}")
    effect = proportion_effectsize(threshold, null)
    n = NormalIndPower().solve_power(
        effect_size=effect, nobs1=None, alpha=alpha, power=power, ratio=0, alternative="larger"
    )
    return math.ceil(n)


def confirmatory_episodes(
    threshold: float,
    delta: float = 0.05,
    alpha: float = 0.05,
    power: float = 0.8,
    step: int = 1,
    null: str = "threshold_minus_delta",
) -> int:
    """The fewest fresh episodes, a multiple of `step` (the episodes one fresh evaluation seed
    plays: held-out tasks x episodes per task), at which the exact one-sided binomial test
    confirm() runs has at least `power` against the alternative (confirmation_rates).

    Exact, because the binomial test's power is a sawtooth in n: the normal approximation's n,
    rounded up to whole seeds, can fall below the power asked for (544 episodes at 0.70 against
    0.65: 0.782). Searching the multiples of `step` checks the n that is actually played."""
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    low, high = confirmation_rates(threshold, delta, null)
    # the approximation (with its p-dependent variance it can err either way) bounds the search
    start = max(1, approximate_episodes(high, high - low, alpha, power) // (2 * step))
    for blocks in range(start, 100 * start + 1000):
        n = blocks * step
        if _exact_power(high, n, low, alpha) >= power:
            return n
    raise ValueError(f"no confirmation size below {n} episodes reaches power {power}")


def _exact_power(true_rate: float, episodes: int, null_rate: float, alpha: float) -> float:
    """P(the exact one-sided binomial test at `null_rate` rejects | true_rate)."""
    k = np.arange(episodes + 2)
    critical = k[binom.sf(k - 1, episodes, null_rate) <= alpha][0]
    return float(binom.sf(critical - 1, episodes, true_rate))


@dataclass(frozen=True)
class Confirmation:
    verdict: str  # confirmed | not confirmed
    successes: int
    episodes: int
    success_rate: float
    threshold: float
    null_rate: float  # threshold - delta: the rate the data must rule out
    p_value: float  # exact one-sided binomial P(X >= successes | null_rate)
    lower_bound: float  # one-sided Clopper-Pearson lower bound at 1 - alpha
    alpha: float

    def to_dict(self) -> dict:
        return asdict(self)


def confirm(
    successes: int,
    episodes: int,
    threshold: float,
    delta: float = 0.05,
    alpha: float = 0.05,
    null: str = "threshold_minus_delta",
) -> Confirmation:
    """Judge a fresh held-out evaluation of the accepted checkpoint: "confirmed" when the exact
    one-sided binomial test rejects p <= the null rate (confirmation_rates: threshold - delta, or
    the threshold itself) at level alpha (equivalently the one-sided Clopper-Pearson lower bound
    at 1 - alpha exceeds it). Exact, so the false-confirmation rate at the null rate is at most
    alpha at any n. A crossing that is not confirmed is not reached (time_to_target)."""
    null, _ = confirmation_rates(threshold, delta, null)
    test = binomtest(successes, episodes, null, alternative="greater")
    low = float(test.proportion_ci(confidence_level=1 - alpha, method="exact").low)
    return Confirmation(
        verdict="confirmed" if test.pvalue <= alpha else "not confirmed",
        successes=successes,
        episodes=episodes,
        success_rate=successes / episodes,
        threshold=threshold,
        null_rate=null,
        p_value=float(test.pvalue),
        lower_bound=low,
        alpha=alpha,
    )


def confirmation_power(
    true_rate: float,
    episodes: int,
    threshold: float,
    delta: float = 0.05,
    alpha: float = 0.05,
    null: str = "threshold_minus_delta",
) -> float:
    """Exact probability that confirm() says "confirmed" for a policy at `true_rate` with
    `episodes` fresh episodes: the smallest success count k with P(X >= k | null rate) <= alpha
    is the critical value, and the power is P(X >= k | true_rate)."""
    null_rate, _ = confirmation_rates(threshold, delta, null)
    return _exact_power(true_rate, episodes, null_rate, alpha)


def reached_probability(
    true_rate: float,
    threshold: float,
    episodes: int,
    looks: int,
    rule: CrossingRule | Mapping,
    confirmation_episodes: int | None = None,
    delta: float = 0.05,
    alpha: float = 0.05,
    null: str = "threshold_minus_delta",
    simulations: int = 20000,
    seed: int = 0,
) -> float:
    """Probability that a flat policy at `true_rate` ends "reached": the rule accepts a crossing
    in `looks` looks and, when a confirmation is registered (`confirmation_episodes`), the fresh
    episodes confirm it. The confirmation plays episodes never seen by the crossing, so for a
    flat policy the two are independent and the probability is the product. Below the threshold
    it is the false-acceptance rate of the whole registered analysis."""
    crossed = crossing_probability(true_rate, threshold, episodes, looks, rule, simulations, seed)
    if confirmation_episodes is None:
        return crossed
    return crossed * confirmation_power(
        true_rate, confirmation_episodes, threshold, delta, alpha, null
    )
