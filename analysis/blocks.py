"""Speed measured in blocks that share the machine's load: the paired ratio of seconds per valid
trajectory (target.yaml `timing`, primary endpoint `seconds_per_valid_trajectory`), as pure
functions. The blocks' order and load rule belong to the job that runs them (trainer/timing.py).

Why blocks: the A/B runs go one after another in whatever order the scheduler picks, so a load
that lasts minutes lands on one arm of a seed and not the other, and their pairing buys nothing.
In a timing block every arm replays the same training seed for the same window of valid
trajectories, back to back, in an order drawn from a registered seed: pairs of blocks run ABBA or
BAAB, so a load that grows or fades through a pair is balanced between the arms. The unit of
replication is the block; the interval is a t interval over the admissible blocks' log ratios.

Why seconds per valid trajectory: it is the speed the environment infrastructure sets, judged
apart from learning. A run that never reaches the target has a speed all the same, so a learning
failure never reads as "no speed difference" (time to target stays the record per run, censored
where never reached: analysis/time_to_target.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats

from envab.analysis.statistics import t_test_of_zero


def seconds_per_valid(window: dict, clock: str = "wall_clock_s") -> float:
    """One window's seconds per valid trajectory on `clock`: wall_clock_s, the training loop;
    provisioned_s, the environments' provisioning plus training."""
    return window[clock] / window["valid_trajectories"]


def blocked_ratio(
    log_ratios: Sequence[float], alpha: float, smallest_effect: float | None = None
) -> dict:
    """The paired speed ratio over blocks (candidate / baseline), from each block's log ratio:
    its geometric mean, the (1 - alpha) t interval, the two-sided p of mean 0, and a verdict
    that also says where the interval lies against the smallest effect of interest."""
    n = len(log_ratios)
    record: dict = {"blocks": n, "alpha": alpha, "smallest_effect": smallest_effect}
    if n < 2:
        return {**record, "p_value": None, "verdict": "not tested: fewer than two blocks"}
    mean = sum(log_ratios) / n
    test = t_test_of_zero(log_ratios, 1 - alpha)  # every block alike: the test's limit
    record.update(
        ratio=math.exp(mean),
        interval=[math.exp(test["low"]), math.exp(test["high"])],
        mean_log_ratio=mean,
        p_value=test["p_value"],
    )
    if test["no_spread"]:
        record["no_spread"] = test["no_spread"]
    record["verdict"] = speed_verdict(record, smallest_effect)
    return record


def speed_verdict(record: dict, smallest_effect: float | None) -> str:
    """faster / slower where the interval excludes 1, with whether it also lies beyond the
    smallest effect of interest; otherwise no difference shown (and, where the interval lies
    inside [smallest_effect, 1 / smallest_effect], equivalent within it)."""
    low, high = record["interval"]
    alpha = record["alpha"]
    if record["p_value"] > alpha or low <= 1 <= high:
        if smallest_effect and smallest_effect < low and high < 1 / smallest_effect:
            return f"no difference beyond the smallest effect of interest ({smallest_effect:g})"
        return f"no difference shown at alpha {alpha:g}"
    word = "faster" if high < 1 else "slower"
    if smallest_effect is None:
        return word
    beyond = high < smallest_effect if word == "faster" else low > 1 / smallest_effect
    return (
        f"{word}, beyond the smallest effect of interest ({smallest_effect:g})"
        if beyond
        else f"{word}, not shown beyond the smallest effect of interest ({smallest_effect:g})"
    )


def power_at_smallest(log_ratios: Sequence[float], alpha: float, smallest_effect: float) -> dict:
    """The blocks' power to tell a ratio of `smallest_effect` (or its inverse) from 1: the
    two-sided one-sample t test over as many blocks, at alpha, with the spread of these blocks'
    log ratios as the noise. A claim of no difference means something
    only where this is high; an A/A's blocks give the noise with no effect in it."""
    n = len(log_ratios)
    if n < 2:
        return {"blocks": n, "power": None, "reason": "fewer than two blocks"}
    mean = sum(log_ratios) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in log_ratios) / (n - 1))
    effect = abs(math.log(smallest_effect))
    if sd == 0:  # no spread: any effect at all is told from none
        return {"blocks": n, "sd_log_ratio": 0.0, "power": 1.0}
    # the noncentral t's two tails, as statsmodels' TTestPower computes them; taken from scipy
    # here because the far tail underflows to NaN once the effect is many SDs (TTestPower then
    # answers NaN where the power is 1)
    shift = effect / sd * math.sqrt(n)
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    far = stats.nct.cdf(-crit, n - 1, shift)
    power = stats.nct.sf(crit, n - 1, shift) + (0.0 if math.isnan(far) else far)
    return {"blocks": n, "sd_log_ratio": sd, "power": float(min(1.0, power))}


def trimmed(log_ratios: Sequence[float]) -> list[float]:
    """The sensitivity line's blocks, as MLPerf scores a set of runs: the fastest and the
    slowest block dropped (needs at least four)."""
    if len(log_ratios) < 4:
        return []
    return sorted(log_ratios)[1:-1]


def judge_blocks(
    executions: Sequence[dict],
    baseline: str,
    candidate: str,
    alpha: float,
    smallest_effect: float | None,
    clock: str = "wall_clock_s",
) -> dict:
    """The speed endpoint from every execution of every block (trainer/timing.py's records):
    a block counts by its last execution when that one is admissible on every arm; the others
    stay listed, never dropped from the table."""
    last: dict[int, dict] = {}
    for execution in executions:
        if (
            execution["block"] not in last
            or execution["execution"] > last[execution["block"]]["execution"]
        ):
            last[execution["block"]] = execution
    kept = [b for _, b in sorted(last.items()) if b["admissible"]]
    logs = [
        math.log(
            seconds_per_valid(b["windows"][candidate], clock)
            / seconds_per_valid(b["windows"][baseline], clock)
        )
        for b in kept
    ]
    sensitivity = trimmed(logs)
    judged = blocked_ratio(logs, alpha, smallest_effect)
    if len(kept) < 2 and len(last) > len(kept):
        # say why there are too few: the registered rule refused the others (v17's whole job
        # under load read "fewer than two blocks", which named no cause)
        judged["verdict"] = (
            f"not tested: the admissibility rule (load, steal, a finished window) kept "
            f"{len(kept)} of {len(last)} blocks, fewer than two"
        )
    return {
        "baseline": baseline,
        "candidate": candidate,
        "clock": clock,
        "executions": len(executions),
        "blocks_registered": len(last),
        "blocks_kept": [b["block"] for b in kept],
        "log_ratios": logs,
        **judged,
        "power_at_smallest": (
            power_at_smallest(logs, alpha, smallest_effect) if smallest_effect else None
        ),
        "sensitivity": (
            {
                "rule": "fastest and slowest block dropped",
                **blocked_ratio(sensitivity, alpha, smallest_effect),
            }
            if sensitivity
            else None
        ),
    }
