"""The outcome from run records: rows per arm and seed, coincidence first, honest about seeds; and
`python -m envab.analysis.outcome` reading and writing exactly the files it is given."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from conftest import SHIPPED_EXP as EXP
from conftest import SHIPPED_TARGET, keep_timed_controls

from envab.analysis import run_table
from envab.analysis.figures import plot_curves, points
from envab.analysis.outcome import NotComparable, compute_outcome, render_markdown
from envab.analysis.runs import RunRecords
from envab.hashing import sha256_file
from envab.io import write_jsonl
from envab.preregistration import check_frozen, freeze

REPO = Path(__file__).resolve().parent.parent

# The pre-registration's shape as the analysis reads it (envab.preregistration.Preregistration).
PREREG = SimpleNamespace(
    experiment_id="exp",
    question="Faster or cheaper?",
    target=SimpleNamespace(
        metric="heldout_success_rate", threshold=0.5, crossing={"rule": "first_crossing"}
    ),
    threshold=0.5,
    arms=("restore", "drums"),
    seeds=(1, 2, 3),
    budget=SimpleNamespace(max_wall_clock_s=1000.0, max_valid_trajectories=256),
    prices=SimpleNamespace(host=lambda arm: 0.1),
    coincidence=SimpleNamespace(margin=0.15, bootstrap_samples=500, confidence=0.95),
    equivalence=None,
)


def write_run(
    root, arm, seed, rates, seconds_per_valid, comparable="same", tasks=40, steps=None, start=1
) -> dict:
    """One run's files, with one checkpoint per 32 valid trajectories and its held-out rates
    (`start=0`: the first rate is the warm start's, at 0 valid trajectories); returns them as
    RunRecords.load takes them."""
    run = Path(root) / arm / f"seed{seed}"
    (run / "eval").mkdir(parents=True)
    pins = {
        "arm": arm,
        "seed": seed,
        "experiment_id": EXP,
        "comparable_sha256": comparable,
        "training": {"tools": "click"},
        "arm_config": {},
        "receipts": {},
        "software": {},
    }
    (run / "pins.json").write_text(json.dumps(pins))
    checkpoints, evaluations = [], []
    for i, rate in enumerate(rates, start):
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
        evaluation = run / "eval" / f"{name}.json"
        evaluation.write_text(
            json.dumps(
                {
                    "scored": True,
                    "success_rate": rate,
                    "successes": sum(o[0] for o in outcomes.values()),
                    "episodes": tasks,
                    "tasks": outcomes,
                    "wall_s": 1.0,
                    "cost_usd": 0.0,
                }
            )
        )
        evaluations.append(evaluation)
    write_jsonl(run / "checkpoints.jsonl", checkpoints)
    load = {"cpu_hours": 0.5, "cores": 2, "machine_busy_fraction": 0.75, "steal_fraction": 0.0}
    load["loadavg_1_5_15"] = [1.5, 1.0, 0.5]
    final = {**checkpoints[-1], "stop_reason": "max_valid_trajectories", "load": load}
    (run / "run.json").write_text(json.dumps(final))
    files = {
        "pins": run / "pins.json",
        "checkpoints": run / "checkpoints.jsonl",
        "run": run / "run.json",
        "evaluations": evaluations,
    }
    if steps is not None:
        write_jsonl(run / "steps.jsonl", steps)
        files["steps"] = run / "steps.jsonl"
    return files


def load(*args, **kwargs) -> RunRecords:
    return RunRecords.load(**write_run(*args, **kwargs))


def test_run_records_read_exactly_the_files_named(tmp_path):
    files = write_run(tmp_path, "drums", 1, [0.25, 0.5], 1.0)
    stray = files["pins"].parent / "eval" / "ckpt-999.json"  # in the folder, but not named
    stray.write_text("not JSON: reading it would fail")
    run = RunRecords.load(
        files["pins"], files["checkpoints"], files["run"], reversed(files["evaluations"])
    )
    assert (run.arm, run.seed) == ("drums", 1)
    assert list(run.evaluations) == ["ckpt-001", "ckpt-002"]  # named by stem, in path order
    assert run.evaluations["ckpt-002"]["success_rate"] == 0.5
    assert [c["checkpoint"] for c in run.checkpoints] == ["ckpt-001", "ckpt-002"]
    assert run.final["stop_reason"] == "max_valid_trajectories"
    named = [files["pins"], files["checkpoints"], files["run"], *files["evaluations"]]
    assert run.inputs == {p.as_posix(): sha256_file(p) for p in named}


def test_two_evaluations_of_one_checkpoint_are_refused(tmp_path):
    a = write_run(tmp_path / "a", "drums", 1, [0.5], 1.0)
    b = write_run(tmp_path / "b", "drums", 1, [0.5], 1.0)
    with pytest.raises(ValueError, match=r"checkpoint\(s\) \['ckpt-001'\]"):
        RunRecords.load(**{**a, "evaluations": a["evaluations"] + b["evaluations"]})


def test_both_arms_one_seed_each(tmp_path):
    runs = [
        load(tmp_path, "restore", 1, [0.2, 0.4, 0.6], 2.0),
        load(tmp_path, "drums", 1, [0.2, 0.4, 0.6], 1.0),
    ]
    outcome = compute_outcome(runs, PREREG)
    rows = {r["arm"]: r for r in outcome["runs"]}
    assert rows["restore"]["reached"] and rows["drums"]["reached"]
    assert rows["restore"]["wall_clock_s"] == 192.0 and rows["drums"]["wall_clock_s"] == 96.0
    assert outcome["coincidence"][0]["verdict"] == "coincide"
    assert outcome["arms"]["drums"]["variance"].startswith("one seed per arm")
    assert len(outcome["inputs"]) == 2 * (3 + 3)
    assert outcome["target"] == {"metric": "heldout_success_rate", "threshold": 0.5}
    assert outcome["experiment_id"] == "exp" and outcome["question"] == "Faster or cheaper?"
    text = render_markdown(outcome)
    assert "| drums | 1 | reached at ckpt-003 |" in text
    assert (
        "**Target.** heldout_success_rate ≥ 0.5 (pre-registered), crossed by the rule "
        "`first_crossing`." in text
    )


def test_the_first_registered_arm_is_the_baseline(tmp_path):
    runs = [
        load(tmp_path, "drums", 1, [0.2, 0.4], 1.0),
        load(tmp_path, "restore", 1, [0.2, 0.4], 2.0),
    ]
    outcome = compute_outcome(runs, PREREG)
    assert [r["arm"] for r in outcome["runs"]] == ["restore", "drums"]
    check = outcome["coincidence"][0]
    assert (check["baseline"], check["candidate"]) == ("restore", "drums")


def test_never_reached_and_a_gap_shown_first(tmp_path):
    runs = [load(tmp_path, "restore", seed, [0.3, 0.6, 0.8], 2.0) for seed in (1, 2)]
    runs += [load(tmp_path, "drums", seed, [0.0, 0.1, 0.2], 1.0) for seed in (1, 2)]
    outcome = compute_outcome(runs, PREREG)
    drums = next(r for r in outcome["runs"] if r["arm"] == "drums")
    assert drums["reached"] is False and drums["final_heldout_success_rate"] == 0.2
    assert outcome["coincidence"][0]["verdict"] == "differ"
    text = render_markdown(outcome)
    assert text.index("the environment changed the data") < text.index("## Time to target")
    assert "never reached target" in text


def test_one_seed_per_arm_makes_no_arm_level_claim(tmp_path):
    """No unit of replication: no p-value anywhere, no curve verdict; exact divergence only."""
    runs = [
        load(tmp_path, "restore", 1, [0.3, 0.6, 0.8], 2.0),
        load(tmp_path, "drums", 1, [0.0, 0.1, 0.2], 1.0),
    ]
    outcome = compute_outcome(runs, PREREG)
    text = render_markdown(outcome)
    claim = "one seed per arm: no replication, no arm-level claim"
    assert outcome["primary"][0]["verdict"] == claim
    assert all(f["p_value"] is None for f in outcome["secondary"])
    assert outcome["across_seeds"][0]["logrank"]["p_value"] is None
    assert "the environment changed the data" not in text and "p = " not in text
    assert "p 0" not in text and "p 1" not in text
    assert text.index(claim) < text.index("exact divergence")


def test_every_run_shows_its_reward_consistency(tmp_path):
    """Secondary and descriptive: same task, same actions, same reward; no test is run."""
    flaky = [
        {"task_id": "t1", "actions_sha256": "a", "verdict": "valid", "reward": r}
        for r in (1.0, 0.0, 1.0)
    ]
    runs = [
        load(tmp_path, "restore", 1, [0.2, 0.4, 0.6], 2.0),
        load(tmp_path, "drums", 1, [0.2, 0.4, 0.6], 1.0),
    ]
    runs[1].trajectories = flaky
    outcome = compute_outcome(runs, PREREG)
    rows = {r["arm"]: r["reward_consistency"] for r in outcome["runs"]}
    assert rows["restore"]["verdict"] == "not checked"
    assert (rows["drums"]["comparable_groups"], rows["drums"]["disagreeing_groups"]) == (1, 1)
    text = render_markdown(outcome)
    assert "## Reward consistency (secondary, descriptive)" in text
    assert "- drums seed 1: 1 of 1 comparable groups disagree (3 of 3 valid attempts" in text
    assert "- restore seed 1: not checked (no trajectories.jsonl)" in text


def test_runs_pinned_differently_are_not_compared(tmp_path):
    runs = [
        load(tmp_path, "restore", 1, [0.5], 2.0, comparable="a"),
        load(tmp_path, "drums", 1, [0.5], 1.0, comparable="b"),
    ]
    with pytest.raises(NotComparable, match="pinned to different things"):
        compute_outcome(runs, PREREG)


def test_several_seeds_are_compared_with_a_never_reached_seed_censored(tmp_path):
    runs = [load(tmp_path, "drums", seed, [0.4, 0.6], 1.0) for seed in (1, 2, 3)]
    runs += [load(tmp_path, "restore", seed, [0.4, 0.6], 2.0) for seed in (1, 2)]
    runs += [load(tmp_path, "restore", 3, [0.4, 0.45], 2.0)]  # never reaches 0.5
    outcome = compute_outcome(runs, PREREG)
    assert outcome["arms"]["restore"] == {
        "seeds": 3,
        "reached": 2,
        "censored": 1,
        "variance": "3 seeds",
    }
    check = outcome["across_seeds"][0]
    assert (check["baseline"], check["candidate"]) == ("restore", "drums")
    km = check["kaplan_meier"]
    assert km["restore"]["seeds"] == 3 and km["restore"]["censored"] == 1  # kept, not dropped
    assert km["drums"]["median"] == 64.0 and km["restore"]["median"] == 128.0
    assert check["rmst"]["by_arm"]["drums"] < check["rmst"]["by_arm"]["restore"]
    ratio = check["paired_log_ratio"]
    assert ratio["pairs"] == 3 and ratio["censored_pairs"]["a_censored"] == [3]
    text = render_markdown(outcome)
    assert "## Across seeds (a seed that never reached the target is censored)" in text
    assert "restore 128.0 s (1 censored)" in text


def test_curve_figures_are_written_for_both_views(tmp_path):
    runs = [
        load(tmp_path / "runs", "restore", 1, [0.2, 0.5], 2.0),
        load(tmp_path / "runs", "drums", 1, [0.25, 0.5], 1.0),
    ]
    assert [p[:2] for p in points(runs[1], "valid_trajectories")] == [(32, 0.25), (64, 0.5)]
    for view in ("valid", "wallclock"):
        out = plot_curves(runs, 0.5, tmp_path / f"{view}.png", view)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_run_table_from_named_files(tmp_path):
    files = write_run(tmp_path, "drums", 1, [0.25, 0.5], 1.0)
    out = tmp_path / "curve.csv"
    evals = [str(e) for e in files["evaluations"][:1]]  # the second checkpoint not evaluated
    argv = ["--target", str(SHIPPED_TARGET)]
    argv += ["--pins", str(files["pins"]), "--checkpoints", str(files["checkpoints"])]
    argv += ["--run", str(files["run"]), "--evals", *evals, "--out", str(out)]
    argv += ["--wandb-dir", str(tmp_path / "wandb")]
    assert run_table.main(argv) == 0
    table = pd.read_csv(out)
    assert list(table.columns) == run_table.COLUMNS
    assert table["checkpoint"].tolist() == ["ckpt-001", "ckpt-002"]
    assert table["heldout_success_rate"].iloc[0] == 0.25
    assert table["scored"].tolist() == [True, False]


FROZEN = f"receipts/{EXP}/preregistration.json"
TARGET = ["--target", "prereg/target.yaml", "--receipts", FROZEN]


def timing_execution(block: int, drums_s: float, restore_s: float) -> dict:
    """One timing block's record as trainer/timing.py writes it, both arms' windows of 64."""

    def window(position: int, loop: float) -> dict:
        return {
            "position": position,
            "exit": 0,
            "valid_trajectories": 64,
            "invalid_discarded": 0,
            "wall_clock_s": loop,
            "provisioned_s": loop + 2.0,
            "process_s": loop + 12.0,
            "tree_cpu_s": 2 * loop,
            "env_cpu_s": loop,
            "outside_load": 0.01,
            "steal_fraction": 0.0,
            "cpu_pressure_some": 0.02,
            "steps_sha256": "0" * 64,
        }

    return {
        "block": block,
        "execution": 0,
        "seed": 1,
        "order": ["restore", "drums"],
        "windows": {"restore": window(0, restore_s), "drums": window(1, drums_s)},
        "admissible": True,
        "inadmissible": {},
    }


def frozen_target(root: Path, monkeypatch) -> Path:
    """The shipped pre-registration with this test's arms and a 0.7 threshold, frozen under `root`
    (the working directory, where the outcome CLI looks for the receipt)."""
    target = yaml.safe_load(SHIPPED_TARGET.read_text())
    target["target"]["threshold"] = 0.7
    target["arms"] = ["restore", "drums"]
    target["prices"]["host_usd_per_hour"] = {"restore": 0.1, "drums": 0.1}
    target["evaluation"]["backend"] = "restore"
    # the shipped controls on the qemu arm (its A/A) go with it, from the blocks too
    target["controls"] = [c for c in target["controls"] if c["arm"] in target["arms"]]
    keep_timed_controls(target)
    path = root / "prereg" / "target.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(target, sort_keys=False))
    monkeypatch.chdir(root)
    freeze(path.relative_to(root))
    return path


def outcome_cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envab.analysis.outcome", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_outcome_cli_reads_and_writes_the_files_it_is_given(tmp_path, monkeypatch):
    frozen_target(tmp_path, monkeypatch)
    run_args, named = [], []
    for arm, speed in (("restore", 2.0), ("drums", 1.0)):
        files = write_run(tmp_path / "in", arm, 1, [0.2, 0.5], speed)
        paths = [files["pins"], files["checkpoints"], files["run"], *files["evaluations"]]
        relative = [p.relative_to(tmp_path).as_posix() for p in paths]
        run_args += ["--run", *relative]
        named += relative
    # the shipped registration's primary endpoint is measured in timing blocks: two of them
    timing = tmp_path / "in" / "blocks.jsonl"
    executions = [timing_execution(block, drums_s=4.0 + block, restore_s=16.0) for block in (0, 1)]
    timing.write_text("".join(json.dumps(e) + "\n" for e in executions))
    receipt = "receipts/exp/outcome.json"
    outputs = {
        "--outcome-json": "out/a/answer.json",
        "--outcome-md": "out/b/answer.md",
        "--curves-valid": "out/c/valid.png",
        "--curves-wallclock": "out/d/wallclock.png",
        "--receipt": receipt,
        "--timing": timing.relative_to(tmp_path).as_posix(),
    }
    result = outcome_cli(
        tmp_path,
        *TARGET,
        *run_args,
        *[x for pair in outputs.items() for x in pair],
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "out").rglob("*")) == [
        "out/a",
        "out/a/answer.json",
        "out/b",
        "out/b/answer.md",
        "out/c",
        "out/c/valid.png",
        "out/d",
        "out/d/wallclock.png",
    ]
    outcome = json.loads((tmp_path / "out/a/answer.json").read_text())
    assert outcome["experiment_id"] == EXP
    assert outcome["target"] == {"metric": "heldout_success_rate", "threshold": 0.7}
    assert "  " not in outcome["question"] and outcome["question"].startswith("If only")
    assert [(r["arm"], r["seed"]) for r in outcome["runs"]] == [("restore", 1), ("drums", 1)]
    assert sorted(outcome["inputs"]) == sorted(named)
    # The same answer as computed in-process from the same files.
    runs = [RunRecords.load(*named[i : i + 3], named[i + 3 : i + 5]) for i in (0, 5)]
    expected = compute_outcome(runs, check_frozen("prereg/target.yaml", FROZEN), executions)
    assert outcome == json.loads(json.dumps(expected))
    markdown = (tmp_path / "out/b/answer.md").read_text()
    assert markdown == render_markdown(expected) and markdown in result.stdout
    # the shipped registration times its drums A/A and handicap in the blocks; these blocks have
    # no window of them, so neither is a pass, and the primary endpoint's line says so
    timed = {c["runs_as"]: c["verdict"] for c in outcome["speed"]["controls"]}
    assert timed == {"drums-aa": "not tested", "drums-handicap": "not tested"}
    assert (
        "drums-aa not tested; drums-handicap not tested**: the blocks' speed verdict is not "
        "backed by its controls" in markdown
    )
    for figure in ("out/c/valid.png", "out/d/wallclock.png"):
        assert (tmp_path / figure).read_bytes()[:4] == b"\x89PNG"
    statement = json.loads((tmp_path / receipt).read_text())
    subjects = [s["name"] for s in statement["subject"]]
    assert subjects[:4] == [outputs[k] for k in list(outputs)[:4]]
    assert sorted(subjects[4:]) == sorted([*named, outputs["--timing"]])
    assert [d["name"] for d in statement["predicate"]["depends_on"]] == [FROZEN]
    # the old coincidence check is not a verdict of the receipt; the primary and curves are
    predicate = statement["predicate"]
    assert "coincidence" not in predicate
    claim = "one seed per arm: no replication, no arm-level claim"
    # speed is judged over the blocks, not the seeds: two blocks give an interval
    assert predicate["primary"] == {"drums/restore": expected["primary"][0]["verdict"]}
    assert expected["primary"][0]["blocks"] == 2 and expected["primary"][0]["ratio"] < 1
    assert predicate["curves"] == {"drums/restore": claim}


def test_outcome_cli_refuses_a_missing_file_and_writes_nothing(tmp_path, monkeypatch):
    frozen_target(tmp_path, monkeypatch)
    files = write_run(tmp_path, "restore", 1, [0.5], 1.0)
    files["run"].unlink()
    run = [str(files[k]) for k in ("pins", "checkpoints", "run")]
    outputs = ["--outcome-json", "o.json", "--outcome-md", "o.md", "--curves-valid", "v.png"]
    outputs += ["--curves-wallclock", "w.png", "--receipt", "r.json"]
    result = outcome_cli(tmp_path, *TARGET, "--run", *run, *outputs)
    assert result.returncode == 2 and "error:" in result.stderr and "run.json" in result.stderr
    assert not any((tmp_path / name).exists() for name in ("o.json", "o.md", "v.png", "r.json"))
    short = outcome_cli(tmp_path, *TARGET, "--run", run[0], *outputs)
    assert short.returncode == 2 and "give pins.json, checkpoints.jsonl, run.json" in short.stderr


def test_outcome_cli_refuses_an_unfrozen_target(tmp_path):
    shutil.copytree(REPO / "preregistration", tmp_path / "prereg")
    files = write_run(tmp_path, "drums", 1, [0.5], 1.0)
    run = [str(files[k]) for k in ("pins", "checkpoints", "run")]
    outputs = ["--outcome-json", "o.json", "--outcome-md", "o.md", "--curves-valid", "v.png"]
    outputs += ["--curves-wallclock", "w.png", "--receipt", "r.json"]
    result = outcome_cli(tmp_path, *TARGET, "--run", *run, *outputs)
    assert result.returncode == 2 and "not frozen yet" in result.stderr


def test_pre_registered_rule_and_equivalence_reach_the_outcome(tmp_path):
    from dataclasses import replace

    from envab.preregistration import Equivalence

    prereg = SimpleNamespace(**vars(PREREG))
    prereg.target = SimpleNamespace(**vars(PREREG.target))
    prereg.target.crossing = {"rule": "lower_bound", "confidence": 0.95}
    prereg.equivalence = Equivalence(0.2, 0.5, 0.95, 500, 1.5)  # margin 0.5 x (0.5 - 0.2)
    # 0.55 of 40 clears 0.5 as a sampled rate but not by its lower bound; 0.9 does. Two seeds
    # per arm: with one the curve check makes no claim.
    runs = [load(tmp_path, "restore", seed, [0.55, 0.9], 2.0) for seed in (1, 2)]
    runs += [load(tmp_path, "drums", seed, [0.55, 0.9], 1.0) for seed in (1, 2)]
    outcome = compute_outcome(runs, prereg)
    rows = {r["arm"]: r for r in outcome["runs"]}
    assert rows["drums"]["checkpoint"] == "ckpt-002"  # first_crossing would say ckpt-001
    assert rows["drums"]["last_look_before"]["checkpoint"] == "ckpt-001"
    check = outcome["equivalence"][0]
    assert check["curves"]["verdict"] == "equivalent"  # the same outcomes on both arms
    assert check["curves"]["margin"] == replace(prereg.equivalence).margin(0.5)
    assert check["convergence_ratio"][:1] == [
        {
            "seed": 1,
            "verdict": "within band",
            "ratio": 1.0,
            "band": 1.5,
            "bounds": [1 / 1.5, 1.5],
            "candidate_valid_to_target": 64,
            "baseline_valid_to_target": 64,
            "not_reached": [],
        }
    ]
    text = render_markdown(outcome)
    assert "crossed by the rule `lower_bound, confidence 0.95`" in text
    assert "## Learning curves: equivalent within the margin?" in text
    assert "**drums vs restore: equivalent.**" in text


def test_the_outcome_shows_measured_load_and_the_held_out_classes(tmp_path):
    runs = [
        load(tmp_path, "restore", 1, [0.25, 0.5], 2.0),
        load(tmp_path, "drums", 1, [0.25, 0.5], 1.0),
    ]
    outcome = compute_outcome(runs, PREREG)
    drums = next(r for r in outcome["runs"] if r["arm"] == "drums")
    assert drums["heldout_classes"] == {"success": 20, "failed_valid": 20, "invalid": 0}
    assert drums["load"]["cpu_cost_usd"] == 0.5 * 0.1 / 2  # CPU-hours at the price per core
    text = render_markdown(outcome)
    assert (
        "| drums | 1 | 0.5000 | 0.02500 $ | 75.0 % | 0.0 % | 1.50, 1.00, 0.50 | 20 / 20 / 0 |"
        in text
    )


def test_exact_divergence_leads_the_outcome(tmp_path):
    same = [{"step": k, "completion_ids": f"c{k}", "rewards": f"r{k}"} for k in (1, 2, 3)]
    flipped = [dict(line) for line in same]
    flipped[1]["rewards"] = "other"
    runs = [
        load(tmp_path / "a", "restore", 1, [0.25, 0.5], 2.0, steps=same),
        load(tmp_path / "a", "drums", 1, [0.25, 0.5], 1.0, steps=same),
    ]
    outcome = compute_outcome(runs, PREREG)
    assert outcome["divergence"][0]["seeds"] == [
        {
            "seed": 1,
            "verdict": "never",
            "steps_compared": 3,
            "steps_only_in": {"baseline": 0, "candidate": 0},
        }
    ]
    text = render_markdown(outcome)
    assert "seed 1: never diverged over 3 steps" in text
    assert text.index("exact divergence") < text.index("## Historical comparison")
    runs[1] = load(tmp_path / "b", "drums", 1, [0.25, 0.5], 1.0, steps=flipped)
    outcome = compute_outcome(runs, PREREG)
    assert "seed 1: diverged at step 2 (rewards)" in render_markdown(outcome)
    assert any(p.endswith("steps.jsonl") for p in outcome["inputs"])  # hashed into the receipt


def with_machine(files: dict, isa: list[str]) -> RunRecords:
    """The run of `files` with the machine kind training records in run.json."""
    final = json.loads(files["run"].read_text())
    final["machine"] = {"accelerator": None, "cpu": "AMD EPYC", "isa": isa, "threads": 2}
    files["run"].write_text(json.dumps(final))
    return RunRecords.load(**files)


def test_exact_divergence_names_the_machine_kinds_it_rests_on(tmp_path):
    """Bits repeat only within one machine kind: the outcome names the kind, and a seed whose two
    runs trained on different kinds says its divergence is no evidence about the environments."""
    same = [{"step": k, "completion_ids": f"c{k}", "rewards": f"r{k}"} for k in (1, 2, 3)]
    flipped = [dict(line) for line in same]
    flipped[0]["completion_ids"] = "other"
    avx2, avx512 = ["avx", "avx2", "fma"], ["avx", "avx2", "fma", "avx512f"]
    runs = [
        with_machine(write_run(tmp_path / "a", "restore", 1, [0.25, 0.5], 2.0, steps=same), avx2),
        with_machine(write_run(tmp_path / "a", "drums", 1, [0.25, 0.5], 1.0, steps=same), avx2),
    ]
    outcome = compute_outcome(runs, PREREG)
    assert "machine_kinds_differ" not in outcome["divergence"][0]["seeds"][0]
    text = render_markdown(outcome)
    assert "Every run trained on one machine kind: AMD EPYC (avx, avx2, fma), 2 threads." in text
    assert "different machine kinds" not in text
    runs[1] = with_machine(
        write_run(tmp_path / "b", "drums", 1, [0.25, 0.5], 1.0, steps=flipped), avx512
    )
    outcome = compute_outcome(runs, PREREG)
    seed = outcome["divergence"][0]["seeds"][0]
    assert seed["verdict"] == "diverged" and seed["machine_kinds_differ"] == {
        "baseline": "AMD EPYC (avx, avx2, fma), 2 threads",
        "candidate": "AMD EPYC (avx, avx2, fma, avx512f), 2 threads",
    }
    text = render_markdown(outcome)
    assert "The runs trained on 2 machine kinds" in text
    assert "seed 1: diverged at step 1 (completion_ids); the runs trained on different" in text
    assert "no evidence about the environments" in text
    runs[1] = RunRecords.load(**write_run(tmp_path / "c", "drums", 1, [0.25, 0.5], 1.0, steps=same))
    outcome = compute_outcome(runs, PREREG)  # a run that recorded no kind is not called different
    assert "machine_kinds_differ" not in outcome["divergence"][0]["seeds"][0]
    assert "(some runs recorded none)" in render_markdown(outcome)


def confirmed_load(root, arm, seed, rates, speed, verdict, checkpoint) -> RunRecords:
    """A run with its confirm.json: the confirmatory verdict on `checkpoint`."""
    files = write_run(root, arm, seed, rates, speed)
    record = files["pins"].parent / "confirm.json"
    test = {"successes": 300, "episodes": 576, "success_rate": 0.52, "lower_bound": 0.49}
    record.write_text(
        json.dumps(
            {
                "verdict": verdict,
                "checkpoint": checkpoint,
                "test": {**test, "null_rate": 0.45},
                "null": "H0 p <= 0.45 (threshold - delta)",
            }
        )
    )
    return RunRecords.load(**files, confirmation=record)


def test_a_failed_confirmation_is_never_reached_everywhere(tmp_path):
    """Seed 2 of drums crosses at ckpt-001 but is not confirmed: its row, the survival analysis,
    the paired ratio and the receipt's `reached` all say it never reached the target."""
    from envab.preregistration import ConfirmationProtocol

    prereg = SimpleNamespace(**vars(PREREG))
    prereg.confirmation = ConfirmationProtocol(0.05, 0.05, 0.8, 1000)
    runs = [
        confirmed_load(tmp_path, "restore", s, [0.4, 0.6], 2.0, "confirmed", "ckpt-002")
        for s in (1, 2)
    ]
    runs += [confirmed_load(tmp_path, "drums", 1, [0.6, 0.6], 1.0, "confirmed", "ckpt-001")]
    runs += [confirmed_load(tmp_path, "drums", 2, [0.6, 0.6], 1.0, "not confirmed", "ckpt-001")]
    outcome = compute_outcome(runs, prereg)
    row = next(r for r in outcome["runs"] if (r["arm"], r["seed"]) == ("drums", 2))
    assert row["reached"] is False and row["verdict"] == "never reached target"
    assert row["unconfirmed_crossing"]["checkpoint"] == "ckpt-001"
    across = outcome["across_seeds"][0]
    assert across["kaplan_meier"]["drums"]["censored"] == 1
    pairs = {p["seed"]: p for p in across["paired_log_ratio"]["log_ratios"]}
    # censored at the 1000 s budget, not at the 64 s it spent
    assert pairs[2]["bound"] == "lower bound"
    assert pairs[2]["log_ratio"] == pytest.approx(math.log(1000 / 128))
    assert outcome["equivalence"] is None  # PREREG registers none
    text = render_markdown(outcome)
    assert (
        "| drums | 2 | never reached target (crossed at ckpt-001: crossing not confirmed)" in text
    )
    assert "exact binomial test of H0 p <= 0.45 (threshold - delta)" in text


def test_the_primary_leads_and_the_secondary_family_is_holm_adjusted(tmp_path):
    from statsmodels.stats.multitest import multipletests

    runs = [load(tmp_path, "restore", s, [0.4, 0.45, 0.6], 2.0 + 0.1 * s) for s in (1, 2, 3, 4)]
    runs += [load(tmp_path, "drums", s, [0.4, 0.6, 0.6], 1.0 + 0.2 * s) for s in (1, 2, 3, 4)]
    outcome = compute_outcome(runs, PREREG)
    primary = outcome["primary"][0]
    assert primary["endpoint"] == "paired_time_ratio:wall_clock_s"
    assert primary["p_value"] < 0.05 and primary["verdict"] == "drums faster"
    names = [f["endpoint"] for f in outcome["secondary"]]
    assert names == [
        "logrank:wall_clock_s",
        "paired_time_ratio:valid_trajectories",
        "logrank:valid_trajectories",
    ]
    tested = [f for f in outcome["secondary"] if f["p_value"] is not None]
    adjusted = multipletests([f["p_value"] for f in tested], alpha=0.05, method="holm")[1]
    assert [f["p_holm"] for f in tested] == pytest.approx(list(adjusted))
    text = render_markdown(outcome)
    assert text.index("## Primary endpoint") < text.index("exact divergence")
    assert "**drums vs restore: drums faster.**" in text
    assert "## Secondary endpoints (Holm's rule over" in text
