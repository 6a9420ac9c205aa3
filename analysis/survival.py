"""Time-to-target across seeds, as censored data.

A seed that never reached the target is not missing: it tells us its time-to-target is beyond the
budget it spent. Dropping it (or averaging only the seeds that got there) makes a slow arm look
fast, i.e. survivorship bias. So every estimate here keeps such seeds, as right-censored
observations (Kaplan–Meier, log-rank, RMST) or entered at the budget where a single number per
seed is needed (the paired ratio, probability of improvement), with the direction of the resulting
bound said in the output.

One censoring rule for every statistic: `across_seeds` censors a never-reached seed at the budget
in the unit of the analysis (the horizon), whatever it spent. The event is "reached within the
registered budget"; a run that stopped at its trajectory cap after 700 of 1,200 s has not reached
it by 1,200 s either. Censoring it at 700 s for Kaplan–Meier and log-rank but at 1,200 s for RMST
and the paired ratio gave one analysis two answers (log-rank p 1.0 against 0.025 on one example).

No p-value without replication: with one seed per arm a test compares two draws, so the log-rank
and paired t-test are not run and the claim says so (NO_REPLICATION).

Library notes (lifelines 0.30.0 predates pandas 3; arch 7.2.0 under pandas 3):
- ``rliable.library`` cannot be imported: it imports ``arch``, whose ``deprecate_kwarg`` use
  breaks under pandas 3 (TypeError at import). The point estimate uses ``rliable.metrics``
  (imports only numpy/scipy); its interval uses ``scipy.stats.bootstrap`` with independent
  per-arm resampling, which is what rliable's ``StratifiedIndependentBootstrap`` does.
- ``lifelines.utils.restricted_mean_survival_time`` fails on an interval-censored fit (KeyError
  'NPMLE_estimate': it looks up a column the NPMLE table does not have), so RMST is given for the
  right-censored fit only.
- statsmodels' ``TTestPower`` gives NaN power at large effects (scipy's noncentral-t lower tail
  is NaN there), and then ``solve_power`` gives NaN; ``seeds_needed`` falls back to the upper
  tail alone (one-sided at alpha / 2), which is conservative.
- ``KaplanMeierFitter.median_survival_time_`` after ``fit_interval_censoring`` is one table time
  late on both envelopes; ``kaplan_meier_interval`` reads the median range from the table.
- ``lifelines.statistics.logrank_test`` emits pandas' Pandas4Warning (positional ``sum`` args);
  harmless, silenced around lifelines calls.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from lifelines import KaplanMeierFitter
from lifelines.statistics import logrank_test
from lifelines.utils import restricted_mean_survival_time
from pandas.errors import Pandas4Warning
from rliable.metrics import probability_of_improvement as _rliable_poi
from scipy.stats import bootstrap, mannwhitneyu
from statsmodels.stats.power import TTestPower
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from envab.analysis.statistics import t_test_of_zero

MIN_FOR_INTERVAL = 3  # fewer seeds (pairs) than this: a bootstrap over seeds gives no interval
MIN_FOR_TEST = 2  # fewer seeds per arm than this: no replication, so no p-value
NO_REPLICATION = "one seed per arm: no replication, no arm-level claim"


@dataclass(frozen=True)
class SeedTime:
    """One training seed's time-to-target on one arm.

    `time`: when `reached`, the time (wall-clock seconds or valid trajectories) at the accepted
    crossing; otherwise the budget spent (a right-censoring time). `lower`, for a reached seed:
    the time of the last checkpoint evaluated below target before the crossing, so the event lies
    in (lower, time]; None when unknown.
    """

    seed: int
    reached: bool
    time: float
    lower: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time) and self.time > 0):
            raise ValueError(f"seed {self.seed}: time must be finite and > 0, got {self.time}")
        if self.lower is not None:
            if not self.reached:
                raise ValueError(f"seed {self.seed}: a lower bound only applies to a reached seed")
            if not 0 <= self.lower < self.time:
                raise ValueError(f"seed {self.seed}: need 0 <= lower < time, got {self.lower}")


@contextmanager
def _quiet_lifelines() -> Iterator[None]:
    # lifelines 0.30 calls pandas reductions with positional args; pandas 3 warns about pandas 4.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=Pandas4Warning, module=r"lifelines\.")
        yield


def _check(runs: Sequence[SeedTime], what: str = "arm") -> None:
    if not runs:
        raise ValueError(f"{what}: no seeds")
    seeds = [r.seed for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{what}: a seed appears more than once: {seeds}")


def _fit(runs: Sequence[SeedTime]) -> KaplanMeierFitter:
    _check(runs)
    with _quiet_lifelines():
        return KaplanMeierFitter().fit(
            [r.time for r in runs], event_observed=[r.reached for r in runs]
        )


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def kaplan_meier(runs: Sequence[SeedTime]) -> dict:
    """Kaplan–Meier of "not yet reached"; a never-reached seed is right-censored at its `time`
    (the budget it spent), so it counts as at risk up to there instead of vanishing.

    Keys: seeds, reached, censored, table [{time, not_reached}], median (None when the curve never
    falls to 0.5: more than half the seeds may never reach the target), median_note.
    """
    kmf = _fit(runs)
    sf = kmf.survival_function_.iloc[:, 0]
    median = _finite(kmf.median_survival_time_)
    reached = sum(r.reached for r in runs)
    return {
        "seeds": len(runs),
        "reached": reached,
        "censored": len(runs) - reached,
        "table": [{"time": float(t), "not_reached": float(s)} for t, s in sf.items()],
        "median": median,
        "median_note": None if median is not None else "not reached: KM never drops to 0.5",
    }


def kaplan_meier_interval(runs: Sequence[SeedTime]) -> dict:
    """Turnbull/NPMLE (lifelines ``fit_interval_censoring``): a crossing is only known to lie
    between the last below-target checkpoint and the accepted one, so treating it as exact
    overstates precision.

    A reached seed's interval is (lower, time], or (0, time] when `lower` is None (nothing below
    target was evaluated before it); a never-reached seed is (time, inf). lifelines takes closed
    intervals; its documented way to open one end is to nudge it, done here by one float step, so
    one seed's crossing at a shared checkpoint does not overlap another's (that checkpoint, ...].
    The NPMLE puts each interval's mass somewhere inside it, so lifelines gives two envelopes and
    the median is a range. Keys: seeds, reached, censored, without_lower (reached seeds with lower
    None), table [{time, not_reached_upper, not_reached_lower}] as lifelines tabulates it (finite
    times; at an interval's open left end both envelopes show the survival before its mass, at its
    right end the upper one before and the lower one after, so a shared checkpoint can show
    twice), median {low, high}: the median lies in (low, high]; high None when the curve may
    never fall to 0.5.
    """
    _check(runs)
    lower = [float(r.lower or 0.0) if r.reached else float(r.time) for r in runs]
    upper = [float(r.time) if r.reached else np.inf for r in runs]
    opened = np.nextafter(lower, np.inf)
    nominal = dict(zip(opened.tolist(), lower, strict=True))  # report the times as given
    with _quiet_lifelines():
        kmf = KaplanMeierFitter().fit_interval_censoring(opened, upper)
    sf = kmf.survival_function_[np.isfinite(kmf.survival_function_.index)]
    up, low = sf.columns  # NPMLE_estimate_upper, NPMLE_estimate_lower
    # Not kmf.median_survival_time_: lifelines reads each envelope at the next table time after
    # its drop (for crossings in (5,10], (15,20], (25,30] and one never, it says 20 to 25, though
    # two of four seeds had surely reached by 20). In the lower column a Turnbull interval (l, r]
    # shows the survival before its mass at l and after it at r, so the median lies between the
    # last time above 0.5 and the first at or below it.
    last_above = float(sf.index[sf[low] > 0.5][-1])
    below = sf.index[sf[low] <= 0.5]
    reached = sum(r.reached for r in runs)
    return {
        "seeds": len(runs),
        "reached": reached,
        "censored": len(runs) - reached,
        "without_lower": [r.seed for r in runs if r.reached and r.lower is None],
        "table": [
            {
                "time": nominal.get(t, float(t)),
                "not_reached_upper": float(row[up]),
                "not_reached_lower": float(row[low]),
            }
            for t, row in sf.iterrows()
        ],
        "median": {
            "low": nominal.get(last_above, last_above),
            "high": float(below[0]) if len(below) else None,
        },
    }


def logrank(arm_a: Sequence[SeedTime], arm_b: Sequence[SeedTime]) -> dict:
    """Log-rank test of equal time-to-target distributions, censoring kept. Asymptotic
    chi-square: with a handful of seeds the p-value is approximate. Keys: statistic, p_value."""
    _check(arm_a, "arm a")
    _check(arm_b, "arm b")
    with _quiet_lifelines():
        result = logrank_test(
            [r.time for r in arm_a],
            [r.time for r in arm_b],
            event_observed_A=[r.reached for r in arm_a],
            event_observed_B=[r.reached for r in arm_b],
        )
    return {
        "test": "log-rank",
        "statistic": _finite(result.test_statistic),
        "p_value": _finite(result.p_value),
    }


def restricted_mean(runs: Sequence[SeedTime], horizon: float) -> float:
    """Restricted mean time-to-target up to `horizon`: the area under the KM curve. Unlike the
    mean of reached times it is defined when seeds never reach, and unlike the median it uses
    every seed's time."""
    kmf = _fit(runs)
    with _quiet_lifelines():
        return float(restricted_mean_survival_time(kmf, t=horizon))


