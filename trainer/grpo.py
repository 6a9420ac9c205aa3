"""GRPO training of one (arm, seed) run against the arm's environment, with exact accounting.

    python -m envab.trainer.grpo --target preregistration/target.yaml \
        --receipts receipts/<exp>/*.json \
        --pins results/<exp>/<arm>/seed<k>/pins.json --model results/<exp>/sft/model \
        --train results/<exp>/tasks/train.jsonl --trajectories .../trajectories.jsonl \
        --checkpoint-records .../checkpoints.jsonl --checkpoints .../checkpoints \
        --run .../run.json --steps .../steps.jsonl --wandb-dir results/<exp>/wandb \
        [--log logs/<exp>/train_<arm>_seed<k>.log]

Reads top to bottom in the order a run happens, one short function a step:

1. `check_inputs`: the target is frozen and unedited, the freeze receipts verify, the frozen code
   is the code running, the run's pins match the receipts, no held-out id is in the training data;
2. `open_ledger`: the run's journal (trainer/resume.py), rolled back to its last resume point if
   an earlier process of this run died, the outputs linked to it, and the counters
   (trainer/accounting.py), restored from that point;
3. `build_trainer` (trainer/build.py): seeding, the dataset (one row per training task with its
   first screenshot pre-rendered), the checked model, the arm's fork-group layer and TRL's
   GRPOTrainer (with a digest line per generation batch, trainer/step_digests.py) with the
   environment (trainer/environment.py) and the `Accounting` callback (trainer/callback.py),
   which saves the starting model as checkpoint valid-000000, starts the clock at the first
   step, saves a checkpoint every N valid trajectories (with TRL's state of that step, and a
   resume point once both are whole), stops at the budget, puts a line per checkpoint on the
   console and every step on the run's wandb run;
4. `run`: trainer.train() with the arm open, from the resume point if there is one;
5. `write_record`: run.json, the final counters, the stop reason, when the run started and when
   it was frozen, its restarts, and the load the machine was under (envab/machine_load.py); then
   the training-records receipt (`--receipt`, envab/run_receipts.py): a digest of every record
   as training left it, rewritten by a resumed run at its end.

Settings come from the run's pins (`training`, frozen with the run; where and how the model runs
is its `compute`, trainer/compute.py), the checkpoint interval and the budget from the frozen
pre-registration. The GPU path (device cuda, bf16, LoRA through peft, vLLM colocated or as a
`trl vllm-serve` server this job starts and stops) is built and checked on the CPU short of CUDA
(tests/test_compute.py, tests/test_generation.py, tests/test_vllm_server.py); it has not yet run
on a GPU. Several processes (training.compute.processes) each play their share of a step on their
own arm, and rank 0 owns the ledger, the checkpoints and the budget (trainer/ranks.py,
tests/test_ranks.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from envab import machine_load, preregistration, signing
from envab.envs.arms import files_beside, open_arm
from envab.envs.placement import PlacementError, pin
from envab.errors import Refusal, refused
from envab.hashing import sha256_file
from envab.io import atomic_write_json, read_jsonl
from envab.machine import accelerator, machine_kind
from envab.progress import Console, duration, job_console
from envab.receipts import utc_now
from envab.run_receipts import write_training_receipt
from envab.schema import ConfigError
from envab.tracking import public_arm_config, start_run
from envab.trainer import agent, preflight
from envab.trainer.accounting import Ledger, Prices
from envab.trainer.build import build_trainer, prepare
from envab.trainer.callback import Accounting
from envab.trainer.compute import check_cuda, compute_settings
from envab.trainer.forkgroups import ForkGroups
from envab.trainer.generation import Generation
from envab.trainer.guards import (
    GuardError,
    HeldoutGuard,
    check_code,
    check_pins,
    check_receipts,
    check_split_file,
    held_out,
    heldout_ids,
)
from envab.trainer.ranks import Ranks
from envab.trainer.resume import (
    KILL_ENV,
    Journal,
    Restart,
    held,
)
from envab.trainer.run_inputs import (
    GrpoSettings,
    Outputs,
    RunInputs,
    read_fault_plan,
)
from envab.trainer.vllm_server import served

log = logging.getLogger(__name__)

# --- 1. check inputs -----------------------------------------------------------------------------


def check_inputs(args, outputs: Outputs, journal: Journal) -> RunInputs:
    prereg, receipts = preregistration.frozen_inputs(args)
    if args.timing_window:
        # A timing block's window (trainer/timing.py): the run's first N valid trajectories,
        # replayed to be timed beside the other windows; never judged, never stopped at target.
        prereg = prereg.timing_window(args.timing_window)
    if args.receipt:
        signing.check_configured()  # its receipt is signed at the run's end
    check_receipts(receipts, unread=held_out)  # never opens the held-out split
    check_code(receipts)
    pins = check_pins(args.pins, receipts)
    if pins.experiment_id != prereg.experiment_id:
        raise GuardError(f"{args.pins} belongs to experiment {pins.experiment_id!r}")
    guard = HeldoutGuard(heldout_ids(receipts))
    check_split_file(args.train, receipts, "train")
    tasks = {t["id"]: t for t in read_jsonl(args.train)}
    guard.check_dataset(tasks)
    faults = read_fault_plan()
    written = any(
        p.is_file() and p.stat().st_size
        for p in (outputs.trajectories, outputs.checkpoint_records, outputs.steps)
    ) or (outputs.checkpoints.is_dir() and any(outputs.checkpoints.iterdir()))
    if written and not journal.point_path.is_file():
        raise GuardError(
            f"{outputs.run.parent} already holds training records and no journal to resume "
            "from; records are append-only, so remove them (Snakemake does before a rerun) to "
            "train again"
        )
    stops = prereg.budget_for(pins.arm).stop_at_target
    if stops != (getattr(args, "stop_at_target", None) is not None):
        raise ConfigError(
            f"run {pins.arm}: the pre-registration "
            + (
                "stops it at target: --stop-at-target must say how its checkpoints are judged"
                if stops
                else "trains it to the budget: --stop-at-target is not registered"
            )
        )
    compute = compute_settings(pins.training)
    if compute.device == "cuda":
        check_cuda(vllm=compute.vllm is not None)
    return RunInputs(
        prereg=prereg,
        receipts=receipts,
        pins=pins,
        arm=pins.arm,
        seed=pins.seed,
        settings=GrpoSettings(**pins.training["grpo"]),
        tools=agent.tool_set(pins.training["tools"]),
        tasks=tasks,
        guard=guard,
        faults=faults,
        compute=compute,
    )


# --- 2. open the ledger --------------------------------------------------------------------------


def open_ledger(
    inputs: RunInputs, outputs: Outputs, journal: Journal, console: Console
) -> tuple[Ledger, Restart | None]:
    """The journal, rolled back to its last resume point if a process of this run died (what it
    lost is said), the outputs linked to it, and the counters: from zero, or from that point.
    The record files exist from the start even when no attempt or checkpoint comes due."""
    restart = journal.open()
    journal.link_outputs(
        {
            "trajectories": outputs.trajectories,
            "steps": outputs.steps,
            "checkpoints": outputs.checkpoint_records,
        },
        outputs.checkpoints,
    )
    ledger = new_ledger(inputs, journal)
    ledger.on_record = journal.beat
    if restart is not None:
        ledger.restore(restart.point.ledger, restart.wall_clock_s)
        console.say(
            f"resuming from checkpoint {restart.point.checkpoint} (step "
            f"{restart.point.global_step}): {restart.lost} trajectories after it lost, "
            f"{duration(restart.lost_s)} of lost work counted"
        )
    return ledger, restart


# --- 3. build the trainer: trainer/build.py (its Accounting callback: trainer/callback.py) --------


# --- 4. run --------------------------------------------------------------------------------------


def train(args, console: Console, ranks: Ranks) -> dict | None:
    """The run; its record from rank 0, None from the other ranks of a run on several."""
    outputs = Outputs(
        Path(args.trajectories),
        Path(args.checkpoint_records),
        Path(args.checkpoints),
        Path(args.run),
        Path(args.steps),
    )
    journal = Journal(outputs.run.parent)
    ranks.start()
    inputs = check_inputs(args, outputs, journal)
    ranks.barrier()  # every rank checked the outputs before rank 0 opens them
    if ranks.main:
        ledger, restart = open_ledger(inputs, outputs, journal, console)
    else:  # counts nothing itself: its attempts go to rank 0 at each step's end
        ledger, restart = new_ledger(inputs, journal), None
    restart = ranks.broadcast(restart)  # each rank resumes its own draws from rank 0's point
    if restart is not None and len(restart.point.draws) != ranks.count:
        raise GuardError(
            f"{journal.dir}: the run was started on {len(restart.point.draws)} training "
            f"processes and cannot resume on {ranks.count}"
        )
    if ranks.several:
        ledger.pending = []
        ledger.hosts = ranks.count  # each process holds its own arm for the whole run
    ranks.barrier()
    prepared = prepare(inputs, args.model)
    tracker = (
        start_run(
            "train",
            inputs.prereg.experiment_id,
            inputs.arm,
            inputs.seed,
            sha256_file(args.target),
            {
                "training": inputs.pins.training,
                "arm_config": public_arm_config(inputs.pins.arm_config),
                "budget": asdict(inputs.prereg.budget_for(inputs.arm)),
            },
            directory=args.wandb_dir,
            control_of=inputs.prereg.prices.controls.get(inputs.arm),
        )
        if ranks.main
        else Silent()
    )
    if ranks.several and inputs.pins.training.get("cpus"):
        raise ConfigError("training.cpus pins one training process; not with several processes")
    placement = place(inputs.pins.training.get("cpus"))
    started = machine_load.Snapshot.now()
    # A server-mode run's vLLM server logs beside the job.
    vllm_log = outputs.run.parent / "vllm.log"
    if args.log:
        vllm_log = Path(args.log).with_suffix(".vllm.log")
    with (
        served(inputs.compute, args.model, vllm_log, starts=ranks.main) as server,
        open_arm(
            inputs.pins.arm_config,
            log_path=rank_path(args.host_log, ranks),
            allow_faults=bool(inputs.faults),
            files=files_beside(args.train),  # the tasks' downloads, frozen by content
        ) as backend,
    ):
        groups = ForkGroups(
            backend,
            inputs.settings.num_generations,
            inputs.faults.attempts,
            group_faults=inputs.faults.groups,
            prefix=inputs.settings.prefix,
            settle_s=inputs.settings.settle_s,
            parallel=inputs.settings.parallel_creates,
        )
        trainer, callback = build_trainer(
            inputs,
            prepared,
            ledger,
            groups,
            outputs,
            journal,
            restart,
            args,
            console,
            tracker,
            ranks,
        )
        # Before the first step: the screenshots reach the model, calls parse, the turns fit.
        checks = preflight.run(
            trainer,
            prepared.processor,
            next(iter(inputs.tasks.values())),
            inputs.settings.max_turns,
            inputs.settings.max_completion_length,
        )
        resume_from = None
        if restart is not None:  # this rank's attempt ordinal and backend's draws as they were
            draws = restart.point.draws[ranks.index]
            groups.resets = draws["resets"]
            if draws["backend"] is not None:
                backend.restore_state(draws["backend"])
            if restart.point.trl_checkpoint:
                resume_from = str(journal.trl / restart.point.trl_checkpoint)
        try:
            trainer.train(resume_from_checkpoint=resume_from)
        finally:
            groups.close()
            callback.progress.close()
            tracker.finish()
        # What the arm is, beyond its config (a VM pool: acceleration, guest and snapshot digests).
        environment = backend.describe() if hasattr(backend, "describe") else None
    # After the arm is closed, so that its processes' CPU time is counted.
    measured = machine_load.since(started)
    if not ranks.main:
        return None
    return write_record(
        inputs,
        ledger,
        trainer,
        callback,
        {
            "environment": environment,
            "load": measured,
            "placement": placement,
            "vllm": server,
            "processes": ranks.count,  # each with its own arm; rank 0 recorded every attempt
            "preflight": checks,
        },
        args,
        outputs,
        journal,
    )


def new_ledger(inputs: RunInputs, journal: Journal) -> Ledger:
    """The run's counters at zero, writing to the journal's record files. A rank other than 0
    keeps one too, only to hold its attempts for rank 0: it never writes."""
    prices = inputs.prereg.prices
    return Ledger(
        trajectories_path=str(journal.records["trajectories"]),
        checkpoints_path=str(journal.records["checkpoints"]),
        arm=inputs.arm,
        seed=inputs.seed,
        checkpoint_interval=inputs.prereg.evaluation.checkpoint_interval,
        prices=Prices(prices.host(inputs.arm), prices.inference_usd_per_hour),
    )


def rank_path(path: str | None, ranks: Ranks) -> str | None:
    """A per-process file beside `path` for the ranks other than 0 (rank 0 keeps `path`)."""
    if path is None or ranks.main:
        return path
    return str(Path(path).with_suffix(f".rank{ranks.index}{Path(path).suffix}"))


class Silent:
    """The tracker of a rank other than 0: rank 0 logs the run."""

    def log(self, *args, **kwargs) -> None:
        pass

    def finish(self) -> None:
        pass


def place(cpus: dict | None) -> dict | None:
    """training.cpus: the trainer on its CPUs, the arm's processes on theirs (before the arm
    starts and before torch's threads do their first work)."""
    if not cpus:
        return None
    try:
        placement = pin(cpus["trainer"], cpus["environments"])
    except PlacementError as e:
        raise ConfigError(str(e)) from None
    torch.set_num_threads(len(placement["trainer"]))
    return placement


