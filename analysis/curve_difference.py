"""Do two arms' learning curves differ, with training seeds and held-out tasks as the units of
replication?

The test the controls use where training is not bit-deterministic (analysis/controls.py), and the
across-seed curve comparison the outcome reports beside the equivalence test
(analysis/outcome.py): `cluster_curve_test`.

The data: per training seed both arms ran and per held-out task evaluated in every run at every
matched checkpoint, d[s, t] = the mean over the trained checkpoints of the difference in held-out
success on task t (arm a - arm b, each over that task's episodes). Seeds and tasks are crossed:
every seed plays every task. Episodes of one task are correlated (one difficulty, one policy's
habit on it), so a task is a cluster, never its episodes one by one; and the held-out task set is
itself a sample of tasks.

The estimand is the mean curve difference over training seeds in general AND held-out tasks in
general (the population the split was drawn from), not over this fixed task set. The model is the
two-way crossed random-effects one, d[s, t] = mu + seed_s + task_t + e[s, t]: a seed's luck on the
whole curve, an arm difference that varies from task to task, and the rest (evaluation noise,
a run's luck on one task). The variance of the grand mean is then var(seed)/S + var(task)/T +
var(e)/(S T), estimated from the ANOVA mean squares of the S x T table as (MS_seed + MS_task -
MS_resid) / (S T), the quasi-F's denominator (Clark 1973, "the language-as-fixed-effect fallacy":
subjects and items there, seeds and tasks here; for a balanced table also the two-way
cluster-robust variance of a mean, Cameron, Gelbach and Miller 2011), with the task term MS_task -
MS_resid floored at 0 (a variance is not negative: the floor gives the seed term alone, the paired
t-test's). The statistic mean / sqrt(variance) is referred to t on S - 1 degrees of freedom: the
fewer clusters' count less one, as Cameron, Gelbach and Miller advise, since seeds are the
scarce replicate. The statistic is never larger than the paired t-test's (below), so it says
"differ" at most as often.

Two alternatives were measured and dropped (simulated A/A pairs, alpha 0.05, 200 pairs each):
Clark's min F' (MS_seed + MS_task, no residual subtracted) said "differ" on 0.000-0.015 of them at
2-3 seeds, far below alpha, because at the embedded default's 4 episodes per task the residual
(evaluation noise) dominates MS_task; with Satterthwaite's degrees of freedom instead of S - 1 it
said "differ" on 0.09-0.105 of them with 2-3 seeds under heavy training noise (the seed mean
square, on 1-2 degrees of freedom, is often small by chance, and then the df jump towards T - 1).
Written here rather than taken from statsmodels: its GEE takes one clustering level, its two-way
cluster-robust covariance has no floor for a negative task term and asymptotic corrections, and
its MixedLM fits crossed random effects only through variance components with no small-sample
degrees of freedom; the test here is a closed form of three ANOVA mean squares with scipy's t.
Its false "differ" rate and power as used: bench/curve_calibration.py.

`paired_curve_test` is the estimand "this fixed task set": a t-test over seeds on the per-seed
mean difference, the task set's own mean difference a fixed effect. It is kept for that question
and for comparison (bench/curve_calibration.py): where the arms differ task by task with no
difference on average over tasks, it says "differ" for the fixed set, as it should for that
estimand, where `cluster_curve_test` does not.

Both leave out the warm start (0 valid trajectories): no run has trained there yet, so it can only
add evaluation noise. One number per (seed, task) cannot see curves that cross (mean 0); the
controls judge a known change, which moves a curve one way. With one seed per arm there is no
replication of training and no claim; with one held-out task, no replication of tasks.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from scipy import integrate, optimize, stats

from envab.analysis.statistics import t_test_of_zero
from envab.analysis.survival import MIN_FOR_TEST, NO_REPLICATION

Arm = Mapping[Hashable, Mapping[int, Mapping[str, Sequence[int]]]]

NO_TASK_REPLICATION = "one held-out task: no replication of tasks, no claim about tasks"


def cell_differences(arm_a: Arm, arm_b: Arm) -> tuple[list, list[int], list[str], np.ndarray]:
    """The seeds in both arms, the trained checkpoints every one of their runs has, the tasks
    evaluated in every run at each of them, and d[s, t]: the mean over those checkpoints of the
    success difference a - b on task t for seed s."""
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

    def task_rate(run, t) -> float:
        return float(np.mean([np.mean(run[c][t]) for c in trained]))

    d = np.array([[task_rate(arm_a[s], t) - task_rate(arm_b[s], t) for t in tasks] for s in seeds])
    return seeds, trained, tasks, d


def seed_differences(arm_a: Arm, arm_b: Arm) -> tuple[list, list[int], dict]:
    """The seeds in both arms, the trained checkpoints every one of their runs has, and per
    seed the mean curve difference a - b over those checkpoints (episodes pooled over the tasks
    evaluated everywhere)."""
    seeds, trained, tasks, _ = cell_differences(arm_a, arm_b)

    def rate(cell) -> float:
        outcomes = [o for t in tasks for o in cell[t]]
        return sum(outcomes) / len(outcomes)

    differences = {
        s: float(np.mean([rate(arm_a[s][c]) - rate(arm_b[s][c]) for c in trained])) for s in seeds
    }
    return seeds, trained, differences


def paired_curve_test(arm_a: Arm, arm_b: Arm, alpha: float) -> dict:
    """This fixed task set: the verdict ("differ" | "not shown to differ" | "no arm-level
    claim") of a t-test over seeds, with its numbers."""
    seeds, trained, differences = seed_differences(arm_a, arm_b)
    d = np.array([differences[s] for s in seeds])
    result = {
        "test": "paired t-test over seeds of the mean held-out success difference",
        "estimand": "this fixed held-out task set",
        "seeds": seeds,
        "checkpoints": trained,
        "seed_differences": differences,
        "mean_difference": float(d.mean()),
        "alpha": alpha,
        "p_value": None,
    }
    if len(seeds) < MIN_FOR_TEST:
        return {**result, "verdict": "no arm-level claim", "reason": NO_REPLICATION}
    # Every seed the same difference: the t test's limit (identical curves, a replay, do not
    # differ; a constant non-zero gap on every seed does).
    p = t_test_of_zero(d)["p_value"]
    return {**result, "p_value": p, "verdict": "differ" if p <= alpha else "not shown to differ"}


def two_way(d: np.ndarray) -> dict:
    """The test on an S x T table of differences (S, T >= 2; module docstring): the mean, the
    mean squares, the standard error, degrees of freedom (S - 1), t and its two-sided p."""
    s, t = d.shape
    mean = float(d.mean())
    rows, cols = d.mean(axis=1), d.mean(axis=0)
    ms_seed = t * float(np.var(rows, ddof=1))
    ms_task = s * float(np.var(cols, ddof=1))
    resid = d - rows[:, None] - cols[None, :] + mean
    ms_resid = float((resid**2).sum()) / ((s - 1) * (t - 1))
    total = ms_seed + max(0.0, ms_task - ms_resid)
    out = {
        "mean_difference": mean,
        "ms_seed": ms_seed,
        "ms_task": ms_task,
        "ms_resid": ms_resid,
        "df": s - 1,
    }
    if total == 0:
        # No spread between seeds and none between tasks beyond the residual: the same limit as
        # t_test_of_zero's (identical curves do not differ, a constant non-zero gap does).
        return {**out, "se": 0.0, "t": None, "p_value": 1.0 if mean == 0 else 0.0}
    se = float(np.sqrt(total / (s * t)))
    statistic = mean / se
    p = float(2 * stats.t.sf(abs(statistic), s - 1))
    return {**out, "se": se, "t": float(statistic), "p_value": p}


def cluster_curve_test(arm_a: Arm, arm_b: Arm, alpha: float) -> dict:
    """Held-out tasks in general, seeds in general: the verdict ("differ" | "not shown to differ"
    | "no arm-level claim") over seeds x tasks (module docstring), with its numbers."""
    seeds, trained, tasks, d = cell_differences(arm_a, arm_b)
    result = {
        "test": "t over training seeds x held-out tasks (both random) of the mean held-out "
        "success difference",
        "estimand": "held-out tasks in general, training seeds in general",
        "seeds": seeds,
        "checkpoints": trained,
        "tasks": len(tasks),
        "seed_differences": dict(zip(seeds, map(float, d.mean(axis=1)), strict=True)),
        "mean_difference": float(d.mean()),
        "alpha": alpha,
        "p_value": None,
    }
    if len(seeds) < MIN_FOR_TEST:
        return {**result, "verdict": "no arm-level claim", "reason": NO_REPLICATION}
    if len(tasks) < 2:
        return {**result, "verdict": "no arm-level claim", "reason": NO_TASK_REPLICATION}
    test = two_way(d)
    verdict = "differ" if test["p_value"] <= alpha else "not shown to differ"
    return {**result, **test, "verdict": verdict}


def power_at(result: Mapping, gap: float, alpha: float) -> float | None:
    """The power of `cluster_curve_test` at `alpha` to say "differ" for a true mean difference
    `gap`, at the seeds, tasks and mean squares of `result` (a gap moves every cell alike, so
    it leaves the mean squares as they are): two-sided, noncentral t on its df with
    noncentrality gap / se. None where the test made no claim."""
    if result.get("p_value") is None or not result.get("se"):
        return None
    df, nc = result["df"], abs(gap) / result["se"]
    critical = stats.t.ppf(1 - alpha / 2, df)

    # The noncentral t's two tails, integrated over its chi-square (scipy's nct returns NaN
    # for a large noncentrality on 1-2 degrees of freedom).
    def tails(v: float) -> float:
        scale = critical * np.sqrt(v / df)
        return (stats.norm.sf(scale - nc) + stats.norm.cdf(-scale - nc)) * stats.chi2.pdf(v, df)

    return float(min(1.0, integrate.quad(tails, 0, np.inf, limit=200)[0]))


def detectable_gap(result: Mapping, alpha: float, power: float) -> float | None:
    """The smallest mean difference `cluster_curve_test` sees with `power` at `alpha`, at the
    seeds, tasks and mean squares of `result` (None where it made no claim)."""
    if power_at(result, 0.0, alpha) is None:
        return None
    se = result["se"]
    high = se
    while power_at(result, high, alpha) < power:
        high *= 2
    return float(optimize.brentq(lambda g: power_at(result, g, alpha) - power, 0.0, high))
