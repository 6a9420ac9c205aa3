"""Learning-curve figures: held-out success against valid trajectories consumed and against
training wall-clock, every arm (and seed) on one figure per view, with Wilson intervals."""

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


def plot_curves(runs: list[RunRecords], threshold: float, out: str | Path, view: str) -> Path:
    x_key, x_label = VIEWS[view]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    arms = list(dict.fromkeys(r.arm for r in runs))
    colours = dict(zip(arms, plt.get_cmap("tab10").colors, strict=False))
    for run in sorted(runs, key=lambda r: (arms.index(r.arm), r.seed)):
        pts = points(run, x_key)
        if not pts:
            continue
        xs, rates, lows, highs = zip(*pts, strict=True)
        errors = [
            [r - lo for r, lo in zip(rates, lows, strict=True)],
            [hi - r for r, hi in zip(rates, highs, strict=True)],
        ]
        ax.errorbar(
            xs,
            rates,
            yerr=errors,
            marker="o",
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
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
