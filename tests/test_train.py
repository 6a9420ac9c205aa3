"""A short real training run through Snakemake: freeze, SFT warm start, GRPO on both arms against
the embedded host, with faults injected through the host's switches; then the records are checked.

The workflow is a temporary copy with a tiny budget (a copied target.yaml, edited before it is
frozen) and tiny GRPO settings; one Snakemake run is shared by the tests of this module.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHIPPED_EXP as EXP
from conftest import shrink_budget

from envab.hashing import file_manifest
from envab.receipts import FREEZE_RECEIPTS

RESULTS = Path("results") / EXP
BUDGET_VALID = 8
INTERVAL = 2
GROUP = 2  # num_generations
# attempt ordinal -> host faults, the same attempts on both arms (on the fork arm each lands on
# the attempt's own child, never on the group's parent). A set-up or verifier fault always makes
# its attempt invalid; a step fault only when the attempt sent the environment an action.
FAULTS = {
    "attempts": {
        "1": {"corrupt_restore": True},
        "2": {"verifier_unavailable": True},
        "4": {"kill_at_step": 1},
        "6": {"stall_at_step": 1},
        "10": {"unknown_gate_at_step": 1},  # a gate no client knows, reported by its name
    },
    # Group 4 (attempts 8 and 9): its fork parent starts dirty and is quarantined, so every
    # child it would have had is invalid with its gate; on the restore arm, each create is.
    "groups": {"4": {"corrupt_restore": True}},
}
# attempt ordinal -> (verdict, gate): those that fail whatever the policy does...
ALWAYS = {
    1: ("state_mismatch", "state_hash"),
    2: ("verifier_unavailable", "verifier_available"),
    8: ("state_mismatch", "state_hash"),
    9: ("state_mismatch", "state_hash"),
}
# ... and those that fail only once the environment accepted an action.
ON_ACTION = {
    4: ("env_failure", "worker_alive"),
    6: ("timeout", "step_timeout"),
    10: ("env_failure", "display_compositor"),
}


def accepted(attempt: dict) -> bool:
    """Whether the environment accepted an action of this attempt: a step fault fires then."""
    return attempt["actions"] - attempt["refused"] > 0


def tiny(workflow) -> None:
    """Tiny settings and budget, edited before anything is frozen."""

    def config(c):
        c["tasks"]["factory"]["per_family"] = 32  # 24 training tasks: a warm start of 24 demos
        c["training"]["sft"].update(steps=2, batch_size=4)
        c["training"]["grpo"].update(
            num_generations=GROUP, prompts_per_step=2, max_turns=2, max_completion_length=128
        )

    def target(t):
        shrink_budget(t, valid=BUDGET_VALID, wall_clock_s=900, interval=INTERVAL)

    workflow.embedded_arms()
    workflow.edit_config(config)
    workflow.edit_target(target)


def run_snakemake(root: Path, *targets: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *targets],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, make_workflow):
    workflow = make_workflow(tmp_path_factory.mktemp("train"))
    tiny(workflow)
    plan = workflow.root / "faults.json"
    plan.write_text(json.dumps(FAULTS))
    env = {**os.environ, "ENVAB_FAULT_PLAN": str(plan)}
    targets = [str(RESULTS / arm / "seed1" / "run.json") for arm in ("restore", "drums")]
    result = run_snakemake(workflow.root, *targets, env=env)
    logs = "".join(p.read_text()[-3000:] for p in (workflow.root / "logs").rglob("train_*.log"))
    assert result.returncode == 0, result.stderr[-3000:] + logs
    return workflow


def records(root: Path, arm: str):
    run_dir = root / RESULTS / arm / "seed1"
    read = lambda name: [json.loads(line) for line in (run_dir / name).read_text().splitlines()]  # noqa: E731
    return (
        json.loads((run_dir / "run.json").read_text()),
        read("trajectories.jsonl"),
        read("checkpoints.jsonl"),
        run_dir,
    )


@pytest.mark.parametrize("arm", ["restore", "drums"])
def test_counts_add_up_and_budget_stops_the_run(trained, arm):
    run, attempts, checkpoints, _ = records(trained.root, arm)
    valid = [a for a in attempts if a["verdict"] == "valid"]
    invalid = [a for a in attempts if a["verdict"] != "valid"]
    assert run["valid_trajectories"] == len(valid) >= BUDGET_VALID
    assert run["invalid_discarded"] == len(invalid)
    assert run["stop_reason"] == "max_valid_trajectories"
    # Every step runs whole groups: attempts come in multiples of the step's batch.
    assert len(attempts) == run["steps"] * GROUP * 2
    assert run["env_busy_s"] == pytest.approx(sum(a["env_seconds"] for a in attempts))
    assert run["inference_s"] == pytest.approx(sum(a["generation_seconds"] for a in attempts))
    assert run["started_utc"] > run["frozen_utc"]
    assert min(a["started_utc"] for a in attempts) >= run["started_utc"]
    # how turns were generated and what the run's bit-determinism holds within are recorded
    assert "<|video_pad|>" in run["generation"]["suppressed_tokens"]
    assert run["machine"]["cpu"] and run["machine"]["threads"] >= 1


@pytest.mark.parametrize("arm", ["restore", "drums"])
def test_each_step_s_wall_clock_is_split_into_its_parts(trained, arm):
    run, attempts, _, _ = records(trained.root, arm)
    times = run["step_times"]
    assert times["steps"] == run["steps"]
    total = times["total_s"]
    parts = sum(v for k, v in total.items() if k != "step_s")
    assert parts == pytest.approx(total["step_s"], rel=1e-3)
    # the model generated, the arm was called and the loss stepped in every run
    assert min(total["generation"], total["environment"], total["learning"]) > 0
    # the environment's share can be no more than the attempts' own environment seconds
    assert total["environment"] <= sum(a["env_seconds"] for a in attempts) + 0.05
    assert 0 <= times["overhead_fraction"] < 1


@pytest.mark.parametrize("arm", ["restore", "drums"])
def test_injected_faults_are_invalid_attempts_without_reward(trained, arm):
    run, attempts, checkpoints, _ = records(trained.root, arm)
    expected = dict(ALWAYS)
    expected.update({n: v for n, v in ON_ACTION.items() if accepted(attempts[n])})
    # The tiny warm start here (2 SFT steps) seldom makes a tool call, so a step fault mostly
    # finds no action to fail (and must not fail the attempt then); tests/test_agent.py steps
    # every fault with scripted actions, and bench/soak.py trains under them with the default
    # warm start, whose policy acts.
    got = {
        n: (a["verdict"], *a["failed_gates"])
        for n, a in enumerate(attempts)
        if a["verdict"] != "valid"
    }
    assert got == expected
    for n in got:
        assert attempts[n]["reward"] is None and attempts[n]["score"] is None
    for a in attempts:
        if a["verdict"] == "valid":
            assert a["reward"] in (0.0, 1.0) and a["failed_gates"] == []
    # Every count reconciles with the faults: the run's, and the last checkpoint's.
    assert run["invalid_discarded"] == len(expected)
    assert checkpoints[-1]["invalid_discarded"] == sum(
        1 for n in expected if attempts[n]["step"] <= checkpoints[-1]["step"]
    )


@pytest.mark.parametrize("arm", ["restore", "drums"])
def test_checkpoints_at_the_right_counts_with_their_files(trained, arm):
    run, attempts, checkpoints, run_dir = records(trained.root, arm)
    # The start checkpoint (the warm start, before the first update), then one per interval.
    assert [c["due_at_valid"] for c in checkpoints] == list(
        range(0, run["valid_trajectories"] + 1, INTERVAL)
    )
    start = checkpoints[0]
    assert (start["checkpoint"], start["step"], start["valid_trajectories"]) == (
        "valid-000000",
        0,
        0,
    )
    assert start["wall_clock_s"] == 0 and start["env_cost_usd"] == 0
    for c in checkpoints:
        # The counters at a checkpoint are those of the attempts recorded up to its step.
        upto = [a for a in attempts if a["step"] <= c["step"]]
        assert c["valid_trajectories"] == sum(a["verdict"] == "valid" for a in upto)
        assert c["invalid_discarded"] == sum(a["verdict"] != "valid" for a in upto)
        assert c["valid_trajectories"] >= c["due_at_valid"]
        saved = run_dir / "checkpoints" / c["checkpoint"]
        assert file_manifest(saved) == c["files"]
        assert "model.safetensors" in c["files"]
    saved = [p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith(".")]
    assert sorted(saved) == sorted(c["checkpoint"] for c in checkpoints)


def test_fork_arm_groups_share_a_parent_and_restore_arm_has_none(trained):
    _, fork_attempts, _, _ = records(trained.root, "drums")
    _, restore_attempts, _, _ = records(trained.root, "restore")
    assert all(a["fork_parent"] is None for a in restore_attempts)
    groups = [fork_attempts[i : i + GROUP] for i in range(0, len(fork_attempts), GROUP)]
    for group in groups:
        assert len({a["task_id"] for a in group}) == 1
        if all(a["verdict"] == "valid" for a in group):
            assert len({a["fork_parent"] for a in group}) == 1 and group[0]["fork_parent"]
    parents = [g[0]["fork_parent"] for g in groups if g[0]["verdict"] == "valid"]
    assert len(set(parents)) == len(parents)  # one parent per group


def test_sft_receipt_verifies_and_only_training_tasks_were_used(trained):
    root = trained.root
    result = subprocess.run(
        [sys.executable, "-m", "envab.verify", f"receipts/{EXP}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    assert f"receipts/{EXP}/sft.json" in result.stdout
    sft = json.loads((root / "receipts" / EXP / "sft.json").read_text())["predicate"]
    train_ids = {
        json.loads(line)["id"] for line in (root / RESULTS / "tasks" / "train.jsonl").open()
    }
    assert set(sft["task_ids"]) == train_ids
    run, _, _, _ = records(root, "restore")
    assert run["model"] == f"{RESULTS}/sft/model"


def first_step_metrics(text: str) -> dict:
    """The first step's metrics as TRL prints them (one dict per step, the log's `{'loss'` line)."""
    for line in text.splitlines():
        start = line.find("{'loss'")
        if start >= 0:
            return ast.literal_eval(line[start:])
    raise AssertionError("no step metrics in the output")


def verify_in(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envab.verify", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("arm", ["restore", "drums"])
def test_the_train_job_receipts_its_records_and_verify_names_an_edit(trained, arm, tmp_path):
    """The train job's training-records receipt vouches for the run's records as training left
    them. In a copy of the run, one trajectory line edited is named by verify, and the receipt
    deleted is MISSING, required by the run's run.json."""
    receipt = Path("receipts") / EXP / f"train_{arm}_seed1.json"
    run_dir = RESULTS / arm / "seed1"
    subjects = json.loads((trained.root / receipt).read_text())["subject"]
    names = ["pins.json", "trajectories.jsonl", "steps.jsonl", "checkpoints.jsonl", "run.json"]
    assert [s["name"] for s in subjects] == [(run_dir / name).as_posix() for name in names]
    copy = tmp_path / "copy"
    shutil.copytree(trained.root / "receipts", copy / "receipts")
    shutil.copytree(trained.root / run_dir, copy / run_dir)
    result = verify_in(copy, "--receipts", str(receipt))
    assert result.returncode == 0, result.stdout[-2000:]

    path = copy / run_dir / "trajectories.jsonl"
    lines = path.read_text().splitlines()
    attempt = json.loads(lines[0])
    attempt["verdict"] = "valid" if attempt["verdict"] != "valid" else "env_failure"
    lines[0] = json.dumps(attempt, sort_keys=True)
    path.chmod(0o644)
    path.write_text("\n".join(lines) + "\n")
    result = verify_in(copy, "--receipts", str(receipt))
    assert result.returncode == 1
    edited = f"MISMATCH  {run_dir / 'trajectories.jsonl'}  (subject of {receipt})"
    assert edited in result.stdout.splitlines(), result.stdout[-2000:]

    (copy / receipt).unlink()
    result = verify_in(copy, str(receipt.parent))
    assert result.returncode == 1
    missing = f"MISSING   {receipt}  (required by {run_dir / 'run.json'})"
    assert missing in result.stdout.splitlines(), result.stdout[-2000:]


