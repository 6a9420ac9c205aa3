"""Sizing a study from a pilot: the SD's uncertainty is shown, and the registered analysis is
simulated with its censoring (analysis/power.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from statsmodels.stats.power import TTestPower

from envab.analysis.power import Pilot, PilotTooSmall, main, sd_interval, simulate, size
from envab.analysis.survival import SeedTime

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "preregistration" / "target.yaml"  # arms [qemu, drums]


def pilot(sd_ratio: float, budget: float = 1e9, pairs: int = 5) -> Pilot:
    return Pilot(
        pairs=pairs,
        mean_log_baseline=math.log(600.0),
        sd_log_baseline=0.2,
        sd_log_ratio=sd_ratio,
        baseline_reached=pairs,
        budget=budget,
    )


def test_the_sd_interval_covers_the_true_sd_at_its_confidence():
    rng = np.random.default_rng(1)
    draws = rng.normal(0.0, 0.3, (20_000, 3))
    sds = draws.std(axis=1, ddof=1)
    covered = [low <= 0.3 <= high for low, high in (sd_interval(s, 3, 0.8) for s in sds)]
    assert abs(np.mean(covered) - 0.8) < 0.015


def test_without_censoring_the_simulated_analysis_has_the_closed_form_power():
    """With a budget no seed reaches, the simulation is the paired t-test seeds_needed sizes:
    their powers agree within Monte Carlo error (4,000 studies: about 0.007)."""
    for seeds in (3, 6, 10):
        simulated = simulate(pilot(0.4), 1.5, seeds, 0.05, 4000, np.random.default_rng(seeds))
        effect = math.log(1.5) / 0.4
        closed = TTestPower().power(effect_size=effect, nobs=seeds, alpha=0.05)
        assert simulated["power"] == pytest.approx(closed, abs=0.03)
        assert simulated["coverage_95"] == pytest.approx(0.95, abs=0.015)
        assert simulated["censored_share"] == 0.0


def test_censoring_at_the_budget_changes_what_the_closed_form_promises():
    """A budget that censors most baseline seeds (its median 600 s, the candidate's 400 s, the
    budget 450 s) shrinks the measured ratio towards 1: more seeds are needed than the closed
    form says, and the t interval misses the true ratio far more often than 5 %."""
    free = size(pilot(0.4), 1.5, draws=3000, registered_seeds=5)
    tight = size(pilot(0.4, budget=450.0), 1.5, draws=3000, registered_seeds=5)
    assert free["closed_form"] == tight["closed_form"]  # it cannot see the budget
    assert tight["simulated"]["seeds_needed"] > free["simulated"]["seeds_needed"]
    assert tight["at_registered_seeds"]["censored_share"] > 0.5
    assert tight["at_registered_seeds"]["coverage_95"] < 0.85
    assert free["at_registered_seeds"]["coverage_95"] == pytest.approx(0.95, abs=0.02)


def test_three_pairs_show_how_little_they_pin_the_seed_count_down():
    form = size(pilot(0.3, pairs=3), 1.5, draws=500)["closed_form"]
    assert form["seeds_at_lower_sd"] <= form["seeds_at_estimate"] < form["seeds_at_upper_sd"]
    assert form["seeds_at_upper_sd"] >= 5 * form["seeds_at_estimate"]


def seeds(times: list[float | None]) -> list[SeedTime]:
    return [
        SeedTime(i + 1, t is not None, t if t is not None else 1200.0) for i, t in enumerate(times)
    ]


def test_a_pilot_too_small_to_size_anything_is_refused():
    with pytest.raises(PilotTooSmall, match="2 paired seed"):
        Pilot.from_seeds(seeds([500, 600]), seeds([400, 450]), 1200)
    with pytest.raises(PilotTooSmall, match="does not reach it"):
        Pilot.from_seeds(seeds([None, None, 900]), seeds([400, 450, 500]), 1200)


def outcome_rows(arm: str, times: list[float | None]) -> list[dict]:
    return [
        {
            "arm": arm,
            "seed": i + 1,
            "reached": t is not None,
            "wall_clock_s": t,
            "valid_trajectories": None,
            "last_look_before": None,
        }
        for i, t in enumerate(times)
    ]


def test_the_command_sizes_from_a_pilots_outcome(tmp_path, capsys):
    outcome = tmp_path / "outcome.json"
    rows = outcome_rows("qemu", [640, 700, 580, 820]) + outcome_rows("drums", [470, 520, 500, 600])
    outcome.write_text(json.dumps({"runs": rows}))
    out = tmp_path / "power.json"
    argv = ["--target", str(TARGET), "--outcome", str(outcome), "--speedup", "1.3"]
    assert main([*argv, "--seeds", "5", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Pilot: 4 paired seeds in wall_clock_s" in printed
    sizing = json.loads(out.read_text())
    registered = yaml.safe_load(TARGET.read_text())["budget"]["max_wall_clock_s"]
    assert sizing["pilot"]["budget"] == registered  # the registered cap censors the pilot
    assert sizing["at_registered_seeds"]["seeds"] == 5
    form = sizing["closed_form"]
    assert form["seeds_at_estimate"] <= form["seeds_at_upper_sd"]

    outcome.write_text(json.dumps({"runs": rows[:2] + rows[4:6]}))
    assert main(argv) != 0
    assert "a pilot needs at least 3 seeds" in capsys.readouterr().err
