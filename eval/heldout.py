"""Held-out evaluation of one checkpoint: a separate, measured workload.

    python -m envab.eval.heldout --target preregistration/target.yaml \
        --receipts receipts/<exp>/*.json \
        --pins results/<exp>/<arm>/seed<k>/pins.json \
        --checkpoint-records results/<exp>/<arm>/seed<k>/checkpoints.jsonl \
        --checkpoint results/<exp>/<arm>/seed<k>/checkpoints/<name> \
        --heldout results/<exp>/tasks/heldout.jsonl --backend '{"backend": "drums", ...}' \
        --out results/<exp>/<arm>/seed<k>/eval/<name>.json

Per the frozen protocol (eval/episodes.py): every held-out task, `episodes_per_task` episodes for
each evaluation seed, on the pre-registered evaluation backend (the same arm's environment for
every arm under test; any arm, opened by `envab.envs.arms.open_arm`), on a process per core where
the job has them (eval/workers.py). Wall-clock and cost (evaluation host price + inference price)
are recorded apart from training.

An identical checkpoint (file for file) under the same protocol and backend is played once
(`--store`, eval/reuse.py): a later job takes the stored record, marked `reused`. The files are
checked against the run's record first, and torch is loaded only when episodes are played.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from envab import machine_load, preregistration
from envab.envs.arms import ArmError, files_beside
from envab.eval import workers
from envab.eval.episodes import Protocol, summary
from envab.eval.reuse import Store, evaluated_once, evaluation_key
from envab.hashing import sha256_file
from envab.io import atomic_write_json, read_jsonl
from envab.preregistration import Preregistration
from envab.progress import Console, duration, eta, job_console
from envab.receipts import Receipts
from envab.run_pins import RunPins
from envab.schema import ConfigError
from envab.trainer.compute import compute_settings
from envab.trainer.guards import GuardError, check_receipts, check_split_file, heldout_ids
from envab.trainer.manifest import ModelPinError, check_manifest
from envab.trainer.model import base_manifest


class EpisodeProgress:
    """Every episode to the log; a line on the console at each quarter of the episodes."""

    def __init__(self, console: Console, episodes: int):
        self.console, self.episodes, self.done, self.successes = console, episodes, 0, 0

    def episode(self, record: dict) -> None:
        print(json.dumps(record))
        if record["verdict"] != "valid":
            return
        self.done += 1
        self.successes += record["score"] == 1.0
        if self.done % max(1, self.episodes // 4) == 0 and self.done < self.episodes:
            elapsed = self.console.elapsed()
            self.console.say(
                f"{self.done}/{self.episodes} episodes, {self.successes} succeeded, "
                f"{duration(elapsed)}, ETA {eta(self.done, self.episodes, elapsed)}"
            )


def check_inputs(args) -> tuple[Preregistration, list[dict], RunPins, Receipts]:
    """The frozen pre-registration, the frozen held-out tasks, the run's pins and the receipts."""
    prereg, receipts = preregistration.frozen_inputs(args)
    check_receipts(receipts)
    check_split_file(args.heldout, receipts, "heldout")
    tasks = list(read_jsonl(args.heldout))
    if {t["id"] for t in tasks} != heldout_ids(receipts):
        raise GuardError(f"{args.heldout} is not the frozen held-out set")
    return prereg, tasks, RunPins.load(args.pins), receipts


def recorded_files(checkpoint: str, records: str) -> dict[str, str]:
    """The files training recorded for this checkpoint: the model evaluated must be exactly
    those (checked_key checks them before anything is reused or loaded)."""
    name = Path(checkpoint).name
    saved = {r["checkpoint"]: r["files"] for r in read_jsonl(records)}
    if name not in saved:
        raise GuardError(f"{name} is not a checkpoint recorded in {records}")
    return saved[name]


def checked_key(
    checkpoint, records: str, protocol: Protocol, pins: RunPins, backend: dict, heldout, receipts
):
    """The checkpoint's files checked against the run's record (and a LoRA checkpoint's base
    model against its receipt), before anything is reused or loaded; then the key its evaluation
    under `protocol` is stored by (eval/reuse.py)."""
    files = recorded_files(str(checkpoint), records)
    check_manifest(checkpoint, files)
    base = base_manifest(checkpoint, receipts)
    if base is not None:
        files = {**files, **{f"base/{path}": digest for path, digest in base.items()}}
    return evaluation_key(
        files, asdict(protocol), pins.training["tools"], backend, sha256_file(heldout)
    )


