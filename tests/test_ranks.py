"""A run on two training processes (`accelerate launch` on the CPU, gloo): each process generates
its share of a step's groups against its own arm, and rank 0 alone owns what the run writes. The
counts reconcile exactly: every rank's attempts are in the one ledger, the budget stops both
processes at the same step, each checkpoint is saved once, and run.json counts what the records
hold. The run is killed once at a step's end and resumed by a plain rerun: each process carries
on from its own draws at the resume point."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import SHIPPED_EXP as EXP
from conftest import shrink_budget

RUN = Path("results") / EXP / "drums" / "seed1"


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, make_workflow):
    workflow = make_workflow(tmp_path_factory.mktemp("ranks"))
    workflow.embedded_arms()

    workflow.tiny_recipe()

    def config(c):
        c["training"]["compute"] = {"processes": 2}

    def target(t):
        shrink_budget(t, valid=8, wall_clock_s=600, interval=4)

    workflow.edit_config(config)
    workflow.edit_target(target)
    killed = workflow.snakemake(
        str(RUN / "run.json"), timeout=900, env={"ENVAB_KILL_AT": "step_end:2"}
    )
    assert killed.returncode != 0, "the run ended before it was killed"
    point = json.loads((workflow.root / RUN / "journal" / "resume.json").read_text())
    result = workflow.snakemake(str(RUN / "run.json"), timeout=900)
    logs = "".join(p.read_text()[-3000:] for p in (workflow.root / "logs").rglob("train_*.log"))
    assert result.returncode == 0, result.stderr[-3000:] + logs
    return workflow.root, point


def test_a_killed_run_resumes_each_process_from_its_own_draws(two_processes):
    root, point = two_processes
    # Both processes' draws are in the point: two attempts each per step before it.
    assert point["draws"] == [{"resets": 2 * point["global_step"], "backend": None}] * 2
    run = json.loads((root / RUN / "run.json").read_text())
    assert [r["from_step"] for r in run["restarts"]] == [point["global_step"]]
    assert not (root / RUN / "journal").exists()


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_ranks_attempts_are_in_the_one_ledger(two_processes):
    two_processes, _ = two_processes
    run = json.loads((two_processes / RUN / "run.json").read_text())
    attempts = lines(two_processes / RUN / "trajectories.jsonl")
    assert run["processes"] == 2 and run["steps"] >= 2
    # Each step: one group of two on each process, in rank order.
    per_step = Counter((a["step"], a["rank"]) for a in attempts)
    assert per_step == {(step, rank): 2 for step in range(1, run["steps"] + 1) for rank in (0, 1)}
    assert run["valid_trajectories"] == sum(a["verdict"] == "valid" for a in attempts)
    assert run["invalid_discarded"] == len(attempts) - run["valid_trajectories"]
    assert run["valid_trajectories"] >= 8 and run["stop_reason"] == "max_valid_trajectories"
    # Each process opened its own environments: no session id is shared between them.
    assert len({a["env_id"] for a in attempts}) == len(attempts)
    # Both processes held an arm for the whole run: twice the host-hours of its wall-clock.
    assert run["env_host_hours"] == pytest.approx(2 * run["wall_clock_s"] / 3600)
    digests = lines(two_processes / RUN / "steps.jsonl")
    assert Counter(d["rank"] for d in digests) == {0: run["steps"], 1: run["steps"]}


def test_each_checkpoint_is_saved_once_by_rank_0(two_processes):
    two_processes, _ = two_processes
    records = lines(two_processes / RUN / "checkpoints.jsonl")
    names = [r["checkpoint"] for r in records]
    assert names[:3] == ["valid-000000", "valid-000004", "valid-000008"]
    assert len(names) == len(set(names))
    saved = sorted(p.name for p in (two_processes / RUN / "checkpoints").glob("valid-*"))
    assert saved == sorted(names)
    for record in records[1:]:
        assert record["valid_trajectories"] >= record["due_at_valid"]


def test_each_process_played_on_its_own_arm(two_processes):
    two_processes, _ = two_processes
    logs = two_processes / "logs" / EXP
    assert (logs / "train_drums_seed1.host.log").stat().st_size > 0
    assert (logs / "train_drums_seed1.host.rank1.log").stat().st_size > 0
    assert (
        logs / "train_drums_seed1.rank1.log"
    ).is_file()  # rank 1's own log; rank 0 has the job's