def rmst(
    arm_a: Sequence[SeedTime],
    arm_b: Sequence[SeedTime],
    budget: float,
    names: tuple[str, str] = ("a", "b"),
) -> dict:
    """RMST up to the budget per arm, and b − a, b / a (below 0 / below 1: b faster).
    Keys: horizon, by_arm {name: rmst}, difference_b_minus_a, ratio_b_over_a."""
    a, b = restricted_mean(arm_a, budget), restricted_mean(arm_b, budget)
    return {
        "horizon": float(budget),
        "by_arm": {names[0]: a, names[1]: b},
        "difference_b_minus_a": b - a,
        "ratio_b_over_a": b / a,
    }


def _entered(run: SeedTime, budget: float) -> tuple[float, bool]:
    """One number per seed, censored at the budget: (time, censored). A never-reached seed (or
    one reached only past the budget) enters at the budget; one that stopped short of the budget
    too, which assumes it would not have reached by then."""
    if run.reached and run.time <= budget:
        return run.time, False
    return float(budget), True


def paired_log_ratio(
    arm_a: Sequence[SeedTime],
    arm_b: Sequence[SeedTime],
    budget: float,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
) -> dict:
    """Mean over shared seeds of log(time_b / time_a) (below 0: b faster), with a paired
    bootstrap interval over seeds.

    Pairing by seed removes what the seed does to both arms alike. A never-reached seed enters at
    the budget, so its pair's ratio is a bound: b censored → a lower bound (b's true time is
    later), a censored → an upper bound, both → says nothing. Keys: pairs, unpaired_seeds,
    log_ratios [{seed, log_ratio, bound}], mean_log_ratio, geometric_mean_ratio (exp of it),
    censored_pairs {b_censored, a_censored, both_censored} (seed lists), estimate_is,
    interval (None or [low, high] on the log scale), interval_ratio, interval_method,
    interval_reason.
    """
    _check(arm_a, "arm a")
    _check(arm_b, "arm b")
    by_b = {r.seed: r for r in arm_b}
    shared = sorted(r.seed for r in arm_a if r.seed in by_b)
    by_a = {r.seed: r for r in arm_a}
    unpaired = sorted(set(by_a) ^ set(by_b))
    rows, log_a, log_b = [], [], []
    censored = {"b_censored": [], "a_censored": [], "both_censored": []}
    for s in shared:
        (ta, ca), (tb, cb) = _entered(by_a[s], budget), _entered(by_b[s], budget)
        bound = {
            (False, False): "exact",
            (False, True): "lower bound",
            (True, False): "upper bound",
            (True, True): "unknown",
        }[(ca, cb)]
        key = {"lower bound": "b_censored", "upper bound": "a_censored", "unknown": "both_censored"}
        if bound in key:
            censored[key[bound]].append(s)
        log_a.append(math.log(ta))
        log_b.append(math.log(tb))
        rows.append({"seed": s, "log_ratio": log_b[-1] - log_a[-1], "bound": bound})
    result: dict = {
        "pairs": len(shared),
        "unpaired_seeds": unpaired,
        "log_ratios": rows,
        "censored_pairs": censored,
        "mean_log_ratio": None,
        "geometric_mean_ratio": None,
        "estimate_is": None,
        "interval": None,
        "interval_ratio": None,
        "interval_method": None,
        "interval_reason": None,
    }
    if not shared:
        result["interval_reason"] = "no seed appears on both arms: nothing to pair"
        return result
    mean = float(np.mean([r["log_ratio"] for r in rows]))
    result["mean_log_ratio"] = mean
    result["geometric_mean_ratio"] = math.exp(mean)
    kinds = {r["bound"] for r in rows} - {"exact"}
    if not kinds:
        result["estimate_is"] = "an estimate (no censored pair)"
    elif kinds == {"lower bound"}:
        result["estimate_is"] = (
            "a lower bound (b did not reach on some seeds; b is slower than shown)"
        )
    elif kinds == {"upper bound"}:
        result["estimate_is"] = (
            "an upper bound (a did not reach on some seeds; a is slower than shown)"
        )
    else:
        result["estimate_is"] = "neither bound nor estimate: censored pairs point both ways"
    if len(shared) < MIN_FOR_INTERVAL:
        result["interval_reason"] = (
            f"{len(shared)} paired seed(s): a bootstrap over fewer than {MIN_FOR_INTERVAL} seeds "
            "cannot give an interval"
        )
        return result
    # Percentile, not scipy's default BCa: with 3-10 seeds BCa's jackknife acceleration and bias
    # correction are themselves estimated from those few points (erratic, NaN when the resamples
    # are degenerate), and percentile is what rliable uses. Any bootstrap over this few seeds
    # under-covers; the interval is a description of seed spread, not a guarantee.
    ci = bootstrap(
        (np.array(log_a), np.array(log_b)),
        lambda x, y, axis: np.mean(y - x, axis=axis),
        paired=True,
        vectorized=True,
        method="percentile",
        confidence_level=confidence,
        n_resamples=n_resamples,
        rng=np.random.default_rng(seed),
    ).confidence_interval
    low, high = float(ci.low), float(ci.high)
    result["interval"] = [low, high]
    result["interval_ratio"] = [math.exp(low), math.exp(high)]
    result["interval_method"] = f"scipy paired bootstrap over seeds, percentile, {confidence:.0%}"
    return result