def test_same_seed_same_arm_gives_the_same_first_step(trained):
    """A second run of the restore arm, seed 1, into a fresh folder: the first step's tasks,
    rewards and turns are equal, and so are the sampled completions' lengths and entropy (which
    differ as soon as one sampled token differs)."""
    root = trained.root
    out = root / "rerun"
    env = {**os.environ, "ENVAB_FAULT_PLAN": str(root / "faults.json")}  # the same faults too
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "envab.trainer.grpo",
            "--target",
            "preregistration/target.yaml",
            "--receipts",
            *(f"receipts/{EXP}/{name}" for name in [*FREEZE_RECEIPTS, "sft.json"]),
            "--pins",
            str(RESULTS / "restore" / "seed1" / "pins.json"),
            "--model",
            str(RESULTS / "sft" / "model"),
            "--train",
            str(RESULTS / "tasks" / "train.jsonl"),
            "--trajectories",
            str(out / "trajectories.jsonl"),
            "--checkpoint-records",
            str(out / "checkpoints.jsonl"),
            "--checkpoints",
            str(out / "checkpoints"),
            "--run",
            str(out / "run.json"),
            "--wandb-dir",
            str(out / "wandb"),
            "--steps",
            str(out / "steps.jsonl"),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, first, _, _ = records(root, "restore")
    second = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    keys = ("task_id", "reward", "turns", "verdict")
    pick = lambda rows: [tuple(r[k] for k in keys) for r in rows if r["step"] == 1]  # noqa: E731
    assert pick(first) == pick(second) and len(pick(first)) == GROUP * 2
    m1 = first_step_metrics((root / "logs" / EXP / "train_restore_seed1.log").read_text())
    m2 = first_step_metrics(result.stderr + result.stdout)
    for key in ("completions/mean_length", "num_tokens", "entropy"):
        assert m1[key] == m2[key], key
    # The step digests agree too: the same tokens, images, rewards and advantages at step 1.
    digests = [
        json.loads(path.read_text().splitlines()[0])
        for path in (root / RESULTS / "restore" / "seed1" / "steps.jsonl", out / "steps.jsonl")
    ]
    assert digests[0]["step"] == 1 and digests[0] == digests[1]


