"""How many seeds per arm the registered analysis needs, sized from a pilot, with its uncertainty.

    python -m envab.analysis.power --target preregistration/target.yaml \
        --outcome results/<pilot>/outcome.json --speedup 1.5 [--json power.json]

A pilot is an experiment run with a few seeds per arm (three or more, on both arms). Two numbers
per arm cannot size anything: the SD of per-seed log time ratios from n pairs has n - 1 degrees
of freedom, and from one pair none. So the sizing reports

- the pilot SD with its chi-square interval, and `seeds_needed` (the paired t-test's closed-form
  power, statsmodels) at the SD's estimate and at its upper bound: the second is the number to
  register when a study must not come out underpowered;
- a simulation of the registered analysis itself: per seed, log baseline times drawn as the
  pilot's baseline arm (log-normal), the candidate's as baseline / speedup with the pilot's
  spread of log ratios, both censored at the registered budget as every statistic censors them
  (survival.at_budget), then the primary endpoint's test (a one-sample t-test on the log ratios)
  at alpha. Its power at each seed count, the seeds at which it reaches the target power, and the
  coverage of the t interval on the ratio at the registered seed count. Censoring moves the
  measured ratio towards 1 and shrinks its spread, so power may go either way; coverage drops
  (the interval is centred on a shrunken effect). The closed form sees neither.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy.stats import chi2, ttest_1samp
from scipy.stats import t as student_t

from envab.analysis.outcome import UNITS, seed_time
from envab.analysis.survival import SeedTime, seeds_needed
from envab.errors import Refusal, refused
from envab.io import atomic_write_json
from envab.preregistration import Preregistration

MIN_PILOT_PAIRS = 3  # two pairs give an SD with one degree of freedom: any seed count fits it


class PilotTooSmall(Refusal, ValueError):
    """The pilot cannot size a study: too few paired seeds, or its baseline never reached."""


@dataclass(frozen=True)
class Pilot:
    """What a pilot measured, in one unit (wall-clock seconds or valid trajectories)."""

    pairs: int
    mean_log_baseline: float  # mean log time-to-target of the baseline arm's reached seeds
    sd_log_baseline: float
    sd_log_ratio: float  # SD over seeds of log(candidate time / baseline time)
    baseline_reached: int
    budget: float

    @classmethod
    def from_seeds(cls, baseline: Sequence[SeedTime], candidate: Sequence[SeedTime], budget: float):
        by_seed = {r.seed: r for r in candidate}
        pairs = [(r, by_seed[r.seed]) for r in baseline if r.seed in by_seed]
        if len(pairs) < MIN_PILOT_PAIRS:
            raise PilotTooSmall(
                f"{len(pairs)} paired seed(s): a pilot needs at least {MIN_PILOT_PAIRS} seeds on "
                "both arms (the SD of fewer has at most one degree of freedom)"
            )
        reached = [math.log(a.time) for a, _ in pairs if a.reached and a.time <= budget]
        if len(reached) < 2:
            raise PilotTooSmall(
                f"{len(reached)} baseline seed(s) reached the target within the budget: a "
                "time-to-target study cannot be sized from a pilot that does not reach it"
            )
        entered = [
            math.log(min(b.time if b.reached else budget, budget))
            - math.log(min(a.time if a.reached else budget, budget))
            for a, b in pairs
        ]
        if len(set(entered)) == 1:
            raise PilotTooSmall(
                "every pilot pair has the same log time ratio (every seed censored alike?): "
                "no spread to size from"
            )
        return cls(
            pairs=len(pairs),
            mean_log_baseline=float(np.mean(reached)),
            sd_log_baseline=float(np.std(reached, ddof=1)),
            sd_log_ratio=float(np.std(entered, ddof=1)),
            baseline_reached=len(reached),
            budget=float(budget),
        )


def sd_interval(sd: float, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided chi-square interval for a normal SD estimated from n values."""
    df = n - 1
    tail = (1 - confidence) / 2
    return (
        sd * math.sqrt(df / chi2.ppf(1 - tail, df)),
        sd * math.sqrt(df / chi2.ppf(tail, df)),
    )


def closed_form(pilot: Pilot, speedup: float, alpha: float, power: float, confidence: float):
    """seeds_needed at the pilot SD's estimate and at both ends of its interval."""
    low, high = sd_interval(pilot.sd_log_ratio, pilot.pairs, confidence)
    return {
        "sd_log_ratio": pilot.sd_log_ratio,
        "sd_interval": [low, high],
        "sd_confidence": confidence,
        "seeds_at_estimate": seeds_needed(speedup, pilot.sd_log_ratio, alpha=alpha, power=power),
        "seeds_at_lower_sd": seeds_needed(speedup, low, alpha=alpha, power=power),
        "seeds_at_upper_sd": seeds_needed(speedup, high, alpha=alpha, power=power),
    }