def paired_t(
    arm_a: Sequence[SeedTime], arm_b: Sequence[SeedTime], budget: float, confidence: float = 0.95
) -> dict:
    """Two-sided one-sample t-test (scipy) of mean log(time_b / time_a) = 0 over shared seeds,
    with its t interval on the ratio. A seed where one arm never reached is entered at the budget
    for that arm (as paired_log_ratio: a bound); a seed where neither reached says nothing about
    speed and is left out, counted in `both_censored`: entered as a ratio of 1 it would read a
    learning failure as "no speed difference". The analysis `seeds_needed` sizes. Keys: test,
    pairs, both_censored, p_value, statistic, mean_log_ratio, ratio, interval_ratio, reason (why
    no p-value)."""
    by_b = {r.seed: r for r in arm_b}
    shared = [(r, by_b[r.seed]) for r in arm_a if r.seed in by_b]
    informative = [
        (a, b) for a, b in shared if at_budget(a, budget).reached or at_budget(b, budget).reached
    ]
    logs = [
        math.log(_entered(b, budget)[0]) - math.log(_entered(a, budget)[0]) for a, b in informative
    ]
    result: dict = {
        "test": "paired t-test on log time ratio",
        "pairs": len(logs),
        "both_censored": len(shared) - len(informative),
        "p_value": None,
        "statistic": None,
        "mean_log_ratio": float(np.mean(logs)) if logs else None,
        "ratio": math.exp(float(np.mean(logs))) if logs else None,
        "interval_ratio": None,
        "reason": None,
    }
    if len(logs) < MIN_FOR_TEST:
        result["reason"] = f"{len(logs)} paired seed(s): {NO_REPLICATION}"
        return result
    test = t_test_of_zero(logs, confidence)  # every pair alike: the test's limit
    result.update(
        p_value=test["p_value"],
        statistic=test["statistic"],
        interval_ratio=[math.exp(test["low"]), math.exp(test["high"])],
    )
    if test["no_spread"]:
        result["no_spread"] = test["no_spread"]
    return result


