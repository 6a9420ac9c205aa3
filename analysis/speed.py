"""The outcome's speed section: seconds per valid trajectory in the registered timing blocks
(trainer/timing.py measures them, analysis/blocks.py judges them), on two clocks, with each arm's
environment CPU time per valid trajectory and every execution of every block in a table.

Clock 1, the training loop (from the first step to the last): the primary endpoint where
registered. Clock 2, the environments' provisioning plus training (the arm opened to the arm
closed): what a user waits for, the set-up the infrastructure changes included. The environment
CPU seconds per valid trajectory are the run's process tree less the trainer's own process: a
load-robust secondary endpoint, since CPU time moves far less with other work beside the run than
wall-clock does.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from envab.analysis.blocks import judge_blocks, seconds_per_valid
from envab.preregistration import Control

CLOCKS = {
    "wall_clock_s": "training loop",
    "provisioned_s": "provisioning + training",
}


def env_cpu_per_valid(executions: list[dict], arm: str) -> float | None:
    """The median over kept blocks of `arm`'s environment CPU seconds per valid trajectory."""
    values = [
        e["windows"][arm]["env_cpu_s"] / e["windows"][arm]["valid_trajectories"]
        for e in executions
        if e["admissible"] and e["windows"][arm].get("env_cpu_s") is not None
    ]
    return median(values) if values else None


def section(
    executions: list[dict],
    pairs: list[tuple[str, str]],
    alpha: float,
    smallest,
    controls: Sequence[Control] = (),
    aa_rule: str = "covers_one",
) -> dict:
    """Every pair's speed on both clocks, the timed controls judged by the primary endpoint
    (an A/A by the registered `aa_rule`), and the table of executions."""
    arms = sorted({arm for e in executions for arm in e["windows"]})
    return {
        "pairs": [
            {
                clock: judge_blocks(executions, baseline, candidate, alpha, smallest, clock)
                for clock in CLOCKS
            }
            for baseline, candidate in pairs
        ],
        "controls": [judge_control(executions, c, alpha, smallest, aa_rule) for c in controls],
        "env_cpu_s_per_valid": {arm: env_cpu_per_valid(executions, arm) for arm in arms},
        "executions": executions,
    }


def judge_control(
    executions: list[dict],
    control: Control,
    alpha: float,
    smallest,
    aa_rule: str = "covers_one",
) -> dict:
    """A timed control judged by the primary endpoint (the training loop's seconds per valid
    trajectory, the control's runs over its base arm's in the same blocks), with the blocks'
    power at the smallest effect of interest.

    An A/A (same), by `aa_rule`: `covers_one`, as expected where the interval covers 1 (a
    difference found where there is none says the blocks are not measuring the
    infrastructure); `within_smallest_effect`, as expected where the interval lies inside
    (smallest, 1 / smallest), an equivalence test: the blocks show the two windows of one arm
    agree within a difference that matters, which an A/A too noisy to tell fails, and a 3 %
    difference a precise one resolves does not. A handicap (slower) is as expected where the
    interval lies above 1: sized at the smallest effect of interest, it shows the blocks find a
    slowdown of the size that matters."""
    record = {
        "name": control.name,
        "arm": control.arm,
        "runs_as": control.run_arm,
        "expect": control.expect,
        "rule": aa_rule if control.expect == "same" else "above_one",
    }
    missing = [e["block"] for e in executions if control.run_arm not in e["windows"]]
    if missing:  # registered, never timed: not a pass
        why = f"no {control.run_arm} window in block(s) {sorted(set(missing))}"
        return {**record, "judged": {"verdict": why}, "verdict": "not tested", "reason": why}
    judged = judge_blocks(executions, control.arm, control.run_arm, alpha, smallest)
    record["judged"] = judged
    if judged.get("interval") is None:
        return {**record, "verdict": "not tested", "reason": judged["verdict"]}
    low, high = judged["interval"]
    if control.expect != "same":
        held = low > 1
    elif aa_rule == "within_smallest_effect":
        bound = min(smallest, 1 / smallest)
        held = bound < low and high < 1 / bound
    else:
        held = low <= 1 <= high
    return {**record, "verdict": "as expected" if held else "NOT as expected"}


def primary(pair: dict) -> dict:
    """The primary endpoint's record (analysis/outcome.py's shape) from a pair's loop clock."""
    loop = pair["wall_clock_s"]
    return {
        "candidate": loop["candidate"],
        "baseline": loop["baseline"],
        "endpoint": "seconds_per_valid_trajectory:wall_clock_s",
        "alpha": loop["alpha"],
        "p_value": loop.get("p_value"),
        "ratio": loop.get("ratio"),
        "interval_ratio": loop.get("interval"),
        "blocks": loop["blocks"],
        "smallest_effect": loop["smallest_effect"],
        "verdict": loop["verdict"],
    }


def not_measured(baseline: str, candidate: str, registered) -> dict:
    """The primary endpoint of an answer given no timing blocks (a selection's: the blocks
    belong to the whole registration's answer)."""
    return {
        "candidate": candidate,
        "baseline": baseline,
        "endpoint": "seconds_per_valid_trajectory:wall_clock_s",
        "alpha": registered.alpha,
        "p_value": None,
        "blocks": 0,
        "smallest_effect": registered.smallest_effect,
        "verdict": "not measured here: the timing blocks are the whole registration's answer",
    }


