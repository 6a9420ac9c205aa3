"""The outcome from run records: rows per arm and seed, coincidence first, honest about seeds."""

from __future__ import annotations

import json

import pytest

from analysis.outcome import NotComparable, Run, compute_outcome, render_markdown
from envab.io import write_jsonl

TARGET = {
    "experiment_id": "exp",
    "question": "Faster  or\ncheaper?",
    "target": {"metric": "heldout_success_rate", "threshold": 0.5},
    "arms": ["restore", "drums"],
    "coincidence": {"margin": 0.15, "bootstrap_samples": 500, "confidence": 0.95},
}


def write_run(root, arm, seed, rates, seconds_per_valid, comparable="same", tasks=40):
    """A run directory with one checkpoint per 32 valid trajectories and its held-out rates."""
    run = root / arm / f"seed{seed}"
    (run / "eval").mkdir(parents=True)
    pins = {"arm": arm, "seed": seed, "comparable_sha256": comparable}
    (run / "pins.json").write_text(json.dumps(pins))
    checkpoints = []
    for i, rate in enumerate(rates, 1):
        name = f"ckpt-{i:03d}"
        valid = 32 * i
        checkpoints.append(
            {
                "checkpoint": name,
                "due_at_valid": valid,
                "valid_trajectories": valid,
                "invalid_discarded": i,
                "wall_clock_s": seconds_per_valid * valid,
                "env_cost_usd": 0.001 * i,
                "inference_cost_usd": 0.002 * i,
            }
        )
        outcomes = {f"t{k}": [int(k < round(rate * tasks))] for k in range(tasks)}
        (run / "eval" / f"{name}.json").write_text(
            json.dumps(
                {
                    "scored": True,
                    "success_rate": rate,
                    "tasks": outcomes,
                    "wall_s": 1.0,
                    "cost_usd": 0.0,
                }
            )
        )
    write_jsonl(run / "checkpoints.jsonl", checkpoints)
    final = {**checkpoints[-1], "stop_reason": "max_valid_trajectories"}
    (run / "run.json").write_text(json.dumps(final))
    return run


def test_both_arms_one_seed_each(tmp_path):
    runs = [
        Run.load(write_run(tmp_path, "restore", 1, [0.2, 0.4, 0.6], 2.0)),
        Run.load(write_run(tmp_path, "drums", 1, [0.2, 0.4, 0.6], 1.0)),
    ]
    outcome = compute_outcome(runs, TARGET)
    rows = {r["arm"]: r for r in outcome["runs"]}
    assert rows["restore"]["reached"] and rows["drums"]["reached"]
    assert rows["restore"]["wall_clock_s"] == 192.0 and rows["drums"]["wall_clock_s"] == 96.0
    assert outcome["coincidence"][0]["verdict"] == "coincide"
    assert outcome["arms"]["drums"]["variance"].startswith("one seed per arm")
    assert len(outcome["inputs"]) == 2 * (3 + 3)
    text = render_markdown(outcome)
    assert "| drums | 1 | reached at ckpt-003 |" in text
    assert "Faster or cheaper?" in text


def test_never_reached_and_a_gap_shown_first(tmp_path):
    runs = [
        Run.load(write_run(tmp_path, "restore", 1, [0.3, 0.6, 0.8], 2.0)),
        Run.load(write_run(tmp_path, "drums", 1, [0.0, 0.1, 0.2], 1.0)),
    ]
    outcome = compute_outcome(runs, TARGET)
    drums = next(r for r in outcome["runs"] if r["arm"] == "drums")
    assert drums["reached"] is False and drums["final_heldout_success_rate"] == 0.2
    assert outcome["coincidence"][0]["verdict"] == "differ"
    text = render_markdown(outcome)
    assert text.index("the environment changed the data") < text.index("## Time to target")
    assert "never reached target" in text


def test_runs_pinned_differently_are_not_compared(tmp_path):
    runs = [
        Run.load(write_run(tmp_path, "restore", 1, [0.5], 2.0, comparable="a")),
        Run.load(write_run(tmp_path, "drums", 1, [0.5], 1.0, comparable="b")),
    ]
    with pytest.raises(NotComparable, match="pinned to different things"):
        compute_outcome(runs, TARGET)


def test_several_seeds_give_a_spread(tmp_path):
    runs = [
        Run.load(write_run(tmp_path, arm, seed, [0.4, 0.6], speed))
        for arm, speed in (("restore", 2.0), ("drums", 1.0))
        for seed in (1, 2, 3)
    ]
    outcome = compute_outcome(runs, TARGET)
    assert outcome["arms"]["drums"]["seeds"] == 3
    assert outcome["arms"]["drums"]["time_to_target_s"]["mean"] == 64.0


def test_curve_figures_are_written_for_both_views(tmp_path):
    from analysis.figures import plot_curves, points

    runs = [
        Run.load(write_run(tmp_path / "runs", "restore", 1, [0.2, 0.5], 2.0)),
        Run.load(write_run(tmp_path / "runs", "drums", 1, [0.25, 0.5], 1.0)),
    ]
    assert [p[:2] for p in points(runs[1], "valid_trajectories")] == [(32, 0.25), (64, 0.5)]
    for view in ("valid", "wallclock"):
        out = plot_curves(runs, 0.5, tmp_path / f"{view}.png", view)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
