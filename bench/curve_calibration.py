"""The controls' tests without bit-determinism, calibrated on simulated pairs (issue 36, items 3
and 4).

    python bench/curve_calibration.py [--simulations 300]

Prints, for the embedded default's shape (32 held-out tasks x 4 episodes per checkpoint, a curve
0.55 -> 0.80 over three trained checkpoints; analysis/calibration.py), with training noise of
0.3 on the logit per checkpoint and per task ("default") and twice that ("noisy"):
- the false "differ" rate on A/A pairs (gap 0) and the power at logit gaps 0.5 and 1.0 (their
  mean success-rate gap printed beside them), at 1, 2, 3 and 5 seeds per arm, of the paired
  t-test over seeds that judges the controls (at alpha 0.05; none with one seed: it makes no
  claim) and of `curve_equivalence`'s bootstrap band (confidence 0.95, 500 resamples);
- the power of the corruption's reward-consistency test (one-sided Fisher at 0.05, base arm with
  no disagreement in as many groups) to see flip_rewards 0.1 and 0.25, by the number of
  comparable groups of two attempts.
"""

from __future__ import annotations

import argparse
import time

from envab.analysis.calibration import Scenario, differ_rate, rate_gap
from envab.analysis.reward_consistency import flip_power

SCENARIOS = {"default": Scenario(), "noisy": Scenario(run_sd=0.6, run_task_sd=0.5)}


def curves(simulations: int) -> None:
    print(
        "| training noise | seeds per arm | logit gap (rate gap) | paired t differ | band differ |"
    )
    print("|---|---|---|---|---|")
    for name, scenario in SCENARIOS.items():
        for seeds in (1, 2, 3, 5):
            for gap in (0.0, 0.5, 1.0):
                r = differ_rate(scenario, seeds, simulations, margin=0.075, gap=gap, samples=500)
                paired = (
                    "no claim" if r["paired_t_differ"] is None else f"{r['paired_t_differ']:.3f}"
                )
                print(
                    f"| {name} | {seeds} | {gap:.1f} ({rate_gap(scenario, gap):.3f}) "
                    f"| {paired} | {r['band_differ']:.3f} |"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--simulations", type=int, default=300)
    args = parser.parse_args()
    started = time.monotonic()
    curves(args.simulations)
    rewards()
    print(f"\n{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