# --- 5. write the record -------------------------------------------------------------------------


def write_record(
    inputs: RunInputs,
    ledger: Ledger,
    trainer,
    callback: Accounting,
    measured: dict,
    args,
    outputs: Outputs,
    journal: Journal,
) -> dict:
    restarts = journal.restarts()
    record = {
        "arm": inputs.arm,
        "seed": inputs.seed,
        "experiment_id": inputs.prereg.experiment_id,
        **ledger.counters(),
        "stop_reason": callback.stop_reason or "trainer_finished",
        # Stop at target (budget.stop_at_target): each look's verdict, and the wall-clock spent
        # judging with the clock paused (not in wall_clock_s).
        "stop_at_target": (
            {"verdicts": callback.judge.verdicts, "failures": callback.judge.failures}
            if callback.judge
            else None
        ),
        "paused_s": ledger.paused_s,
        "steps": trainer.state.global_step,
        "checkpoints": ledger.checkpoints,
        "started_utc": ledger.started_utc,
        "frozen_utc": preregistration.frozen_utc(inputs.receipts[preregistration.RECEIPT]),
        "ended_utc": utc_now(),
        "model": Path(args.model).as_posix(),
        "pins_sha256": sha256_file(args.pins),
        "fault_plan_sha256": inputs.faults.sha256,
        "kill_plan": os.environ.get(KILL_ENV),
        "device": inputs.compute.device,
        "torch_threads": torch.get_num_threads(),
        # What the arm is beyond its config; the load the machine was under (CPU time, load
        # average and steal, envab/machine_load.py); the CPUs of the trainer and of the arm
        # (training.cpus); the vLLM server of a server-mode run.
        **measured,
        # Each restart after a process of the run died (trainer/resume.py): the attempts lost
        # (lost.jsonl) and their wall-clock, counted above; the downtime, not counted.
        "restarts": restarts,
        "lost_trajectories": sum(r["lost_trajectories"] for r in restarts),
        "lost_s": sum(r["lost_s"] for r in restarts),
        "downtime_s": sum(r["downtime_s"] for r in restarts),
        # Where this process's GRPO steps spent their wall-clock (trainer/step_times.py).
        "step_times": callback.run.times.summary(),
        # How a turn's tool calls ran: the width (training.grpo.parallel_steps; 1: TRL's loop, one
        # after another) and the batches' counts and seconds (trainer/toolcalls.py).
        "tool_calls": trainer.tool_calls.summary(),
        **generation_record(trainer, inputs.settings, callback.run.times.summary()),
    }
    atomic_write_json(outputs.run, record)
    if args.receipt:  # before the journal goes: a process killed here resumes and writes it
        write_training_receipt(
            args.receipt,
            [
                args.pins,
                outputs.trajectories,
                outputs.steps,
                outputs.checkpoint_records,
                outputs.run,
            ],
            inputs.receipts.paths,
            record,
        )
    journal.close(outputs.run.parent)
    return record


