"""The whole embedded default A/B on a tiny budget, through Snakemake: freeze, SFT, GRPO on both
arms, held-out evaluation of every checkpoint, the outcome, the report, and receipts that verify.
First one arm and seed as the design card types it (`snakemake arm=drums seed=1`) on a cluster
executor, then the rest; the console's progress lines and the wandb runs are read back. The arms
reach their host with a recognisable token from a file, which no file the run wrote may contain;
then copies of the finished run are tampered with, one item at a time."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SHIPPED_EXP as EXP
from conftest import shrink_timing

OFFLINE = {"WANDB_MODE": "offline"}  # wandb runs written here are read back below
# Every Python process of the runs carries an audit hook (sitecustomize) that writes down each
# open of a split's file, and of any file the evaluations or the stop-at-target judge keep
# (held-out records), with the process's command line: the held-out wall, read from outside.
AUDIT_HOOK = """
import json, os, sys
_log, _busy = os.environ["ENVAB_TEST_OPENS"], []
def _hook(event, args):
    if event != "open" or _busy or not isinstance(args[0], (str, bytes)):
        return
    path = os.fsdecode(args[0])
    parts = path.split(os.sep)
    split = os.path.basename(path) in ("train.jsonl", "heldout.jsonl")
    if not (split or "judged" in parts or "evaluations" in parts):
        return
    _busy.append(1)
    try:
        fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, (json.dumps({"argv": sys.argv, "path": path}) + "\\n").encode())
        os.close(fd)
    finally:
        _busy.clear()
sys.addaudithook(_hook)
"""
RESULTS = Path("results") / EXP
RECEIPTS = Path("receipts") / EXP
TOKEN_FILE = Path("secrets") / "drums.token"
TOKEN = "envab-recognisable-token-7f3a9c1e5b"  # what the file holds; found nowhere else


@pytest.fixture(scope="module")
def answered(tmp_path_factory, make_workflow):
    workflow = make_workflow(tmp_path_factory.mktemp("answer"))

    def config(c):
        # 32 tasks (24 to train on, 8 held out): the warm start plays 24 demonstrations, not 96.
        c["tasks"]["factory"]["per_family"] = 32
        c["training"]["sft"].update(steps=2, batch_size=4)
        c["training"]["grpo"].update(
            num_generations=2, prompts_per_step=2, max_turns=1, max_completion_length=64
        )

    def target(t):
        t["budget"].update(max_wall_clock_s=600, max_valid_trajectories=8)
        t["seeds"] = t["control_seeds"] = [1]  # one run per arm (replication: test_outcome.py)
        # One evaluation seed: 8 held-out episodes per checkpoint.
        t["evaluation"].update(checkpoint_interval=4, max_steps=1, seeds=[0])
        shrink_timing(t, 4)  # two blocks of 4 valid trajectories, both arms
        t.setdefault("equivalence", {"reference_start": 0.5, "margin_fraction": 0.5})
        t.setdefault("confirmation", {"delta": 0.05})
        # The three controls on the drums arm. Every reward flipped, so the corruption shows at
        # the first step whatever the draw. 20 s per set-up: the handicap's two set-ups must add
        # far more than the tiny run's noise (its one step took 8 to 12 s in runs alike, and
        # with 10 s per set-up a run came out 5.2 s short of 20, outside the 25 % tolerance).
        # Each on its own budget, half the A/B's: judged over the step and checkpoint both have.
        own = {"max_valid_trajectories": 4}
        t["controls"] = [
            {"name": "aa", "arm": "drums", "expect": "same", **own},
            {"name": "handicap", "arm": "drums", "expect": "slower", "reset_delay_s": 20, **own},
            {"name": "corruption", "arm": "drums", "expect": "differ", "flip_rewards": 1.0, **own},
        ]

    def token(c):
        for arm in c["arms"].values():
            arm["token_file"] = TOKEN_FILE.as_posix()

    workflow.embedded_arms()
    workflow.edit_config(config)
    workflow.edit_config(token)
    workflow.edit_target(target)
    (workflow.root / TOKEN_FILE).parent.mkdir()
    (workflow.root / TOKEN_FILE).write_text(TOKEN + "\n")
    (workflow.root / TOKEN_FILE).chmod(0o600)
    hook = tmp_path_factory.mktemp("audit")
    (hook / "sitecustomize.py").write_text(AUDIT_HOOK)
    workflow.opens = hook / "opens.jsonl"
    audited = {"PYTHONPATH": str(hook), "ENVAB_TEST_OPENS": str(workflow.opens)}
    OFFLINE.update(audited)  # every run of this module's workflow, the selection's included
    workflow.selected = run_selected_through_a_cluster_executor(workflow)
    workflow.console = ""  # what Snakemake's console showed
    for targets in ((), ("report",)):
        result = workflow.snakemake(*targets, timeout=1500, env=OFFLINE)
        logs = "".join(p.read_text()[-2000:] for p in (workflow.root / "logs").rglob("*.log"))
        assert result.returncode == 0, result.stderr[-3000:] + logs
        workflow.console += result.stderr
    return workflow


def run_selected_through_a_cluster_executor(workflow) -> dict:
    """`snakemake arm=drums seed=1`, the design card's command as typed, on a cluster executor
    whose every job is a Snakemake process of its own that re-parses the workflow without those
    words (cluster-generic, submitting by running the job script at once). What it leaves: the
    runs that exist afterwards, the outcome's runs, and the --config each job was given."""
    submit = workflow.root / "submit"
    submit.write_text(
        '#!/bin/sh\nmkdir -p submitted && cp "$1" submitted/ && bash "$1" >> submitted.log 2>&1\n'
        'echo "$$"\n'
    )
    submit.chmod(0o755)
    result = workflow.snakemake(
        *("--executor", "cluster-generic", "--cluster-generic-submit-cmd", str(submit)),
        # The submission runs the job before it returns: a status check a second later finds it
        # done; at the default, a round every 10 s, each of the 14 jobs waited for its round.
        *("--seconds-between-status-checks", "1", "--jobs", "1", "arm=drums", "seed=1"),
        timeout=1500,
        env=OFFLINE,
    )
    log = workflow.root / "submitted.log"
    assert result.returncode == 0, result.stderr[-3000:] + (
        log.read_text()[-3000:] if log.exists() else ""
    )
    # a selection's answer, under its own name: never the registration's (see below)
    selection = workflow.root / RESULTS / "selections" / "arm-drums_seed-1"
    outcome = json.loads((selection / "outcome.json").read_text())
    return {
        "runs": sorted(
            p.parent.name + "/" + p.name for p in (workflow.root / RESULTS).glob("*/seed*")
        ),
        "outcome": sorted((r["arm"], r["seed"]) for r in outcome["runs"]),
        "jobs": {p.name: p.read_text() for p in (workflow.root / "submitted").iterdir()},
    }


