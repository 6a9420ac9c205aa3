"""What an experiment's episodes held, per run: attempts, valid and invalid, the turns and
actions of each, the scores; and the same for its held-out evaluations.

    python bench/trajectory_turns.py [--directory DIR] --experiment ID

Reads `results/<experiment>/<run>/seed<k>/trajectories.jsonl` (training attempts) and
`results/<experiment>/<run>/seed<k>/eval/*.json` (each checkpoint's held-out episodes) under
DIR (default: the checkout) and prints one Markdown table for each. A multi-turn rehearsal is
expected to show several turns for most attempts; an attempt of 0 turns ended without a call.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pandas as pd

from envab.layout import Layout

REPO = Path(__file__).resolve().parent.parent


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def summary(episodes: list[dict]) -> dict:
    turns = Counter(e.get("turns", 0) for e in episodes)
    valid = [e for e in episodes if e.get("verdict") == "valid"]
    scores = [e["score"] for e in valid if e.get("score") is not None]
    return {
        "episodes": len(episodes),
        "valid": len(valid),
        "invalid": len(episodes) - len(valid),
        "turns (count)": ", ".join(f"{t}: {n}" for t, n in sorted(turns.items())),
        "share with >= 2 turns": round(
            sum(n for t, n in turns.items() if t >= 2) / len(episodes), 2
        )
        if episodes
        else None,
        "mean actions": round(sum(e.get("actions", 0) for e in episodes) / len(episodes), 2)
        if episodes
        else None,
        "mean score (valid)": round(sum(scores) / len(scores), 3) if scores else None,
        "invalid gates": ", ".join(
            f"{g}: {n}"
            for g, n in sorted(
                Counter(e["failed_gates"][0] for e in episodes if e.get("failed_gates")).items()
            )
        )
        or "-",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--directory", type=Path, default=REPO)
    p.add_argument("--experiment", required=True)
    args = p.parse_args()
    results = Layout(args.experiment, args.directory).results
    training, heldout = [], []
    for run in sorted(results.glob("*/seed*/trajectories.jsonl")):
        name = f"{run.parent.parent.name} {run.parent.name}"
        training.append({"run": name, **summary(lines(run))})
        evals = [
            e
            for f in sorted((run.parent / "eval").glob("*.json"))
            for e in json.loads(f.read_text()).get("episode_records", [])
        ]
        if evals:
            heldout.append({"run": name, **summary(evals)})
    print("Training attempts:\n")
    print(pd.DataFrame(training).to_markdown(index=False))
    print("\nHeld-out episodes, every checkpoint:\n")
    print(pd.DataFrame(heldout).to_markdown(index=False) if heldout else "(none)")


if __name__ == "__main__":
    main()