def at_budget(run: SeedTime, budget: float) -> SeedTime:
    """The one censoring rule: a seed that never reached the target (or reached it only past the
    budget) is censored at the budget in this unit, whatever it spent."""
    if run.reached and run.time <= budget:
        return run
    return SeedTime(run.seed, False, float(budget))


def _poi_vectorized(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """rliable's one-task statistic, U / (n_x n_y) from Mann–Whitney, over a batch of resamples:
    calling rliable once per resample costs ~1 ms each (seconds per interval)."""
    u = mannwhitneyu(x, y, alternative="greater", axis=axis, method="asymptotic").statistic
    return u / (x.shape[axis] * y.shape[axis])


def probability_of_improvement(
    arm_a: Sequence[SeedTime],
    arm_b: Sequence[SeedTime],
    budget: float,
    names: tuple[str, str] = ("a", "b"),
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> dict:
    """rliable's probability that a random seed of b reaches the target sooner than a random
    seed of a (ties count half), on one "task". Score = −time, never-reached seeds at −budget
    (so they tie with each other and lose to every seed that reached). Needs >= 2 seeds per arm;
    the interval >= 3. Keys: of, over, estimate, interval, interval_method, reason.
    """
    _check(arm_a, "arm a")
    _check(arm_b, "arm b")
    result: dict = {
        "of": names[1],
        "over": names[0],
        "estimate": None,
        "interval": None,
        "interval_method": None,
        "reason": None,
    }
    fewest = min(len(arm_a), len(arm_b))
    if fewest < 2:
        result["reason"] = f"needs >= 2 seeds per arm, the smaller arm has {fewest}"
        return result
    score_a = np.array([-_entered(r, budget)[0] for r in arm_a])
    score_b = np.array([-_entered(r, budget)[0] for r in arm_b])
    result["estimate"] = float(_rliable_poi(score_b[:, None], score_a[:, None]))
    if fewest < MIN_FOR_INTERVAL:
        result["reason"] = f"no interval: fewer than {MIN_FOR_INTERVAL} seeds in an arm"
        return result
    # rliable.library (its bootstrap) does not import under pandas 3; scipy's unpaired bootstrap
    # resamples each arm independently, as rliable's StratifiedIndependentBootstrap does.
    ci = bootstrap(
        (score_b, score_a),
        _poi_vectorized,
        paired=False,
        vectorized=True,
        method="percentile",
        confidence_level=confidence,
        n_resamples=n_resamples,
        rng=np.random.default_rng(seed),
    ).confidence_interval
    result["interval"] = [float(ci.low), float(ci.high)]
    result["interval_method"] = (
        f"scipy bootstrap, each arm resampled independently, percentile, {confidence:.0%}"
    )
    return result


def seeds_needed(
    speedup: float,
    sd_log_ratio: float | None = None,
    *,
    sd_log_time: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int:
    """Seeds per arm for a two-sided paired t-test on per-seed log(time_b / time_a) to detect a
    `speedup`-fold difference (effect log(speedup) / sd) at `alpha` with `power`.

    Assumes the per-seed log ratios are roughly normal with the pilot's SD and every seed is run
    on both arms. Give either `sd_log_ratio` (the pilot SD of per-seed log ratios) or
    `sd_log_time` (the SD of log times within an arm); the latter is turned into sqrt(2) times
    it, i.e. assumes no within-seed correlation between arms (pairing can only lower it, so this
    errs towards more seeds). Ignores censoring: never-reached seeds lower the power. At least 2.
    """
    if (sd_log_ratio is None) == (sd_log_time is None):
        raise ValueError("give exactly one of sd_log_ratio and sd_log_time")
    sd = sd_log_ratio if sd_log_ratio is not None else math.sqrt(2) * sd_log_time
    if not sd > 0:
        raise ValueError(f"the pilot SD must be > 0, got {sd}")
    if not speedup > 1:
        raise ValueError(f"speedup must be > 1 (e.g. 1.5 for 1.5x), got {speedup}")
    effect = math.log(speedup) / sd
    analysis = TTestPower()
    if _two_sided_power(analysis, effect, 2, alpha) >= power:
        return 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # NaN is handled below
        nobs = analysis.solve_power(effect_size=effect, alpha=alpha, power=power)
        if not math.isfinite(nobs):
            nobs = analysis.solve_power(
                effect_size=effect, alpha=alpha / 2, power=power, alternative="larger"
            )
    if not math.isfinite(nobs):
        raise ValueError(f"statsmodels found no number of seeds for effect {effect:.3g}")
    return max(2, math.ceil(nobs))


def _two_sided_power(analysis: TTestPower, effect: float, nobs: int, alpha: float) -> float:
    """Two-sided power; where scipy's noncentral-t lower tail is NaN (large effects: it is ~0
    there), the upper tail alone, i.e. one-sided at alpha / 2, a conservative stand-in."""
    value = analysis.power(effect_size=effect, nobs=nobs, alpha=alpha)
    if math.isnan(value):
        value = analysis.power(effect_size=effect, nobs=nobs, alpha=alpha / 2, alternative="larger")
    return value


def _fmt(value: float | None) -> str:
    return "not computed" if value is None else f"{value:.3g}"


def _claim(result: dict, names: tuple[str, str]) -> str:
    a, b = names
    km = result["kaplan_meier"]
    counts = "; ".join(
        f"{n}: reached in {km[n]['reached']} of {km[n]['seeds']} seed(s)" for n in names
    )
    if min(km[a]["seeds"], km[b]["seeds"]) < MIN_FOR_TEST:
        return (
            f"{counts}. {NO_REPLICATION}: at least one arm has a single seed, a single draw, "
            "which claims nothing about variance across seeds, nor that the faster arm would "
            "stay faster on another seed; no p-value is computed."
        )
    r, lr, pr = result["rmst"], result["logrank"], result["paired_log_ratio"]
    text = (
        f"{counts}. Restricted mean time-to-target up to the budget {r['horizon']:g}: "
        f"{a} {r['by_arm'][a]:.4g}, {b} {r['by_arm'][b]:.4g} "
        f"({b}/{a} = {r['ratio_b_over_a']:.3g}); "
        f"log-rank p = {_fmt(lr['p_value'])}."
    )
    if pr["geometric_mean_ratio"] is not None:
        text += (
            f" Paired over {pr['pairs']} seed(s), geometric mean time ratio {b}/{a} = "
            f"{pr['geometric_mean_ratio']:.3g}, {pr['estimate_is']}"
        )
        if pr["interval_ratio"] is not None:
            low, high = pr["interval_ratio"]
            text += f", bootstrap interval [{low:.3g}, {high:.3g}]."
        else:
            text += f"; no interval: {pr['interval_reason']}."
    return text


def across_seeds(
    arm_a: list[SeedTime],
    arm_b: list[SeedTime],
    budget: float,
    names: tuple[str, str] = ("a", "b"),
) -> dict:
    """Every across-seed summary of time-to-target, JSON-serialisable, b compared with a.

    Keys: names, budget, replicated, kaplan_meier {name: ...}, interval_censored ({name: ...},
    or None when no seed has a lower bound), logrank, paired_t, rmst, paired_log_ratio,
    probability_of_improvement, claim. Every never-reached seed is censored at `budget`
    (at_budget), for every statistic alike.
    """
    if not budget > 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    if names[0] == names[1]:
        raise ValueError(f"the arms need distinct names, got {names}")
    arm_a = [at_budget(r, budget) for r in arm_a]
    arm_b = [at_budget(r, budget) for r in arm_b]
    replicated = min(len(arm_a), len(arm_b)) >= MIN_FOR_TEST
    a, b = names
    has_lower = any(r.lower is not None for r in [*arm_a, *arm_b])
    result = {
        "names": [a, b],
        "budget": float(budget),
        "kaplan_meier": {a: kaplan_meier(arm_a), b: kaplan_meier(arm_b)},
        "interval_censored": (
            {a: kaplan_meier_interval(arm_a), b: kaplan_meier_interval(arm_b)}
            if has_lower
            else None
        ),
        "replicated": replicated,
        "logrank": (
            logrank(arm_a, arm_b)
            if replicated
            else {"test": "log-rank", "statistic": None, "p_value": None, "reason": NO_REPLICATION}
        ),
        "paired_t": paired_t(arm_a, arm_b, budget),
        "rmst": rmst(arm_a, arm_b, budget, names),
        "paired_log_ratio": paired_log_ratio(arm_a, arm_b, budget),
        "probability_of_improvement": probability_of_improvement(arm_a, arm_b, budget, names),
    }
    result["claim"] = _claim(result, names)
    return result