def test_no_training_process_ever_opens_the_held_out_split(answered):
    # The hook is live where it matters: training processes opened train.jsonl, and the
    # stop-at-target judge (its own process) opened the held-out split; no trainer did.
    opens = [json.loads(line) for line in answered.opens.read_text().splitlines()]
    by = [(Path(o["argv"][0]).name, Path(o["path"]).name) for o in opens]
    assert ("grpo.py", "train.jsonl") in by, sorted(set(by))
    assert ("stop_at_target.py", "heldout.jsonl") in by, sorted(set(by))
    assert ("grpo.py", "heldout.jsonl") not in by
    assert ("sft.py", "heldout.jsonl") not in by
    # nor is a held-out path ever in a trainer's arguments
    trainers = [o["argv"] for o in opens if Path(o["argv"][0]).name in ("grpo.py", "sft.py")]
    assert trainers and not any("heldout" in arg for argv in trainers for arg in argv)
    # The judge's held-out records live beside the evaluation store, outside the run's folder;
    # of them a trainer opens only the verdicts, the judge's one answer.
    judged = [o for o in opens if "judged" in Path(o["path"]).parts]
    assert any(Path(o["argv"][0]).name == "stop_at_target.py" for o in judged), sorted(set(by))
    assert not any("journal" in Path(o["path"]).parts for o in judged)
    trained = [o["path"] for o in opens if Path(o["argv"][0]).name in ("grpo.py", "sft.py")]
    held_out_records = [
        p
        for p in trained
        if {"judged", "evaluations"} & set(Path(p).parts)
        and not Path(p).name.startswith("verdict-")
    ]
    assert held_out_records == [], held_out_records


