"""The curve tests on simulated A/A pairs: how often each says "differ" when nothing differs, and
how often it does at a stated gap (issue 36, item 3).

Where training is not bit-deterministic the A/A and handicap controls are judged by a curve test
(analysis/controls.py), so its false "differ" rate must be known: the cluster test over seeds x
tasks that judges them (analysis/curve_difference.py), the paired t-test over seeds (the fixed
task set's estimand) and `curve_equivalence`'s "differ" (analysis/equivalence.py), which the
outcome shows. Two arms with no
effect are simulated as the analysis sees them: per training seed, a learning curve over the
checkpoints whose logit carries run-level training noise (per checkpoint, and per held-out task:
a run learns some tasks better than another run of the same seed), and per held-out task and
checkpoint, binomial evaluation episodes around that run's success probability. Tasks differ in
difficulty (a task-level logit offset shared by every run: what makes tasks clusters). Each
run's noise is drawn independently, the pessimistic case for the paired seed resampling: on a
GPU two runs of one seed share their data order and sampling seeds, but not their arithmetic.
The gap, where given, is added to one arm's logit at every checkpoint but the first (the warm
start, which no arm has trained yet); `gap_task_sd` adds to it an arm difference per task drawn
once per simulated experiment around that gap: with gap 0 the arms do not differ over held-out
tasks in general, while any one drawn task set has a mean difference of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, logit

from envab.analysis.curve_difference import cluster_curve_test, paired_curve_test
from envab.analysis.equivalence import curve_equivalence
from envab.analysis.survival import MIN_FOR_TEST


@dataclass(frozen=True)
class Scenario:
    """One simulated experiment's shape; the defaults are the embedded default's (32 held-out
    tasks, 4 episodes each per checkpoint: 128, a curve from the warm start 0.55 to 0.80 over four
    checkpoints) with training noise of 0.3 on the logit per checkpoint (about 0.06 in success
    rate around 0.7) and 0.3 per task."""

    rates: tuple[float, ...] = (0.55, 0.65, 0.72, 0.80)  # mean success at each checkpoint
    tasks: int = 32
    episodes_per_task: int = 4
    task_sd: float = 1.0  # task difficulty, logit
    run_sd: float = 0.3  # a run's training noise per checkpoint, logit
    run_task_sd: float = 0.3  # a run's training noise per task, logit
    checkpoint_interval: int = 512
    # An arm difference that varies from task to task with mean 0 over tasks in general, logit
    # (drawn once per simulated experiment, shared by every seed): no difference for held-out
    # tasks in general, some for any one fixed task set.
    gap_task_sd: float = 0.0


def simulate_arm(
    rng: np.random.Generator, scenario: Scenario, seeds: int, difficulty: np.ndarray, gap=0.0
) -> dict:
    """`gap`: a number (every task alike) or one logit per task."""
    """One arm as `curve_equivalence` takes it: arm[seed][valid_trajectories][task] -> outcomes."""
    s = scenario
    base = logit(np.asarray(s.rates))
    uniform = float(np.mean(gap))
    task_gap = np.asarray(gap, dtype=float) - uniform  # per task, beside the uniform shift
    shift = np.where(np.arange(len(base)) == 0, 0.0, uniform)  # the warm start is never trained
    arm = {}
    for seed in range(seeds):
        run = base + shift + rng.normal(0, s.run_sd, len(base))
        run[0] = base[0]  # every run starts from the same warm start
        per_task = rng.normal(0, s.run_task_sd, s.tasks)
        curve = {}
        for c, level in enumerate(run):
            p = expit(level + difficulty + (per_task + task_gap if c else 0.0))
            wins = rng.binomial(s.episodes_per_task, p)
            curve[c * s.checkpoint_interval] = {
                f"t{k}": [1] * int(w) + [0] * (s.episodes_per_task - int(w))
                for k, w in enumerate(wins)
            }
        arm[seed] = curve
    return arm


def differ_rate(
    scenario: Scenario,
    seeds: int,
    simulations: int,
    margin: float,
    gap: float = 0.0,
    samples: int = 500,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    """The fraction of simulated pairs each curve test calls "differ", with `seeds` training
    seeds per arm and a logit `gap` between the arms (0 and no `gap_task_sd`: an A/A pair) at
    alpha = 1 - confidence: the cluster test over seeds x tasks and the paired t-test over seeds
    (None with one seed: they make no claim), and the bootstrap band's "differ" (and its
    "equivalent"; samples=0 leaves the band out)."""
    rng = np.random.default_rng(seed)
    cluster, paired, band = [], [], []
    for i in range(simulations):
        difficulty = rng.normal(0, scenario.task_sd, scenario.tasks)
        gaps = gap + rng.normal(0, scenario.gap_task_sd, scenario.tasks)
        a = simulate_arm(rng, scenario, seeds, difficulty, gaps)
        b = simulate_arm(rng, scenario, seeds, difficulty)
        cluster.append(cluster_curve_test(a, b, 1 - confidence)["verdict"])
        paired.append(paired_curve_test(a, b, 1 - confidence)["verdict"])
        if samples:
            result = curve_equivalence(a, b, margin, samples=samples, confidence=confidence, seed=i)
            band.append(result.verdict)
    claim = seeds >= MIN_FOR_TEST
    return {
        "seeds": seeds,
        "gap_logit": gap,
        "simulations": simulations,
        "cluster_differ": cluster.count("differ") / simulations if claim else None,
        "paired_t_differ": paired.count("differ") / simulations if claim else None,
        "band_differ": band.count("differ") / simulations if band else None,
        "band_equivalent": band.count("equivalent") / simulations if band else None,
    }


def rate_gap(scenario: Scenario, gap: float) -> float:
    """A logit gap as the mean success-rate gap it makes over the trained checkpoints."""
    base = logit(np.asarray(scenario.rates[1:]))
    return float(np.mean(expit(base + gap) - expit(base)))