def _ratio_text(judged: dict) -> str:
    if judged.get("ratio") is None:
        return judged["verdict"]
    low, high = judged["interval"]
    return (
        f"{judged['ratio']:.3g}, {100 * (1 - judged['alpha']):.0f} % t interval "
        f"[{low:.3g}, {high:.3g}] over {judged['blocks']} blocks ({judged['verdict']})"
    )


def _window_cell(window: dict, clock: str) -> str:
    if not window.get("valid_trajectories") or window.get(clock) is None:
        return "–"
    return f"{seconds_per_valid(window, clock):.3f}"


def _load_cell(window: dict) -> str:
    parts = []
    for key, label in (
        ("outside_demand", "wanted"),  # what the load rule judges (trainer/timing.py)
        ("outside_load", "out"),
        ("steal_fraction", "steal"),
        ("cpu_pressure_some", "PSI"),
    ):
        if key not in window and key == "outside_demand":
            continue  # a record from before v18, which measured no demand
        value = window.get(key)
        parts.append(f"{label} {value:.2f}" if value is not None else f"{label} –")
    return ", ".join(parts)


EXPECTED = {
    "covers_one": "interval covers 1 (an A/A: no difference where there is none)",
    "within_smallest_effect": "interval inside the smallest effect of interest both ways (an "
    "A/A: shown to differ by less than matters)",
    "above_one": "interval above 1 (a handicap at the smallest effect of interest: found)",
}


def _power_lines(judged: dict, what: str) -> list[str]:
    power = judged.get("power_at_smallest")
    if not power or power.get("power") is None:
        return []
    return [
        f"  - power at the smallest effect of interest ({judged['smallest_effect']:g}) for "
        f"{what}: {power['power']:.2f} ({power['blocks']} blocks, SD of log ratios "
        f"{power['sd_log_ratio']:.3f}, two-sided t at alpha {judged['alpha']:g})"
    ]


def _rule(control: dict) -> str:
    """The rule a timed control was judged by (a record from before rules were named: v12's)."""
    return control.get("rule") or ("covers_one" if control["expect"] == "same" else "above_one")


def control_lines(controls: list[dict]) -> list[str]:
    """The timed controls' verdicts by the primary endpoint, each with its power."""
    if not controls:
        return []
    out = ["- **Controls by the primary endpoint** (the training loop, control/base arm):"]
    for c in controls:
        said = _ratio_text(c["judged"])
        out.append(
            f"  - {c['runs_as']}/{c['arm']} ({c['expect']}: {EXPECTED[_rule(c)]}): {said}; "
            f"**{c['verdict']}**"
        )
        out += ["  " + line for line in _power_lines(c["judged"], c["runs_as"])]
    return out


def lines(speed: dict) -> list[str]:
    """The markdown of the speed section."""
    out = ["## Speed: seconds per valid trajectory in timing blocks", ""]
    for pair in speed["pairs"]:
        loop = pair["wall_clock_s"]
        out.append(f"- **{loop['candidate']}/{loop['baseline']}**, per valid trajectory:")
        for clock, name in CLOCKS.items():
            out.append(f"  - {name}: {_ratio_text(pair[clock])}")
            sensitivity = pair[clock].get("sensitivity")
            if sensitivity and sensitivity.get("ratio") is not None:
                out.append(f"    - sensitivity, {sensitivity['rule']}: {_ratio_text(sensitivity)}")
    for pair in speed["pairs"]:
        out += _power_lines(pair["wall_clock_s"], pair["wall_clock_s"]["candidate"])
    out += control_lines(speed.get("controls") or [])
    cpu = speed["env_cpu_s_per_valid"]
    if cpu:
        out.append(
            "- environment CPU seconds per valid trajectory (median over kept blocks): "
            + ", ".join(f"{arm} {v:.3f}" if v is not None else f"{arm} –" for arm, v in cpu.items())
        )
    arms = sorted({arm for e in speed["executions"] for arm in e["windows"]})
    out += [
        "",
        "Every execution of every block, in the order run (kept: the block counts; a block past "
        "the registered load rule is run again and its earlier execution stays here):",
        "",
        "| block | run | seed | order | "
        + " | ".join(f"{a} s/valid (loop, provisioned) | {a} load" for a in arms)
        + " | kept |",
        "|---|---|---|---|" + "---|---|" * len(arms) + "---|",
    ]
    for e in speed["executions"]:
        cells = []
        for arm in arms:
            w = e["windows"].get(arm, {})
            cells.append(f"{_window_cell(w, 'wall_clock_s')}, {_window_cell(w, 'provisioned_s')}")
            cells.append(_load_cell(w))
        kept = (
            "yes"
            if e["admissible"]
            else "no: " + "; ".join(f"{a} {why}" for a, why in e["inadmissible"].items())
        )
        out.append(
            f"| {e['block']} | {e['execution']} | {e['seed']} | {' '.join(e['order'])} | "
            + " | ".join(cells)
            + f" | {kept} |"
        )
    return out + [""]
