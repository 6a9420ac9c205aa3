"""What the registered analysis costs, measured with the project's own functions (issue 36).

    python bench/statistics_check.py [--coverage-simulations 400]

Prints, for the shipped embedded default (threshold 0.70, lower_bound 0.95 on 128 episodes per
checkpoint, confirmation delta 0.05):
- the confirmation's size and its exact power, by the old normal approximation and by the exact
  sizing at whole seeds of 32 episodes, for both nulls (threshold - delta, the threshold);
- the false "reached" rate of a flat policy near the threshold: the crossing alone, then the
  crossing and its confirmation (both must hold since a failed confirmation is not reached);
- the log-rank p of one example with a run censored at what it spent and at the budget;
- the coverage of the primary endpoint's t interval and of the percentile bootstrap interval on
  the paired log time ratio, at 3, 5 and 7 seeds per arm (log-normal times, log SD 0.2 per arm,
  no censoring; the bootstrap with 999 resamples).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from envab.analysis.crossing import (
    approximate_episodes,
    confirmation_power,
    confirmatory_episodes,
    crossing_probability,
    reached_probability,
)
from envab.analysis.survival import SeedTime, across_seeds, logrank, paired_log_ratio, paired_t

THRESHOLD, DELTA, EPISODES, TASKS = 0.70, 0.05, 128, 32
RULE = {"rule": "lower_bound", "confidence": 0.95}


def confirmation_sizes() -> None:
    approx = approximate_episodes(THRESHOLD, DELTA)
    played = math.ceil(approx / TASKS) * TASKS
    print(
        f"approximation: {approx} wanted, {played} played, exact power "
        f"{confirmation_power(THRESHOLD, played, THRESHOLD, DELTA):.3f}"
    )
    for null in ("threshold_minus_delta", "threshold"):
        n = confirmatory_episodes(THRESHOLD, DELTA, step=TASKS, null=null)
        at = THRESHOLD if null == "threshold_minus_delta" else THRESHOLD + DELTA
        print(
            f"exact, null {null}: {n} episodes ({n // TASKS} seeds), power at {at:.2f} "
            f"{confirmation_power(at, n, THRESHOLD, DELTA, null=null):.3f}; confirmed at "
            + ", ".join(
                f"{p:.2f}: {confirmation_power(p, n, THRESHOLD, DELTA, null=null):.3f}"
                for p in (0.65, 0.68, 0.69, 0.70)
            )
        )
    print(
        f"old size {played} confirms a checkpoint at 0.68 with probability "
        f"{confirmation_power(0.68, played, THRESHOLD, DELTA):.3f}"
    )


def false_reached() -> None:
    for looks in (4, 5):
        for rate in (0.65, 0.68, 0.69, 0.70, 0.75):
            crossed = crossing_probability(rate, THRESHOLD, EPISODES, looks, RULE, 200000)
            after = [
                reached_probability(
                    rate,
                    THRESHOLD,
                    EPISODES,
                    looks,
                    RULE,
                    confirmatory_episodes(THRESHOLD, DELTA, step=TASKS, null=null),
                    DELTA,
                    null=null,
                    simulations=200000,
                )
                for null in ("threshold_minus_delta", "threshold")
            ]
            print(
                f"{looks} looks, flat at {rate:.2f}: crossing alone {crossed:.4f}; crossing "
                f"and confirmation (null 0.65) {after[0]:.4f}, (null 0.70) {after[1]:.4f}"
            )


def censoring() -> None:
    reaching = [SeedTime(s, True, t) for s, t in enumerate([500.0, 550.0, 600.0, 650.0])]
    capped = [SeedTime(s, False, 300.0 + 10 * s) for s in range(4)]
    print(
        f"log-rank p, capped runs censored at what they spent: "
        f"{logrank(reaching, capped)['p_value']:.4f}; at the 1000 s budget: "
        f"{across_seeds(reaching, capped, 1000.0)['logrank']['p_value']:.4f}"
    )


def coverage(simulations: int) -> None:
    rng = np.random.default_rng(0)
    true_log_ratio = math.log(1 / 1.5)
    for seeds in (3, 5, 7):
        t_hits = boot_hits = 0
        for i in range(simulations):
            log_a = math.log(600) + 0.2 * rng.standard_normal(seeds)
            log_b = math.log(600) + true_log_ratio + 0.2 * rng.standard_normal(seeds)
            a = [SeedTime(s, True, math.exp(x)) for s, x in enumerate(log_a)]
            b = [SeedTime(s, True, math.exp(x)) for s, x in enumerate(log_b)]
            low, high = paired_t(a, b, 1e9)["interval_ratio"]
            t_hits += low <= 1 / 1.5 <= high
            low, high = paired_log_ratio(a, b, 1e9, n_resamples=999, seed=i)["interval_ratio"]
            boot_hits += low <= 1 / 1.5 <= high
        print(
            f"{seeds} seeds per arm, {simulations} simulations: coverage of the 95 % t "
            f"interval {t_hits / simulations:.3f}, of the percentile bootstrap "
            f"{boot_hits / simulations:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--coverage-simulations", type=int, default=400)
    args = parser.parse_args()
    confirmation_sizes()
    false_reached()
    censoring()
    coverage(args.coverage_simulations)


if __name__ == "__main__":
    main()