def test_speed_is_judged_in_timing_blocks_apart_from_learning(answered):
    # The shipped registration's primary endpoint, on two blocks of 4 valid trajectories here.
    outcome = json.loads((answered.root / RESULTS / "outcome.json").read_text())
    (primary,) = outcome["primary"]
    assert primary["endpoint"] == "seconds_per_valid_trajectory:wall_clock_s"
    assert primary["candidate"] == "drums" and primary["blocks"] == 2
    executions = outcome["speed"]["executions"]
    assert [e["block"] for e in executions] == [0, 1]
    assert {tuple(sorted(e["windows"])) for e in executions} == {("drums", "restore")}
    md = (answered.root / RESULTS / "outcome.md").read_text()
    assert "## Speed: seconds per valid trajectory in timing blocks" in md
    assert "## Three clocks" in md
    # each run's three clocks: the loop within provisioning + training within the whole
    for row in outcome["runs"]:
        c = row["clocks"]
        assert 0 < c["training_loop_s"] <= c["provisioned_s"] <= c["with_judging_s"], c
    assert outcome["warm_start"]["rates"]


def test_the_literal_command_ran_only_that_arm_and_seed_on_a_cluster(answered):
    selected = answered.selected
    assert selected["runs"] == ["drums/seed1"]
    assert selected["outcome"] == [("drums", 1)]
    spawned = selected["jobs"]
    assert any(name.startswith("snakejob.train.") for name in spawned)
    assert any(name.startswith("snakejob.outcome.") for name in spawned)
    for name, script in spawned.items():  # each re-parsed with the selection as config
        assert "--config \"arm='drums'\" 'seed=1'" in script, name


