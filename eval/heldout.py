"""Held-out evaluation of one checkpoint: a separate, measured workload.

    python -m envab.eval.heldout --target preregistration/target.yaml \
        --receipts receipts/<exp>/*.json \
        --pins results/<exp>/<arm>/seed<k>/pins.json \
        --checkpoint-records results/<exp>/<arm>/seed<k>/checkpoints.jsonl \
        --checkpoint results/<exp>/<arm>/seed<k>/checkpoints/<name> \
        --heldout results/<exp>/tasks/heldout.jsonl --backend '{"backend": "drums", ...}' \
        --out results/<exp>/<arm>/seed<k>/eval/<name>.json

Per the frozen protocol: every held-out task, `episodes_per_task` episodes for each evaluation
seed, at most `max_steps` actions each, on the pre-registered evaluation backend (the same arm's
environment for every arm under test; any arm, opened by `envab.envs.arms.open_arm`). The
prompt, the tools and the action mapping are the trainer's (trainer/agent.py), so the policy is
asked exactly what it was trained on. Decoding is greedy
unless the protocol sets a temperature; then each turn's sampler is seeded by (task, evaluation
seed, episode, turn), so episodes draw independently and a rerun draws the same. A turn may be as
long as a training turn (the run's pinned `max_completion_length`).

An invalid episode (any gate failed) is retried up to `max_invalid_retries` times and counted;
a checkpoint left short of valid episodes on any task is marked `scored: false` and gets no rate
(never a 0). Wall-clock and cost (evaluation host price + inference price) are recorded apart
from training.

An identical checkpoint (file for file) under the same protocol and backend is played once
(`--store`, eval/reuse.py): a later job takes the stored record, marked `reused`. The files are
checked against the run's record first, and torch is loaded only when episodes are played.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envab import machine_load, preregistration
from envab.envs.arms import ArmError, files_beside
from envab.envs.protocol import Gate, Verification
from envab.eval import workers
from envab.eval.reuse import Store, evaluated_once, evaluation_key
from envab.hashing import sha256_bytes, sha256_file, sha256_json
from envab.io import atomic_write_json, read_jsonl
from envab.preregistration import EvaluationProtocol, Preregistration
from envab.progress import Console, duration, eta, job_console
from envab.receipts import Receipts
from envab.schema import ConfigError
from envab.trainer import agent
from envab.trainer.compute import compute_settings
from envab.trainer.generation import Generation, UnsampleableToken
from envab.trainer.guards import GuardError, check_receipts, check_split_file, heldout_ids
from envab.trainer.manifest import ModelPinError, check_manifest
from envab.trainer.model import base_manifest

if TYPE_CHECKING:
    from envab.eval.policy import Policy


@dataclass(frozen=True)
class Protocol:
    """What an evaluation plays: the frozen protocol's episode settings, and how long a turn may
    be (the run's pinned `max_completion_length`: as long at evaluation as in training)."""

    episodes_per_task: int
    seeds: tuple[int, ...]
    max_steps: int
    max_invalid_retries: int
    temperature: float
    max_new_tokens: int
    turn_end: str = "bias"  # the run's pinned training.grpo.turn_end: a turn ends as in training

    @classmethod
    def frozen(cls, evaluation: EvaluationProtocol, training: dict) -> Protocol:
        """The pre-registered protocol, with a turn generated as the run's pinned `training`
        generated one (trainer/generation.py) at the protocol's temperature."""
        generation = Generation.pinned(training, evaluation.temperature)
        return cls(
            episodes_per_task=evaluation.episodes_per_task,
            seeds=evaluation.seeds,
            max_steps=evaluation.max_steps,
            max_invalid_retries=evaluation.max_invalid_retries,
            temperature=generation.temperature,
            max_new_tokens=generation.max_new_tokens,
            turn_end=generation.turn_end,
        )

    @property
    def generation(self) -> Generation:
        return Generation(self.temperature, self.max_new_tokens, self.turn_end)


def sampler_seed(task_id: str, seed: int, turn: int) -> int:
    """One seed per (task, episode seed, turn). A seed shared by every task would give all of
    them the same random draws, so episodes of similar tasks would succeed or fail together."""
    return int(sha256_bytes(f"{task_id}/{seed}/{turn}".encode())[:15], 16)


def play(policy: Policy, backend, task: dict, protocol: Protocol, seed: int) -> dict:
    """One episode: its verdict, if valid its score, a digest of the actions it sent (as
    training's `actions_sha256`: one task played with the same actions must get the same score,
    which is how two evaluations of one checkpoint are compared, analysis/controls.py) and one of
    the policy's replies (what it drew, a tool call or not)."""
    session = backend.create(task)
    sent: list[dict] = []
    replies: list[dict] = []
    try:
        observation = session.observation
        turns = 0
        rejected = False  # a turn held an unsampleable token: invalid (eval/policy.py)
        if observation.valid:
            messages = agent.task_prompt(task, observation.screenshot)
            while turns < protocol.max_steps and observation.valid and not observation.done:
                try:
                    reply = policy.act(messages, sampler_seed(task["id"], seed, turns))
                except UnsampleableToken:
                    rejected = True
                    break
                replies.append(reply)
                calls = reply.get("tool_calls") or []
                if not calls:
                    break  # the policy answered in prose: the episode ends, the checker decides
                messages.append(agent.plain_reply(reply))
                # Every call of the reply, in order, each one action of max_steps: what TRL
                # does in training (it runs all tool calls of a turn; trainer/environment.py
                # counts each against max_turns).
                for call in (c.get("function") or {} for c in calls):
                    if turns >= protocol.max_steps or observation.done:
                        break  # the episode is over; nothing more is asked of the policy
                    turns += 1
                    # A call the tools refuse (a wrong argument, a click off the screen) is the
                    # policy's mistake: nothing happens and it is told so, as in training, never
                    # an invalid episode and never a crash.
                    try:
                        action = policy.tools.action_for(call.get("name"), call.get("arguments"))
                        sent.append(dict(action))
                        observation = session.step(action)
                    except ValueError as e:  # ActionRejected is a ValueError on every backend
                        messages.append(
                            agent.tool_message(str(call.get("name")), note=f"Refused: {e}")
                        )
                        continue
                    messages.append(agent.tool_message(call["name"], observation.screenshot))
                    if not observation.valid:
                        break
        if rejected:
            verification = Verification.invalid([Gate.COMPLETION_TOKENS])
        else:
            verification = session.verify()
    finally:
        session.close()
    return {
        "task_id": task["id"],
        "seed": seed,
        "verdict": verification.verdict,
        "failed_gates": list(verification.failed_gates),
        "score": verification.score,
        "turns": turns,
        "actions_sha256": sha256_json(sent),
        "replies_sha256": sha256_json(replies),
    }


def evaluate(policy: Policy, backend, tasks: list[dict], protocol: Protocol, log=None) -> dict:
    """Every episode of `protocol` on every task, one after another, and what they add up to."""
    return summary(play_tasks(policy, backend, tasks, protocol, log), protocol)


def play_tasks(policy: Policy, backend, tasks: list[dict], protocol: Protocol, log=None) -> list:
    """The episode records of `tasks` in order: for each task, evaluation seed and episode, the
    attempts until one is valid or `max_invalid_retries` retries are spent."""
    episodes = []
    for task in tasks:
        for seed in protocol.seeds:
            for episode in range(protocol.episodes_per_task):
                for attempt in range(protocol.max_invalid_retries + 1):
                    record = play(policy, backend, task, protocol, seed * 1000 + episode)
                    record["attempt"] = attempt
                    episodes.append(record)
                    if log:
                        log(record)
                    if record["verdict"] == "valid":
                        break
    return episodes


def summary(episodes: list[dict], protocol: Protocol) -> dict:
    """The success rate of the valid episodes, or none where a task is short of them."""
    outcomes: dict[str, list[int]] = {}
    invalid = retries = 0
    for record in episodes:
        results = outcomes.setdefault(record["task_id"], [])
        if record["verdict"] == "valid":
            results.append(int(record["score"] == 1.0))
        else:
            invalid += 1
            retries += record["attempt"] < protocol.max_invalid_retries
    wanted = protocol.episodes_per_task * len(protocol.seeds)
    short = sorted(t for t, r in outcomes.items() if len(r) < wanted)
    successes = sum(sum(r) for r in outcomes.values())
    n = sum(len(r) for r in outcomes.values())
    scored = not short and n > 0
    return {
        "scored": scored,
        "success_rate": successes / n if scored else None,
        "successes": successes,
        "episodes": n,
        "invalid": invalid,
        "retries": retries,
        "short_of_valid_episodes": short,
        "tasks": outcomes,
        "episode_records": episodes,
    }


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


def check_inputs(args) -> tuple[Preregistration, list[dict], dict, Receipts]:
    """The frozen pre-registration, the frozen held-out tasks, the run's pins and the receipts."""
    prereg, receipts = preregistration.frozen_inputs(args)
    check_receipts(receipts)
    check_split_file(args.heldout, receipts, "heldout")
    tasks = list(read_jsonl(args.heldout))
    if {t["id"] for t in tasks} != heldout_ids(receipts):
        raise GuardError(f"{args.heldout} is not the frozen held-out set")
    return prereg, tasks, json.loads(Path(args.pins).read_text()), receipts


def recorded_files(checkpoint: str, records: str) -> dict[str, str]:
    """The files training recorded for this checkpoint: the model evaluated must be exactly
    those (checked_key checks them before anything is reused or loaded)."""
    name = Path(checkpoint).name
    saved = {r["checkpoint"]: r["files"] for r in read_jsonl(records)}
    if name not in saved:
        raise GuardError(f"{name} is not a checkpoint recorded in {records}")
    return saved[name]


def checked_key(
    checkpoint, records: str, protocol: Protocol, pins: dict, backend: dict, heldout, receipts
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
        files, asdict(protocol), pins["training"]["tools"], backend, sha256_file(heldout)
    )


def play_checkpoint(
    checkpoint,
    pins: dict,
    protocol: Protocol,
    tasks: list[dict],
    backend: dict,
    console,
    what,
    receipts: Receipts,
    files: Path | None = None,
    cores: int = 1,
) -> dict:
    """Load the checkpoint and play every episode of `protocol` on the evaluation arm (`backend`,
    its config; the console hears "<n> <what>" first), on the job's `cores` (eval/workers.py):
    the result with its wall-clock, the machine's load meanwhile and the generation time."""
    started, snapshot = time.perf_counter(), machine_load.Snapshot.now()
    # Its files were checked against the run's record just before (checked_key); a LoRA
    # checkpoint's base is checked again as it loads.
    compute = compute_settings(pins["training"])  # the device and dtype the run trained on
    player = workers.Player(
        checkpoint=str(checkpoint),
        tools=pins["training"]["tools"],  # the tools the policy was trained with
        compute=compute,
        base_expected=base_manifest(checkpoint, receipts),
        protocol=protocol,
        backend=backend,
        files=files,  # the tasks' frozen downloads
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
    args = parser.parse_args(argv)
    run_dir = Path(args.pins).parent  # results/<exp>/<arm>/seed<k>
    name = Path(args.checkpoint).name
    console = job_console(f"eval {run_dir.parent.name} {run_dir.name} {name}", args.log)
    try:
        prereg, tasks, pins, receipts = check_inputs(args)
        protocol = Protocol.frozen(prereg.evaluation, pins["training"])
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
