"""Learning-curve figures: held-out success against valid trajectories consumed and against
training wall-clock, every arm (and seed) on one figure per view, with Wilson intervals.

Each arm has its own line style and marker, and on the valid-trajectory view each arm is drawn a
little to the side of the next, so that two arms whose curves coincide are both seen, not one
drawn exactly under the other. Where they coincide by construction (each seed's checkpoints
identical file for file on every arm, so one evaluation record serves them all), the figure says
so: that agreement then shows the arms trained alike, not that evaluation found them alike."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on CI machines
import matplotlib.pyplot as plt  # noqa: E402

from envab.analysis.runs import RunRecords  # noqa: E402
from envab.analysis.statistics import wilson_interval  # noqa: E402

VIEWS = {
    "valid": ("valid_trajectories", "valid trajectories consumed"),
    "wallclock": ("wall_clock_s", "training wall-clock (s)"),
}


def points(run: RunRecords, x_key: str) -> list[tuple[float, float, float, float]]:
    """(x, rate, low, high) for each checkpoint with a scored evaluation."""
    out = []
    for checkpoint in sorted(run.checkpoints, key=lambda c: c["valid_trajectories"]):
        evaluation = run.evaluations.get(checkpoint["checkpoint"])
        if not evaluation or not evaluation.get("scored"):
            continue
        n = sum(len(o) for o in evaluation["tasks"].values())
        k = sum(sum(o) for o in evaluation["tasks"].values())
        low, high = wilson_interval(k, n)
        out.append((checkpoint[x_key], k / n, low, high))
    return out


STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]  # marker, line: one per arm


def shared_evaluations(runs: list[RunRecords]) -> bool:
    """Whether every seed's checkpoints share one evaluation record across the arms (the same
    evaluation key at every checkpoint both have): curves that coincide by construction."""
    by_seed: dict[int, list[RunRecords]] = {}
    for run in runs:
        by_seed.setdefault(run.seed, []).append(run)
    pairs = 0
    for seed_runs in by_seed.values():
        arms = {run.arm for run in seed_runs}
        if len(arms) < 2:
            continue
        keys = [
            {n: e.get("evaluation_key") for n, e in run.evaluations.items() if e}
            for run in seed_runs
        ]
        common = set.intersection(*(set(k) for k in keys))
        if not common or any(len({k[n] for k in keys}) != 1 for n in common):
            return False
        pairs += 1
    return pairs > 0


def plot_curves(runs: list[RunRecords], threshold: float, out: str | Path, view: str) -> Path:
    x_key, x_label = VIEWS[view]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    arms = list(dict.fromkeys(r.arm for r in runs))
    colours = dict(zip(arms, plt.get_cmap("tab10").colors, strict=False))
    every_x = [p[0] for run in runs for p in points(run, x_key)]
    # each arm a little to the side of the last on the valid view (x is shared there)
    dodge = 0.012 * (max(every_x) - min(every_x) or 1) if view == "valid" and every_x else 0.0
    for run in sorted(runs, key=lambda r: (arms.index(r.arm), r.seed)):
        pts = points(run, x_key)
        if not pts:
            continue
        index = arms.index(run.arm)
        marker, line = STYLES[index % len(STYLES)]
        xs, rates, lows, highs = zip(*pts, strict=True)
        xs = [x + (index - (len(arms) - 1) / 2) * dodge for x in xs]
        errors = [
            [r - lo for r, lo in zip(rates, lows, strict=True)],
            [hi - r for r, hi in zip(rates, highs, strict=True)],
        ]
        ax.errorbar(
            xs,
            rates,
            yerr=errors,
            marker=marker,
            linestyle=line,
            markerfacecolor="none" if index else colours[run.arm],
            capsize=3,
            color=colours[run.arm],
            label=f"{run.arm} seed {run.seed}",
            alpha=0.9,
        )
    ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel(x_label)
    ax.set_ylabel("held-out success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if len(arms) > 1 and shared_evaluations(runs):
        ax.set_title(
            "the arms coincide by construction: identical checkpoints, one evaluation each",
            fontsize=8,
        )
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