# Where the drums run is killed (SIGKILL), one moment per process, in this order: after an
# update before its checkpoint (the start is the only resume point yet), during generation,
# while an environment is being set up for an attempt (mid-generation, some of the step's
# attempts recorded), during a checkpoint write, and after TRL's state of a checkpoint is written
# but before the resume point names it. The sixth process runs to the end. (A kill in the middle
# of an action is the soak's: this tiny warm start seldom acts.)
KILLS = ["step_end:1", "generation:2", "env_reset:3", "checkpoint_write:1", "resume_point:1"]
SAME = ("checkpoint", "step", "valid_trajectories", "invalid_discarded", "files", "train_success")


def test_a_run_killed_five_times_resumes_to_the_records_of_one_never_killed(trained):
    """The drums run again, killed at five moments and resumed by plain reruns of Snakemake:
    every record equals the uninterrupted run's (the same attempts, step digests and checkpoint
    digests), the lost attempts and the downtime are accounted, and nothing is half-written.
    Last in the module: the drums records it leaves are the resumed run's."""
    root = trained.root
    run_dir = root / RESULTS / "drums" / "seed1"
    before = {"run": records(root, "drums")[0]}
    before["steps"] = (run_dir / "steps.jsonl").read_text()
    _, before["attempts"], before["checkpoints"], _ = records(root, "drums")
    target = str(RESULTS / "drums" / "seed1" / "run.json")
    faults = {**os.environ, "ENVAB_FAULT_PLAN": str(root / "faults.json")}
    for n, kill in enumerate(KILLS):
        forced = ("--force",) if n == 0 else ()  # the target's own job only, not every train
        result = run_snakemake(root, *forced, target, env={**faults, "ENVAB_KILL_AT": kill})
        assert result.returncode != 0, f"{kill}: the run ended before it was killed"
        assert (run_dir / "journal" / "resume.json").is_file(), kill
        assert not (run_dir / "run.json").exists()  # Snakemake removed the failed job's outputs
    result = run_snakemake(root, target, env=faults)
    assert result.returncode == 0, result.stderr[-3000:]

    run, attempts, checkpoints, _ = records(root, "drums")
    assert (run_dir / "steps.jsonl").read_text() == before["steps"]
    key = lambda a: (a["step"], a["task_id"], a["verdict"], a["failed_gates"], a["score"])  # noqa: E731
    assert [key(a) for a in attempts] == [key(a) for a in before["attempts"]]
    assert [{k: c[k] for k in SAME} for c in checkpoints] == [
        {k: c[k] for k in SAME} for c in before["checkpoints"]
    ]
    for k in ("valid_trajectories", "invalid_discarded", "steps", "checkpoints"):
        assert run[k] == before["run"][k], k

    # Each restart on its own line: what it lost, and the downtime it did not count.
    restarts = run["restarts"]
    assert len(restarts) == len(KILLS)
    assert [r["from_checkpoint"] for r in restarts][0] == "valid-000000"
    assert all(r["downtime_s"] > 0 and r["lost_s"] >= 0 for r in restarts)
    lost = [json.loads(line) for line in (run_dir / "lost.jsonl").read_text().splitlines()]
    assert run["lost_trajectories"] == len(lost) == sum(r["lost_trajectories"] for r in restarts)
    assert lost and all(a["lost"] for a in lost)
    assert run["downtime_s"] == pytest.approx(sum(r["downtime_s"] for r in restarts))

    # Nothing half-written: every checkpoint folder whole and listed, no journal left behind.
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    saved.remove(".snakemake_timestamp")  # Snakemake's mark on a directory output
    assert saved == sorted(c["checkpoint"] for c in checkpoints)
    for c in checkpoints:
        assert file_manifest(run_dir / "checkpoints" / c["checkpoint"]) == c["files"]
    assert not (run_dir / "journal").exists()

    # The training-records receipt, written again at the resumed run's end, vouches for them.
    receipt = Path("receipts") / EXP / "train_drums_seed1.json"
    assert json.loads((root / receipt).read_text())["predicate"]["restarts"] == len(KILLS)
    result = verify_in(root, "--receipts", str(receipt))
    assert result.returncode == 0, result.stdout[-2000:]
