"""The controls' tests without bit-determinism, calibrated on simulated pairs (issue 36, items 3
and 4).

    python bench/curve_calibration.py [--simulations 300]

Prints, for the embedded default's shape (32 held-out tasks x 4 episodes per checkpoint, a curve
0.55 -> 0.80 over three trained checkpoints; analysis/calibration.py), with training noise of
0.3 on the logit per checkpoint and per task ("default"), twice that ("noisy"), and the default
with an arm difference per task of SD 0.5 on the logit around the stated gap ("task-varying": at
gap 0 no difference over held-out tasks in general, some on any one drawn task set):
- the false "differ" rate on A/A pairs (gap 0) and the power at logit gaps 0.5 and 1.0 (their
  mean success-rate gap printed beside them), at 1, 2, 3 and 5 seeds per arm, of the curve test
  over seeds x held-out tasks that judges the controls, of the paired t-test over seeds (this
  fixed task set's estimand; both at alpha 0.05, none with one seed: no claim) and of
  `curve_equivalence`'s bootstrap band (confidence 0.95, 500 resamples);
- the power of the corruption's reward-consistency test (one-sided Fisher at 0.05, base arm with
  no disagreement in as many groups) to see flip_rewards 0.1 and 0.25, by the number of
  comparable groups of two attempts;
- the power of the evaluation corruption's test (reported against honest episode pairs,
  one-sided Fisher at 0.05 against honest evaluations with no disagreement in as many groups) to
  see flip_eval 0.05 and 0.1, by the number of comparable pairs.
"""

from __future__ import annotations

import argparse
import time

from envab.analysis.calibration import Scenario, differ_rate, rate_gap
from envab.analysis.reward_consistency import flip_power, pair_power

SCENARIOS = {
    "default": Scenario(),
    "noisy": Scenario(run_sd=0.6, run_task_sd=0.5),
    "task-varying": Scenario(gap_task_sd=0.5),
}


def _rate(value: float | None) -> str:
    return "no claim" if value is None else f"{value:.3f}"


def curves(simulations: int) -> None:
    print(
        "| training noise | seeds per arm | logit gap (rate gap) | seeds x tasks differ "
        "| paired t differ | band differ |"
    )
    print("|---|---|---|---|---|---|")
    for name, scenario in SCENARIOS.items():
        for seeds in (1, 2, 3, 5):
            for gap in (0.0, 0.5, 1.0):
                r = differ_rate(scenario, seeds, simulations, margin=0.075, gap=gap, samples=500)
                print(
                    f"| {name} | {seeds} | {gap:.1f} ({rate_gap(scenario, gap):.3f}) "
                    f"| {_rate(r['cluster_differ'])} | {_rate(r['paired_t_differ'])} "
                    f"| {r['band_differ']:.3f} |"
                )


def rewards() -> None:
    print("\n| comparable groups (pairs) | power at flip 0.1 | power at flip 0.25 |")
    print("|---|---|---|")
    for n in (5, 10, 20, 40, 80, 160):
        run = {"comparable_groups": n, "disagreeing_groups": 0, "group_sizes": {2: n}}
        base = {"comparable_groups": n, "disagreeing_groups": 0}
        print(
            f"| {n} | {flip_power(run, base, 0.1, 0.05):.3f} "
            f"| {flip_power(run, base, 0.25, 0.05):.3f} |"
        )


def evaluation() -> None:
    print("\n| comparable episode pairs | power at flip_eval 0.05 | power at flip_eval 0.1 |")
    print("|---|---|---|")
    for n in (16, 32, 64, 128, 256, 512):
        base = {"comparable_groups": n, "disagreeing_groups": 0}
        low, high = pair_power(n, 0.05, base, 0.05), pair_power(n, 0.1, base, 0.05)
        print(f"| {n} | {low:.3f} | {high:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--simulations", type=int, default=300)
    args = parser.parse_args()
    started = time.monotonic()
    curves(args.simulations)
    rewards()
    evaluation()
    print(f"\n{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
