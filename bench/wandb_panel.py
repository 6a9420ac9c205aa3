"""The wandb panel a user builds to compare the arms, drawn from the offline runs themselves.

    .venv/bin/python bench/wandb_panel.py --experiment embedded-default-v15 --out panel.png \
        [--directory .]

Reads every offline run under results/<exp>/wandb with wandb's own reader (`wandb leet inspect
--json`, as tests/test_answer.py does), keeps the A/B's group (the controls are in
`<exp>-controls`) and its held-out runs (`eval-<arm>-seed<k>`), and draws what the wandb app
shows once the runs are synced, grouped by the tag `arm:`: `heldout/success_rate` against
`valid_trajectories` and `heldout_wall_clock/success_rate` against `wall_clock_s`, a line per
seed, a colour per arm. Nothing is uploaded; the figure is the app's panel, not a screenshot.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from envab.layout import Layout  # noqa: E402

PANELS = (
    ("valid_trajectories", "heldout/success_rate", "valid trajectories"),
    ("wall_clock_s", "heldout_wall_clock/success_rate", "training wall-clock, s"),
)


def offline_runs(folder: Path) -> list[dict]:
    """Each offline run's record and history rows, read by wandb's own reader."""
    wandb = Path(sys.executable).parent / "wandb"
    runs = []
    for file in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        out = subprocess.run(
            [str(wandb), "leet", "inspect", "--json", str(file)],
            capture_output=True,
            text=True,
            check=True,
        )
        records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        run = next(r["run"] for r in records if r["type"] == "run")
        history = [r["history"]["item"] for r in records if r["type"] == "history"]
        runs.append({"run": run, "history": history})
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", required=True, help="the experiment id")
    parser.add_argument("--directory", type=Path, default=Path("."), help="the workflow's folder")
    parser.add_argument("--out", type=Path, required=True, help="writes: the panel, PNG")
    args = parser.parse_args()
    runs = offline_runs(Layout(args.experiment, args.directory).results / "wandb")
    ab = [
        r
        for r in runs
        if r["run"].get("run_group") == args.experiment
        and r["run"]["display_name"].startswith("eval-")
    ]
    if not ab:
        print(f"no A/B held-out runs in group {args.experiment}", file=sys.stderr)
        return 2
    arms = sorted({t.removeprefix("arm:") for r in ab for t in r["run"]["tags"] if t[:4] == "arm:"})
    colours = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (x, y, label) in zip(axes, PANELS, strict=True):
        for r in sorted(ab, key=lambda r: r["run"]["display_name"]):
            arm = next(t[4:] for t in r["run"]["tags"] if t[:4] == "arm:")
            points = sorted((row[x], row[y]) for row in r["history"] if y in row)
            # the arms' held-out curves coincide here by construction: dashed over solid
            style = "--" if arm == arms[-1] else "-"
            ax.plot(*zip(*points, strict=True), style, color=colours[arm], alpha=0.8,
                    label=arm if r["run"]["display_name"].endswith("seed1") else None)  # fmt: skip
        ax.set_xlabel(label)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[0].legend(title="group by arm")
    fig.suptitle(f"{args.experiment}: wandb's panels from the offline runs, a line per seed")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"{len(ab)} runs, arms {', '.join(arms)}: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