def play_checkpoint(
    checkpoint,
    pins: RunPins,
    protocol: Protocol,
    tasks: list[dict],
    backend: dict,
    console,
    what,
    receipts: Receipts,
    files: Path | None = None,
    cores: int = 1,
    host_log: str | None = None,
) -> dict:
    """Load the checkpoint and play every episode of `protocol` on the evaluation arm (`backend`,
    its config; the console hears "<n> <what>" first), on the job's `cores` (eval/workers.py):
    the result with its wall-clock, the machine's load meanwhile and the generation time."""
    started, snapshot = time.perf_counter(), machine_load.Snapshot.now()
    # Its files were checked against the run's record just before (checked_key); a LoRA
    # checkpoint's base is checked again as it loads.
    compute = compute_settings(pins.training)  # the device and dtype the run trained on
    player = workers.Player(
        checkpoint=str(checkpoint),
        tools=pins.training["tools"],  # the tools the policy was trained with
        compute=compute,
        base_expected=base_manifest(checkpoint, receipts),
        protocol=protocol,
        backend=backend,
        files=files,  # the tasks' frozen downloads
        host_log=host_log,  # an embedded host's reasons for an env_failure
    )
    processes = workers.processes_for(compute, cores, len(tasks), backend)
    episodes = len(tasks) * len(protocol.seeds) * protocol.episodes_per_task
    console.say(f"{episodes} {what}" + (f", {processes} processes" if processes > 1 else ""))
    progress = EpisodeProgress(console, episodes)
    played = workers.play(player, tasks, processes, cores, log=progress.episode)
    return {
        **summary(played.episodes, protocol),
        "wall_s": time.perf_counter() - started,
        "load": machine_load.since(snapshot),  # CPU time, load average and steal
        "inference_s": played.inference_s,  # every process's generation time, added up
        "generation": played.generation,  # suppressed tokens too
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.eval.heldout", description=__doc__.split("\n")[0]
    )
    preregistration.add_frozen_arguments(parser)
    parser.add_argument("--pins", required=True, help="the run's pins.json")
    parser.add_argument("--checkpoint-records", required=True, help="the run's checkpoints.jsonl")
    parser.add_argument("--checkpoint", required=True, help="the checkpoint's model folder")
    parser.add_argument("--heldout", required=True, help="heldout.jsonl")
    parser.add_argument("--backend", required=True, help="JSON: the evaluation arm's config")
    parser.add_argument("--out", required=True, help="writes: eval/<checkpoint>.json")
    parser.add_argument(
        "--store", help="evaluations by key (results/<exp>/evaluations): reused, then kept"
    )
    parser.add_argument("--log", help="the job's log; the console then gets its progress")
    workers.add_cores_argument(parser)
    workers.add_host_log_argument(parser)
    args = parser.parse_args(argv)
    run_dir = Path(args.pins).parent  # results/<exp>/<arm>/seed<k>
    name = Path(args.checkpoint).name
    console = job_console(f"eval {run_dir.parent.name} {run_dir.name} {name}", args.log)
    try:
        prereg, tasks, pins, receipts = check_inputs(args)
        protocol = Protocol.frozen(prereg.evaluation, pins.training)
        backend = json.loads(args.backend)
        key = checked_key(
            args.checkpoint,
            args.checkpoint_records,
            protocol,
            pins,
            backend,
            args.heldout,
            receipts,
        )
        record = evaluated_once(
            Store(args.store) if args.store else None,
            key,
            lambda: play_checkpoint(
                args.checkpoint,
                pins,
                protocol,
                tasks,
                backend,
                console,
                f"held-out episodes on {prereg.evaluation.backend}",
                receipts,
                files_beside(args.heldout),
                args.cores,
                workers.host_log_of(args),
            ),
            evaluated_for=f"{run_dir.parent.name}/{run_dir.name}/{name}",
        )
    except (ConfigError, GuardError, ModelPinError, ArmError) as e:
        print(f"error: {e}", file=sys.stderr)
        console.say(f"error: {e}")
        return 2
    backend_name = prereg.evaluation.backend
    prices = prereg.prices
    record = {
        "checkpoint": name,
        "backend": backend_name,
        "protocol": asdict(protocol),
        **record,
        "cost_usd": record["wall_s"] / 3600 * prices.host(backend_name)
        + record["inference_s"] / 3600 * prices.inference_usd_per_hour,
    }
    atomic_write_json(args.out, record)
    rate = "not scored" if not record["scored"] else f"{record['success_rate']:.3f}"
    summary = (
        f"held-out success {rate} over {record['episodes']} valid episodes, "
        f"{record['invalid']} invalid, {record['wall_s']:.1f} s"
    )
    if record["reused"]:
        summary += f", reused: played for {record['evaluated_for']}"
    print(f"eval {name}: {summary}", file=sys.stderr)
    console.say(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