def simulate(
    pilot: Pilot, speedup: float, seeds: int, alpha: float, draws: int, rng: np.random.Generator
) -> dict:
    """The registered analysis on `draws` simulated studies of `seeds` seeds per arm: its power
    (p < alpha with the candidate faster) and its t interval's coverage of 1 / speedup."""
    log_a = rng.normal(pilot.mean_log_baseline, pilot.sd_log_baseline, (draws, seeds))
    log_b = log_a - math.log(speedup) + rng.normal(0.0, pilot.sd_log_ratio, (draws, seeds))
    cap = math.log(pilot.budget)  # never reached by the budget: entered at the budget
    ratios = np.minimum(log_b, cap) - np.minimum(log_a, cap)
    spread = ratios.std(axis=1, ddof=1)
    usable = spread > 0  # every pair censored alike: no test (the analysis reports no p-value)
    test = ttest_1samp(ratios[usable], 0.0, axis=1)
    detected = np.zeros(draws, dtype=bool)
    detected[usable] = (test.pvalue < alpha) & (ratios[usable].mean(axis=1) < 0)
    half = student_t.ppf(0.975, seeds - 1) * spread / math.sqrt(seeds)
    mean = ratios.mean(axis=1)
    truth = -math.log(speedup)
    covered = usable & (mean - half <= truth) & (truth <= mean + half)
    censored = float(((log_a > cap) | (log_b > cap)).mean())
    return {
        "seeds": seeds,
        "power": float(detected.mean()),
        "coverage_95": float(covered.mean()),
        "censored_share": censored,
    }


def size(
    pilot: Pilot,
    speedup: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    confidence: float = 0.8,
    registered_seeds: int | None = None,
    draws: int = 4000,
    max_seeds: int = 200,
    seed: int = 0,
) -> dict:
    """The pilot's sizing: closed form with the SD's uncertainty, and the simulated analysis."""
    if not speedup > 1:
        raise ValueError(f"speedup must be > 1 (e.g. 1.5 for 1.5x), got {speedup}")
    rng = np.random.default_rng(seed)
    form = closed_form(pilot, speedup, alpha, power, confidence)
    curve, needed = [], None
    n = 2
    while n <= max_seeds:
        point = simulate(pilot, speedup, n, alpha, draws, rng)
        curve.append(point)
        if point["power"] >= power:
            needed = n
            break
        n = n + 1 if n < 20 else math.ceil(n * 1.25)  # fine where it matters, coarse beyond
    at_registered = (
        simulate(pilot, speedup, registered_seeds, alpha, draws, rng) if registered_seeds else None
    )
    return {
        "pilot": asdict(pilot),
        "speedup": speedup,
        "alpha": alpha,
        "power": power,
        "closed_form": form,
        "simulated": {
            "draws": draws,
            "seeds_needed": needed,
            "reason": None if needed else f"power {power} not reached by {max_seeds} seeds",
            "curve": curve,
        },
        "at_registered_seeds": at_registered,
    }


def render(sizing: dict, unit: str) -> str:
    p, form, sim = sizing["pilot"], sizing["closed_form"], sizing["simulated"]
    low, high = form["sd_interval"]
    lines = [
        f"# Seeds per arm for a {sizing['speedup']:g}x speed-up (alpha {sizing['alpha']:g}, "
        f"power {sizing['power']:g})",
        "",
        f"Pilot: {p['pairs']} paired seeds in {unit}; baseline reached on {p['baseline_reached']}"
        f" (log-time mean {p['mean_log_baseline']:.3f}, SD {p['sd_log_baseline']:.3f}); budget "
        f"{p['budget']:g}.",
        f"SD of per-seed log ratios: {form['sd_log_ratio']:.3f}, "
        f"{form['sd_confidence']:.0%} interval {low:.3f} to {high:.3f}.",
        "",
        "| sizing | seeds per arm |",
        "|---|---|",
        f"| paired t closed form, SD at its estimate | {form['seeds_at_estimate']} |",
        f"| closed form, SD at its interval's ends | {form['seeds_at_lower_sd']} to "
        f"{form['seeds_at_upper_sd']} |",
        f"| the registered analysis simulated (censoring at the budget), {sim['draws']} studies "
        f"per count | {sim['seeds_needed'] or sim['reason']} |",
    ]
    reg = sizing["at_registered_seeds"]
    if reg:
        lines += [
            "",
            f"At the registered {reg['seeds']} seeds per arm: power {reg['power']:.3f}, the 95 % t "
            f"interval covers the true ratio in {reg['coverage_95']:.3f} of studies, "
            f"{reg['censored_share']:.1%} of seeds censored.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m envab.analysis.power", description=__doc__)
    p.add_argument("--target", required=True, type=Path, help="the pre-registration (budget)")
    p.add_argument("--outcome", required=True, type=Path, help="the pilot's outcome.json")
    p.add_argument("--speedup", required=True, type=float, help="the effect to detect, e.g. 1.5")
    p.add_argument("--unit", choices=sorted(UNITS), default="wall_clock_s")
    p.add_argument("--baseline", help="default: the pre-registration's first arm")
    p.add_argument("--candidate", help="default: its second arm")
    p.add_argument("--alpha", type=float)
    p.add_argument("--power", type=float, default=0.8)
    p.add_argument("--seeds", type=int, help="the seed count to check power and coverage at")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    try:
        prereg = Preregistration.load(args.target)
        outcome = json.loads(args.outcome.read_text())
        baseline = args.baseline or prereg.arms[0]
        candidate = args.candidate or prereg.arms[1]
        budget = getattr(prereg.budget, UNITS[args.unit])
        rows = outcome["runs"]
        arm = {
            name: [seed_time(r, args.unit, budget) for r in rows if r["arm"] == name]
            for name in (baseline, candidate)
        }
        pilot = Pilot.from_seeds(arm[baseline], arm[candidate], budget)
        alpha = args.alpha or prereg.primary.alpha
        sizing = size(
            pilot, args.speedup, alpha=alpha, power=args.power, registered_seeds=args.seeds
        )
    except (Refusal, FileNotFoundError, KeyError, ValueError) as e:
        return refused(e)
    if args.json:
        atomic_write_json(args.json, sizing)
    print(render(sizing, args.unit), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