def generation_record(trainer, settings: GrpoSettings, times: dict) -> dict:
    """Completion tokens generated (TRL's logged mean completion length x the step's batch) and
    per second of generation, how a turn was generated; the GPU's peak memory where there is
    one."""
    tokens = sum(
        entry["completions/mean_length"] * settings.batch_size
        for entry in trainer.state.log_history
        if "completions/mean_length" in entry
    )
    generation_s = times.get("total_s", {}).get("generation")
    generation = Generation(settings.temperature, settings.max_completion_length, settings.turn_end)
    record = {
        "generated_tokens": round(tokens),
        "generated_tokens_per_s": round(tokens / generation_s, 1) if generation_s else None,
        "generation": generation.settings(trainer._tokenizer),  # suppressed tokens included
        # What bit-determinism holds within (envab/machine.py): a verdict says which case it is.
        "machine": {
            **machine_kind(threads=torch.get_num_threads()),
            "accelerator": accelerator(),
        },
    }
    if torch.cuda.is_available():
        record["cuda_peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.trainer.grpo", description=__doc__.split("\n")[0]
    )
    preregistration.add_frozen_arguments(parser)
    parser.add_argument("--pins", required=True, help="results/<exp>/<arm>/seed<k>/pins.json")
    parser.add_argument("--model", required=True, help="the SFT output, or the pinned model")
    parser.add_argument("--train", required=True, help="the training split (train.jsonl)")
    parser.add_argument("--trajectories", required=True, help="writes: every attempt, JSONL")
    parser.add_argument("--checkpoint-records", required=True, help="writes: checkpoints.jsonl")
    parser.add_argument("--checkpoints", required=True, help="writes: one folder per checkpoint")
    parser.add_argument("--run", required=True, help="writes: run.json, the final record")
    parser.add_argument("--steps", required=True, help="writes: steps.jsonl, a digest per step")
    parser.add_argument(
        "--receipt",
        help="writes: receipts/<exp>/train_<arm>_seed<k>.json, the training records' digests when"
        " the run ends (envab/run_receipts.py); none without it",
    )
    parser.add_argument(
        "--stop-at-target",
        type=json.loads,
        help="JSON: how the stop-at-target judge evaluates checkpoints (backend, confirm_backend,"
        " store, log; rules/common.smk: no held-out path, the judge finds it by the split"
        " receipt), where the pre-registration registers budget.stop_at_target for this run",
    )
    parser.add_argument(
        "--cores", type=int, default=1, help="the job's cores: the judge's evaluations' processes"
    )
    parser.add_argument(
        "--timing-window",
        type=int,
        help="a timing block's window (trainer/timing.py): train to this many valid trajectories,"
        " never stopped at target, in place of the registered budget",
    )
    parser.add_argument("--host-log", help="where an embedded host writes its log")
    parser.add_argument("--wandb-dir", required=True, help="where the offline wandb run goes")
    parser.add_argument("--log", help="the job's log; the console then gets a line per checkpoint")
    args = parser.parse_args(argv)
    run_dir = Path(args.pins).parent  # results/<exp>/<arm>/seed<k>
    ranks = Ranks()  # this process among the run's (trainer/ranks.py); rank 0 keeps the job's log
    console = job_console(
        f"train {run_dir.parent.name} {run_dir.name}"
        + (f" rank {ranks.index}" if ranks.several else ""),
        rank_path(args.log, ranks),
        "GRPO until the budget is spent (or, where registered, the target is decided)",
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        # Rank 0 owns the run's journal (the other ranks write none of it): one trainer per run.
        with held(run_dir) if ranks.main else contextlib.nullcontext():
            record = train(args, console, ranks)
        if record is None:  # a rank other than 0: rank 0 reports the run
            return 0
    except Refusal as e:
        return refused(e, console)
    except OSError as e:  # a full disk, a file too large: the journal keeps the last resume point
        log.exception("the run could not write")
        line = f"error: {e}; run it again once that is fixed: it resumes from its last checkpoint"
        print(line, file=sys.stderr)
        console.say(line)
        return 2
    summary = (
        f"{record['stop_reason']} after {record['valid_trajectories']} valid, "
        f"{record['invalid_discarded']} invalid, {record['checkpoints']} checkpoints, "
        f"{record['wall_clock_s']:.1f} s"
    )
    print(f"train {record['arm']} seed {record['seed']}: {summary}")
    console.say(f"done: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
