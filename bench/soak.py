"""Soak: the embedded A/B trained under injected faults and kills, then every invariant checked.

    python bench/soak.py --out DIR [--valid 96] [--fault-rate 0.1] [--kills 3] [--seed 0]

A copy of the workflow in DIR/workflow with the A/B's two arms (`qemu`: the QEMU warm-snapshot
pool, a restore per rollout; `drums`: the embedded host, a fork per group), the default warm
start, small GRPO steps (2 prompts of 2 completions), a budget of --valid valid trajectories and
a checkpoint every quarter of it. The fault plan puts a fault on each attempt with probability
--fault-rate, drawn from --seed among the switches of envs/faults.py (a killed environment, a
stalled step, a blank or stale screen, a gate no client knows, a host that dies mid-step and is
started again, a corrupt restore, the verifier down); both arms get the same plan, except the
host restart, which the QEMU arm has no host process for (its pool runs inside the trainer, whose
kills are below). Each arm's training is killed (SIGKILL) up to --kills times, at moments drawn
from trainer/resume.py's MOMENTS, and resumed by running Snakemake again; then the workflow runs
to its outcome.

Checked for each arm: every injected fault that fired made exactly its attempt invalid with its
own verdict and gate (a step fault fires when the environment accepted an action of the attempt),
a host restart also every other environment the host held then (named in the host's log), and
nothing else is invalid; run.json's counters equal the records'; each checkpoint's counters equal
the attempts up to its step, its folder matches its digests and nothing half-written is left; one
restart line per kill survived, the lost attempts in lost.jsonl as many as those lines say; one
digest line per step; and the receipts verify. Writes DIR/soak.json and prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from envab.hashing import file_manifest
from envab.layout import Layout
from envab.preregistration import Preregistration
from envab.trainer.resume import MOMENTS

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = ["Snakefile", "config.yaml", "environment.yaml", "rules", "schemas", "preregistration",
            "report", "envab", "envs", "trainer", "eval", "analysis", "pyproject.toml"]  # fmt: skip
ARMS = {
    # A step resets its whole batch (2 x 2 sessions) before generating: 4 VMs at most.
    "qemu": {
        "backend": "qemu",
        "vms": 2,
        "max_vms": 4,
        "step_timeout_s": 5.0,
        "cache": str(REPO / "build" / "qemu"),
    },  # the checkout's guest, built once
    "drums": {"backend": "drums", "url": "embedded", "mode": "fork"},
}
# The switch, the verdict and gate it must give, and whether it fires only on an accepted action.
FAULTS = {
    "kill_at_step": ({"kill_at_step": 1}, "env_failure", "worker_alive", True),
    "stall_at_step": ({"stall_at_step": 1}, "timeout", "step_timeout", True),
    "blank_at_step": ({"blank_at_step": 1}, "blank_screen", "screen_not_blank", True),
    "stale_at_step": ({"stale_at_step": 1}, "stale_generation", "screen_current", True),
    "unknown_gate": ({"unknown_gate_at_step": 1}, "env_failure", "display_compositor", True),
    "host_restart": ({"restart_host_at_step": 1}, "env_failure", "host_reachable", True),
    "corrupt_restore": ({"corrupt_restore": True}, "state_mismatch", "state_hash", False),
    "verifier_down": ({"verifier_unavailable": True}, "verifier_unavailable",
                      "verifier_available", False),
}  # fmt: skip
HOST_ONLY = {"host_restart"}  # faults the QEMU arm has no place for
# What the other environments a dying host held end with: the new host never heard of them, or
# the request met the old host's closed connection. A GRPO step resets its whole batch before
# generating and verifies it after, so a host that dies during a step takes every environment of
# that step's batch with it.
LOST_WITH_HOST = ("env_failure", {"session_known", "host_reachable"})


def workflow_copy(root: Path, valid: int) -> Preregistration:
    for name in WORKFLOW:
        src = REPO / name
        ignore = shutil.ignore_patterns("__pycache__", ".snakemake")
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=ignore)
        else:
            shutil.copy2(src, root / name)
    config_path, target_path = root / "config.yaml", root / "preregistration" / "target.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["arms"] = ARMS
    # The default warm start, whose policy makes a tool call (a step fault needs an action to
    # fail); small GRPO steps, so that a kill has many moments to land on.
    config["training"]["grpo"].update(num_generations=2, prompts_per_step=2)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    target = yaml.safe_load(target_path.read_text())
    target["experiment_id"] = "soak"
    target["arms"] = list(ARMS)
    target["prices"]["host_usd_per_hour"] = {arm: 0.10 for arm in ARMS}
    target["budget"].update(max_wall_clock_s=3600, max_valid_trajectories=valid)
    target["evaluation"].update(backend="drums", seeds=[0], checkpoint_interval=valid // 4)
    for key in ("controls", "confirmation"):
        target.pop(key, None)
    target_path.write_text(yaml.safe_dump(target, sort_keys=False))
    return Preregistration.load(target_path)


def fault_plan(rate: float, attempts: int, rng: random.Random) -> dict[int, str]:
    return {n: rng.choice(sorted(FAULTS)) for n in range(attempts) if rng.random() < rate}


def arm_plan(plan: dict[int, str], arm: str) -> dict[int, str]:
    """The plan as an arm can take it (the QEMU arm has no host process to restart)."""
    backend = ARMS[arm]["backend"]
    return {n: name for n, name in plan.items() if backend != "qemu" or name not in HOST_ONLY}


def accepted(attempt: dict) -> bool:
    return attempt["actions"] - attempt["refused"] > 0


def snakemake(root: Path, *targets: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "all", *targets],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "WANDB_MODE": "disabled", **env},
    )


def train_with_kills(root: Path, exp: str, arm: str, kills: int, env: dict, rng) -> dict:
    """Kill the arm's training `kills` times at drawn moments, then let it finish."""
    run_dir = Layout(exp, root).run(arm, 1)
    target = (Layout(exp).run(arm, 1) / "run.json").as_posix()
    done = []
    for _ in range(kills):
        at = f"{rng.choice(MOMENTS)}:{rng.randint(1, 3)}"
        result = snakemake(root, target, env={**env, "ENVAB_KILL_AT": at})
        if result.returncode == 0:  # the run ended before the moment came
            break
        resumable = (run_dir / "journal" / "resume.json").is_file()
        done.append({"kill": at, "resumable": resumable})
        print(f"  {arm}: killed at {at} ({'resumes' if resumable else 'starts afresh'})")
    result = snakemake(root, target, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{arm}: training did not finish:\n{result.stderr[-3000:]}")
    return {"kills": done}


def check_run(run_dir: Path, plan: dict[int, str], kills: list[dict]) -> dict:
    """Every invariant of one run: its figures, or an AssertionError naming the broken one."""
    read = lambda name: [json.loads(x) for x in (run_dir / name).read_text().splitlines()]  # noqa: E731
    run = json.loads((run_dir / "run.json").read_text())
    attempts, checkpoints = read("trajectories.jsonl"), read("checkpoints.jsonl")
    steps = read("steps.jsonl")
    fired = {}
    for n, name in plan.items():
        if n < len(attempts):
            _, verdict, gate, on_action = FAULTS[name]
            if not on_action or accepted(attempts[n]):
                fired[n] = (verdict, gate)
    got = {
        n: (a["verdict"], a["failed_gates"][0])
        for n, a in enumerate(attempts)
        if a["verdict"] != "valid"
    }
    # The bystanders of a host restart (the other attempts of its step): invalid as lost with
    # the host, unless their own fault got there first.
    dying = {n for n in fired if plan[n] == "host_restart"}
    died_in = {attempts[n]["step"] for n in dying}
    bystanders = {n for n, a in enumerate(attempts) if a["step"] in died_in and n not in dying}
    verdict, gates = LOST_WITH_HOST
    for n in sorted(bystanders):
        ok = n in got and (got[n] == fired.get(n) or (got[n][0] == verdict and got[n][1] in gates))
        assert ok, f"attempt {n} was on the host that died, yet ended {got.get(n)}"
    got_all = got
    got = {n: v for n, v in got.items() if n not in bystanders}
    fired = {n: v for n, v in fired.items() if n not in bystanders}
    assert got == fired, f"invalid attempts {got} but the fired faults were {fired}"
    assert all(a["reward"] is None for a in attempts if a["verdict"] != "valid")
    valid = sum(a["verdict"] == "valid" for a in attempts)
    assert (run["valid_trajectories"], run["invalid_discarded"]) == (valid, len(attempts) - valid)
    assert len(steps) == run["steps"], "one digest line per step"
    for c in checkpoints:
        upto = [a for a in attempts if a["step"] <= c["step"]]
        assert c["valid_trajectories"] == sum(a["verdict"] == "valid" for a in upto)
        assert file_manifest(run_dir / "checkpoints" / c["checkpoint"]) == c["files"]
    folders = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    folders.remove(".snakemake_timestamp")  # Snakemake's mark on a directory output
    assert folders == sorted(c["checkpoint"] for c in checkpoints), "a checkpoint half-written"
    assert not (run_dir / "journal").exists()
    resumable = sum(k["resumable"] for k in kills)
    assert len(run["restarts"]) == resumable, (run["restarts"], kills)
    lost_file = run_dir / "lost.jsonl"
    lost = len(lost_file.read_text().splitlines()) if lost_file.exists() else 0
    assert run["lost_trajectories"] == lost == sum(r["lost_trajectories"] for r in run["restarts"])
    return {
        "attempts": len(attempts),
        "valid": valid,
        "faults_injected": sum(1 for n in plan if n < len(attempts)),
        "faults_fired": len(fired),
        "by_fault": {name: sum(1 for n in fired if plan[n] == name) for name in sorted(FAULTS)},
        # the attempts a dying host took with it (not those whose own fault came first)
        "lost_with_host": sum(1 for n in bystanders if got_all[n][1] in LOST_WITH_HOST[1]),
        "kills": len(kills),
        "restarts": len(run["restarts"]),
        "lost_trajectories": lost,
        "lost_s": run["lost_s"],
        "downtime_s": run["downtime_s"],
        "wall_clock_s": run["wall_clock_s"],
        "checkpoints": len(checkpoints),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--valid", type=int, default=96, help="valid trajectories per arm")
    p.add_argument("--fault-rate", type=float, default=0.1)
    p.add_argument("--kills", type=int, default=3, help="kills per arm")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    root = args.out / "workflow"
    if root.exists():
        raise SystemExit(f"{root} exists; give an empty --out")
    root.mkdir(parents=True)
    exp = workflow_copy(root, args.valid).experiment_id
    rng = random.Random(args.seed)
    # Enough ordinals for the invalid attempts too; both arms get the same plan.
    plan = fault_plan(args.fault_rate, 4 * args.valid, rng)
    plans = {arm: arm_plan(plan, arm) for arm in ARMS}
    started = time.monotonic()
    kills = {}
    for arm in ARMS:
        plan_file = root / f"faults-{arm}.json"
        switches = {str(n): FAULTS[name][0] for n, name in plans[arm].items()}
        plan_file.write_text(json.dumps({"attempts": switches}))
        env = {"ENVAB_FAULT_PLAN": str(plan_file)}
        print(f"training {arm} under {len(plans[arm])} planned faults, up to {args.kills} kills")
        kills[arm] = train_with_kills(root, exp, arm, args.kills, env, rng)["kills"]
    result = snakemake(root, env={})  # evaluation, outcome, receipts
    if result.returncode != 0:
        raise SystemExit(f"the workflow did not finish:\n{result.stderr[-3000:]}")
    verified = subprocess.run(
        [sys.executable, "-m", "envab.verify", Layout(exp).receipts.as_posix()],
        cwd=root,
        capture_output=True,
        text=True,
    )
    figures = {
        arm: check_run(Layout(exp, root).run(arm, 1), plans[arm], kills[arm]) for arm in ARMS
    }
    report = {
        "valid_per_arm": args.valid,
        "fault_rate": args.fault_rate,
        "seed": args.seed,
        "receipts_verify": verified.returncode == 0,
        "seconds": time.monotonic() - started,
        "arms": figures,
    }
    (args.out / "soak.json").write_text(json.dumps(report, indent=2))
    for arm, f in figures.items():
        print(
            f"{arm}: {f['attempts']} attempts, {f['valid']} valid; faults {f['faults_fired']} "
            f"fired of {f['faults_injected']} injected {f['by_fault']}, "
            f"{f['lost_with_host']} more lost with a host, all accounted; "
            f"{f['kills']} kills, {f['restarts']} restarts, {f['lost_trajectories']} lost "
            f"({f['lost_s']:.1f} s counted), {f['downtime_s']:.1f} s down (not counted); "
            f"{f['checkpoints']} checkpoints whole"
        )
    print(f"receipts verify: {report['receipts_verify']}; {report['seconds'] / 60:.1f} min")
    return 0 if report["receipts_verify"] else 1


if __name__ == "__main__":
    sys.exit(main())