def test_a_selection_after_the_whole_run_leaves_the_registrations_answer_as_it_was(answered):
    # The answer of every run, then `snakemake arm=drums seed=1` again: the selection's answer
    # is its own (written by the first selection, before the whole run), the registration's
    # outcome and its receipt are byte for byte what they were.
    answer = [RESULTS / "outcome.json", RESULTS / "outcome.md", RECEIPTS / "outcome.json"]
    before = {path: (answered.root / path).read_bytes() for path in answer}
    result = answered.snakemake("arm=drums", "seed=1", timeout=900, env=OFFLINE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {path: (answered.root / path).read_bytes() for path in answer} == before
    whole = json.loads(before[RESULTS / "outcome.json"])
    assert len(whole["runs"]) == 2  # both arms' seed 1, not the selection's one run
    selection = RESULTS / "selections" / "arm-drums_seed-1"
    receipt = answered.root / RECEIPTS / "selections" / "arm-drums_seed-1" / "outcome.json"
    assert (answered.root / selection / "outcome.md").is_file() and receipt.is_file()


def test_the_console_shows_each_jobs_log_and_progress(answered):
    console = answered.console.splitlines()
    logs = f"logs/{EXP}"
    assert (
        f"[train restore seed1] log: {logs}/train_restore_seed1.log; GRPO until the budget is "
        "spent (or, where registered, the target is decided)" in console
    )
    assert any(
        line.startswith("[train restore seed1] checkpoint valid-000008: 8/8 valid (100%)")
        and "ETA" in line
        for line in console
    )
    assert any(
        line.startswith("[train restore seed1] done: max_valid_trajectories") for line in console
    )
    # The warm start ran in the cluster run before, where the job script's output is kept.
    spawned = (answered.root / "submitted.log").read_text().splitlines()
    assert any(line.startswith("[sft] step 2/2, loss ") for line in spawned)
    assert (
        f"[eval restore seed1 valid-000004] log: {logs}/eval_restore_seed1_valid-000004.log"
        in console
    )
    assert any(
        line.startswith("[eval restore seed1 valid-000004] held-out success ") for line in console
    )
    assert not any("Traceback" in line for line in console)  # tracebacks stay in the logs


def test_every_job_that_played_on_an_embedded_host_kept_the_hosts_log_beside_its_own(answered):
    # the host's reasons for an env_failure (no room for a checkpoint) are only in its log; the
    # evaluation workers' (every evaluation here is the judge's, reused): test_eval_corruption_run
    logs = answered.root / "logs" / EXP
    kept = {p.name for p in logs.glob("*.host.log") if p.stat().st_size > 0}
    assert "sft.host.log" in kept, sorted(kept)  # the warm start's demonstrations
    assert all((logs / name.replace(".host.log", ".log")).is_file() for name in kept)


def test_outcome_has_both_arms_and_a_verdict(answered):
    outcome = json.loads((answered.root / RESULTS / "outcome.json").read_text())
    assert sorted((r["arm"], r["seed"]) for r in outcome["runs"]) == [("drums", 1), ("restore", 1)]
    for row in outcome["runs"]:
        # reached, or an honest "never reached target" with the budget spent
        assert row["reached"] or row["verdict"] == "never reached target"
        spent = row if row["reached"] else row["budget_spent"]
        assert spent["valid_trajectories"] >= 4
    assert outcome["coincidence"][0]["candidate"] == "drums"
    # Both arms are the embedded host (restore per rollout against fork): the same data.
    divergence = outcome["divergence"][0]["seeds"][0]
    assert divergence["verdict"] == "never" and divergence["steps_compared"] >= 1, divergence
    assert outcome["coincidence"][0]["verdict"] in ("coincide", "differ", "inconclusive")
    text = (answered.root / RESULTS / "outcome.md").read_text()
    assert text.index("## Learning curves") < text.index("## Time to target")
    assert "one seed per arm" in text


def test_each_run_has_its_confirmation_or_says_it_had_nothing_to_confirm(answered):
    outcome = json.loads((answered.root / RESULTS / "outcome.json").read_text())
    for row in outcome["runs"]:
        record = json.loads(
            (
                answered.root / RESULTS / row["arm"] / f"seed{row['seed']}" / "confirm.json"
            ).read_text()
        )
        assert row["confirmation"]["verdict"] == record["verdict"]
        if row["reached"]:
            assert record["checkpoint"] == row["checkpoint"]
            assert record["test"]["episodes"] >= record["episodes_wanted"]
            assert min(record["seeds"]) >= 1000  # fresh: above every evaluation seed
        elif record["verdict"] == "not confirmed":  # not reached: censored like any other
            assert row["unconfirmed_crossing"]["checkpoint"] == record["checkpoint"]
        else:
            assert record["verdict"] == "no crossing to confirm"


def test_the_controls_ran_beside_the_a_b_with_their_registered_verdicts(answered):
    judged = json.loads((answered.root / RESULTS / "controls.json").read_text())
    controls = judged["controls"]
    by_name = {c["name"]: c for c in controls}
    assert [c["verdict"] for c in controls] == ["as expected"] * 3, controls
    # on CPU the A/A replays its base arm: determinism expected and observed, divergence decides
    determinism = judged["determinism"]
    assert (determinism["observed"], determinism["rules"]) == ("bit-deterministic", "deterministic")
    assert determinism["verdict"] == "as expected"
    assert by_name["aa"]["seeds"][0]["divergence"]["verdict"] == "never"
    assert by_name["corruption"]["seeds"][0]["divergence"]["step"] == 1
    handicap = by_name["handicap"]["seeds"][0]["timing"]
    assert handicap["setups"] == 2 and handicap["predicted_added_s"] == 40.0, handicap
    # The controls stopped at their own budget (4), the A/B's runs at its (8): the handicap is
    # judged at its own last checkpoint unless the base crossed there already.
    outcome = json.loads((answered.root / RESULTS / "outcome.json").read_text())
    (base,) = [r for r in outcome["runs"] if r["arm"] == "drums"]
    crossed_there = base["reached"] and base["checkpoint"] == "valid-000004"
    assert handicap["checkpoint"] == "valid-000004"
    assert handicap["judged_at"] == ("base_crossing" if crossed_there else "control_last"), handicap
    for arm, budget in (("drums", 8), *((f"drums-{c}", 4) for c in by_name)):
        final = json.loads((answered.root / RESULTS / arm / "seed1" / "run.json").read_text())
        assert budget <= final["valid_trajectories"] < 2 * budget, (arm, final)
        assert final["stop_reason"] == "max_valid_trajectories"
    assert by_name["aa"]["seeds"][0]["divergence"]["steps_only_in"]["baseline"] >= 1
    assert (answered.root / RESULTS / "drums-handicap" / "seed1" / "curve.csv").is_file()
    table = (answered.root / RESULTS / "controls.md").read_text()
    assert "| handicap | drums-handicap | reset_delay_s 20; 4 valid trajectories |" in table


def test_every_checkpoint_was_evaluated_on_the_registered_backend(answered):
    heldout = (answered.root / RESULTS / "tasks" / "heldout.jsonl").read_text().splitlines()
    assert len(heldout) == 8  # a quarter of the 32 tasks
    for arm in ("restore", "drums"):
        run_dir = answered.root / RESULTS / arm / "seed1"
        names = [json.loads(x)["checkpoint"] for x in (run_dir / "checkpoints.jsonl").open()]
        assert names
        for name in names:
            record = json.loads((run_dir / "eval" / f"{name}.json").read_text())
            assert record["backend"] == "restore"
            # every held-out task played, once per evaluation seed (one)
            assert record["episodes"] + record["invalid"] >= len(heldout)
            assert record["wall_s"] > 0 and record["cost_usd"] > 0


def test_an_identical_checkpoint_is_played_once_and_reused_by_every_run_that_saved_it(answered):
    evaluations = {}  # the files a checkpoint holds -> the evaluation records of every run's copy
    starting = set()  # the files of each run's first checkpoint, the starting model
    for run_dir in sorted((answered.root / RESULTS).glob("*/seed1")):
        for line in (run_dir / "checkpoints.jsonl").open():
            saved = json.loads(line)
            record = json.loads((run_dir / "eval" / f"{saved['checkpoint']}.json").read_text())
            files = json.dumps(saved["files"], sort_keys=True)
            evaluations.setdefault(files, []).append(record)
            if saved["valid_trajectories"] == 0:
                starting.add(files)
    store = answered.root / RESULTS / "evaluations"
    for records in evaluations.values():
        assert len({r["evaluation_key"] for r in records}) == 1
        # Played once: the store holds the one play (an eval job's, or, stop at target, the
        # judge's while training paused); at most one run's record is that play, every other a
        # reuse of it with its episodes.
        played = json.loads((store / f"{records[0]['evaluation_key']}.json").read_text())
        not_reused = [r for r in records if not r["reused"]]
        assert len(not_reused) <= 1, [r["evaluated_for"] for r in not_reused]
        for record in records:
            assert record["evaluated_for"] == played["evaluated_for"]
            assert record["episode_records"] == played["episode_records"]
            assert record["wall_s"] == played["wall_s"]  # what evaluating it costs, once
    # The starting model is the first checkpoint of all five runs (the A/B's two, the controls'
    # three): one evaluation, four reused.
    (model,) = starting
    assert len(evaluations[model]) == 5
    outcome = json.loads((answered.root / RESULTS / "outcome.json").read_text())
    assert sum(r["reused_evaluations"] for r in outcome["runs"]) >= 1


def test_every_job_has_its_time_and_the_breakdown_by_rule_sums_them(answered):
    """bench/ab_breakdown.py reads each job's benchmark file (the rules' `benchmark:`)."""
    out = answered.root / "breakdown.json"
    script = Path(__file__).resolve().parent.parent / "bench" / "ab_breakdown.py"
    result = subprocess.run(
        [sys.executable, str(script), "--directory", str(answered.root), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(out.read_text())
    rules = {r["rule"]: r for r in figures["rules"]}
    evaluations = list((answered.root / RESULTS).glob("*/seed1/eval/*.json"))
    assert rules["train"]["jobs"] == 5  # the A/B's two runs and the controls' three
    assert rules["eval"]["jobs"] == len(evaluations)
    for rule in ("freeze_target", "split", "model", "code_pins", "sft", "outcome", "report"):
        assert rules[rule]["jobs"] == 1, rule
    assert all(job["s"] > 0 for job in figures["jobs"])
    # Snakemake samples a job's memory once a second or so: a sub-second job (a run's pins) may
    # be caught before its Python has started, or not at all (NA). A job of seconds has its peak.
    assert all(job["peak_pss_mib"] > 0 for job in figures["jobs"] if job["s"] > 3)
    assert all(rules[rule]["peak_pss_mib"] > 0 for rule in ("train", "sft", "eval"))
    assert sum(r["s"] for r in figures["rules"]) == pytest.approx(
        sum(j["s"] for j in figures["jobs"])
    )
    # The longest rule heads the table.
    assert max(rules.values(), key=lambda r: r["s"])["rule"] == figures["rules"][0]["rule"]
    assert re.search(r"\| train \| 5 \| [\d.]+ \|", result.stdout), result.stdout


def embedded(report: str, filename: str) -> str:
    """An item's content as report.html embeds it: a base64 data URI that names the file."""
    found = re.search(rf"filename={re.escape(filename)};base64,([A-Za-z0-9+/=]+)", report)
    assert found, f"{filename} is not embedded in the report"
    return base64.b64decode(found.group(1)).decode()


def test_report_and_figures_exist(answered):
    report = (answered.root / "report.html").read_text(errors="replace")
    items = (
        "outcome.md",
        "curves_valid.png",
        "curves_wallclock.png",
        "curve.csv",
        "verification.html",
    )
    for item in items:
        assert item in report, item  # every item flagged with report() made it in
    assert "Learning curves" in report and "held-out tasks" in report
    # the verify result a reviewer checks, next to the outcome: every digest, all ok
    verification = embedded(report, "verification.html")
    assert re.search(r"verify: [1-9]\d* ok, 0 failed", verification), verification[:500]
    assert "<td>ok</td>" in verification and "<td>MISMATCH</td>" not in verification
    for receipt in ("outcome.json", "sft.json", "split.json"):
        assert (RECEIPTS / receipt).as_posix() in verification, receipt
    for figure in ("curves_valid.png", "curves_wallclock.png"):
        assert (answered.root / RESULTS / "figures" / figure).read_bytes()[:4] == b"\x89PNG"


def test_receipts_verify_including_the_outcome(answered):
    result = subprocess.run(
        [sys.executable, "-m", "envab.verify", str(RECEIPTS)],
        cwd=answered.root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "outcome.json  (the receipt itself)" in result.stdout
    outcome_receipt = json.loads((answered.root / RECEIPTS / "outcome.json").read_text())
    depends = {d["name"] for d in outcome_receipt["predicate"]["depends_on"]}
    assert (RECEIPTS / "split.json").as_posix() in depends
    assert (RECEIPTS / "sft.json").as_posix() in depends


def wandb_runs(root: Path) -> dict[str, dict]:
    """Every offline wandb run under results/<exp>/wandb, read back with wandb's own reader
    (`wandb leet inspect --json`): its run record, its axis definitions, its history rows."""
    wandb = Path(sys.executable).parent / "wandb"
    runs = {}
    for file in sorted((root / RESULTS / "wandb").glob("wandb/offline-run-*/run-*.wandb")):
        result = subprocess.run(
            [str(wandb), "leet", "inspect", "--json", str(file)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        run = next(r["run"] for r in records if r["type"] == "run")
        metrics = [r["metric"] for r in records if r["type"] == "metric"]
        runs[run["display_name"]] = {
            "run": run,
            "axes": {m.get("glob_name", m.get("name")): m.get("step_metric") for m in metrics},
            "history": [r["history"]["item"] for r in records if r["type"] == "history"],
        }
    return runs


def test_wandb_has_both_arms_curves_against_valid_trajectories_and_wall_clock(answered):
    import pandas as pd

    runs = wandb_runs(answered.root)
    arms = ("restore", "drums", "drums-aa", "drums-handicap", "drums-corruption")  # controls too
    names = {f"{kind}-{arm}-seed1" for kind in ("train", "eval") for arm in arms}
    assert set(runs) == names
    for name, run in runs.items():
        kind, arm = name.split("-", 1)
        arm = arm.removesuffix("-seed1")
        # the controls in a group of their own: grouping the A/B's group by arm shows two arms
        control = arm.startswith("drums-")
        assert run["run"]["run_group"] == (f"{EXP}-controls" if control else EXP)
        assert run["run"]["job_type"] == kind
        assert run["run"]["tags"] == [f"arm:{arm}", "seed:1", "control" if control else "a/b"]
        assert run["axes"]["train/*"] == "valid_trajectories"
        assert run["axes"]["heldout/*"] == "valid_trajectories"
        assert run["axes"]["heldout_wall_clock/*"] == "wall_clock_s"
        if kind == "train":  # a row per GRPO step, the counters climbing to the budget
            rewards = [row for row in run["history"] if "train/reward" in row]
            valid = [row["valid_trajectories"] for row in rewards]
            assert rewards and valid == sorted(valid) and valid[-1] >= 4
            assert all("train/invalid_discarded" in r and "train/step_s" in r for r in rewards)
        else:  # the held-out curve is the run's curve.csv, point for point
            curve = pd.read_csv(answered.root / RESULTS / arm / "seed1" / "curve.csv")
            scored = curve[curve["scored"]]
            points = [
                (r["valid_trajectories"], r["wall_clock_s"], r["heldout/success_rate"])
                for r in run["history"]
            ]
            assert points == list(
                zip(
                    scored["valid_trajectories"],
                    scored["wall_clock_s"],
                    scored["heldout_success_rate"],
                    strict=True,
                )
            )
            assert all(
                r["heldout_wall_clock/success_rate"] == r["heldout/success_rate"]
                for r in run["history"]
            )


def test_the_token_is_in_no_file_the_run_wrote(answered):
    """Logs, receipts, trajectories, checkpoints, the report, wandb's files, Snakemake's own
    records: every file under the workflow but the token's own holds neither the token nor its
    base64 form."""
    needles = (TOKEN.encode(), base64.b64encode(TOKEN.encode()))
    scanned, holding = [], []
    for path in sorted(answered.root.rglob("*")):
        if path.is_file() and not path.is_symlink() and path != answered.root / TOKEN_FILE:
            data = path.read_bytes()
            scanned.append(path.relative_to(answered.root).as_posix())
            if any(n in data for n in needles):
                holding.append(scanned[-1])
    assert holding == []
    kinds = ("trajectories.jsonl", "model.safetensors", ".log", ".wandb", "report", "receipts/")
    assert all(any(k in name for name in scanned) for k in kinds), kinds
    # The arms did read the token file: the host refuses anything else (test_host), and a run
    # that named it reached its host.
    pins = json.loads((answered.root / RESULTS / "drums" / "seed1" / "pins.json").read_text())
    assert pins["arm_config"]["token_file"] == TOKEN_FILE.as_posix()


CHECKPOINT = RESULTS / "drums" / "seed1" / "checkpoints" / "valid-000000" / "model.safetensors"


# (what is tampered with, the output whose job is forced when Snakemake cannot see the edit).
# Snakemake compares modification times, and an edit inside a directory output (the model, a
# checkpoint) or to a file no job lists as input (outcome.json, checked through its receipt)
# does not make it rerun anything; the job that reads it is then forced, as a rerun would be.
TAMPERED = [
    (Path("preregistration/target.yaml"), None),
    (RESULTS / "model" / "model.safetensors", RECEIPTS / "sft.json"),
    (RESULTS / "tasks" / "train.jsonl", None),
    (RESULTS / "tasks" / "heldout.jsonl", None),
    (RECEIPTS / "preregistration.json", None),
    (RECEIPTS / "split.json", None),
    (RECEIPTS / "model.json", None),
    (RECEIPTS / "sft.json", None),
    (RECEIPTS / "outcome.json", None),
    (CHECKPOINT, RESULTS / "drums" / "seed1" / "eval" / "valid-000000.json"),
    (RESULTS / "outcome.json", RESULTS / "verification.html"),
]


@pytest.mark.parametrize(("path", "force"), TAMPERED, ids=[p.as_posix() for p, _ in TAMPERED])
def test_a_tampered_item_is_named_by_verify_and_refused_by_the_next_job(
    answered, tmp_path, path, force
):
    root = tmp_path / "wf"
    shutil.copytree(answered.root, root, symlinks=True)
    target = root / path
    os.chmod(target, 0o644)  # receipts are write-protected; a tamperer does not care
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))

    verified = subprocess.run(
        [sys.executable, "-m", "envab.verify", str(RECEIPTS)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    failed = [
        line
        for line in verified.stdout.splitlines()
        if not line.startswith(("ok", "verify:", "DIFFERS"))
    ]
    assert verified.returncode == 1, verified.stdout[-2000:]
    assert any(path.as_posix() in line.split() for line in failed), failed

    args = ("--force", str(force)) if force else ()
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **OFFLINE},
    )
    assert result.returncode != 0, result.stderr[-2000:]
    # What the refusing job said: Snakemake's console and the logs written by this run.
    logs = "".join(
        p.read_text() for p in (root / "logs").rglob("*.log") if p.stat().st_mtime >= started
    )
    said = (result.stderr + logs).splitlines()
    refusals = ("env-ab:", "error:", "MISMATCH", "MALFORMED")
    assert any(path.name in line and any(r in line for r in refusals) for line in said), said[-40:]
