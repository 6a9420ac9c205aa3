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

from statistics import median

from envab.analysis.blocks import judge_blocks, seconds_per_valid

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


def section(executions: list[dict], pairs: list[tuple[str, str]], alpha: float, smallest) -> dict:
    """Every pair's speed on both clocks, and the table of executions."""
    arms = sorted({arm for e in executions for arm in e["windows"]})
    return {
        "pairs": [
            {
                clock: judge_blocks(executions, baseline, candidate, alpha, smallest, clock)
                for clock in CLOCKS
            }
            for baseline, candidate in pairs
        ],
        "env_cpu_s_per_valid": {arm: env_cpu_per_valid(executions, arm) for arm in arms},
        "executions": executions,
    }


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
        ("outside_load", "out"),
        ("steal_fraction", "steal"),
        ("cpu_pressure_some", "PSI"),
    ):
        value = window.get(key)
        parts.append(f"{label} {value:.2f}" if value is not None else f"{label} –")
    return ", ".join(parts)


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
