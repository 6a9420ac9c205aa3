"""Held-out evaluation of one checkpoint: a separate, measured workload.

    python -m eval.heldout --target preregistration/target.yaml --receipts receipts/<exp> \
        --checkpoint results/<exp>/<arm>/seed<k>/checkpoints/<name> \
        --heldout results/<exp>/tasks/heldout.jsonl --backend '{"url": "embedded", "mode": ...}' \
        --out results/<exp>/<arm>/seed<k>/eval/<name>.json

Per the frozen protocol: every held-out task, `episodes_per_task` episodes for each evaluation
seed, at most `max_steps` actions each, on the pre-registered evaluation backend (the same arm's
environment for every arm under test). The prompt, tools and action mapping are the trainer's
(trainer/agent.py), so the policy is asked exactly what it was trained on. Decoding is greedy
unless the protocol sets a temperature; then each turn's sampler is seeded by (task, evaluation
seed, episode, turn), so episodes draw independently and a rerun draws the same. A turn may be as
long as a training turn (the run's pinned `max_completion_length`).

An invalid episode (any gate failed) is retried up to `max_invalid_retries` times and counted;
a checkpoint left short of valid episodes on any task is marked `scored: false` and gets no rate
(never a 0). Wall-clock and cost (evaluation host price + inference price) are recorded apart
from training.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from envab.hashing import sha256_bytes
from envab.io import atomic_write_json, read_jsonl


@dataclass(frozen=True)
class Protocol:
    episodes_per_task: int
    seeds: tuple[int, ...]
    max_steps: int
    max_invalid_retries: int
    temperature: float
    max_new_tokens: int

    @classmethod
    def from_target(cls, raw: dict, max_new_tokens: int) -> Protocol:
        e = raw["evaluation"]
        return cls(
            episodes_per_task=e["episodes_per_task"],
            seeds=tuple(e["seeds"]),
            max_steps=e["max_steps"],
            max_invalid_retries=e.get("max_invalid_retries", 3),
            temperature=float(e.get("temperature", 0.0)),
            max_new_tokens=max_new_tokens,
        )


class Policy:
    """The checkpoint, asked for one tool call at a time in the trainer's prompt format."""

    def __init__(self, checkpoint: str | Path, temperature: float, max_new_tokens: int):
        import torch
        from trl.chat_template_utils import add_response_schema

        from trainer.model import load

        self.torch = torch
        self.model, self.processor = load(checkpoint)
        self.model.eval()
        self.tokenizer = add_response_schema(self.processor.tokenizer)
        from trainer.agent import turn_generation_kwargs

        self.turn = turn_generation_kwargs(self.tokenizer)  # one tool call per turn, as trained
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.generation_s = 0.0

    def act(self, messages: list[dict], seed: int) -> dict:
        """The assistant message (parsed, tool calls included) for the conversation so far."""
        from trl.chat_template_utils import parse_response

        from trainer.agent import TOOLS

        inputs = self.processor.apply_chat_template(
            messages,
            tools=TOOLS,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        sampling = self.temperature > 0
        if sampling:
            self.torch.manual_seed(seed)
        started = time.perf_counter()
        with self.torch.no_grad():
            output = self.model.generate(
                **inputs,
                max_new_tokens=self.max_new_tokens,
                do_sample=sampling,
                temperature=self.temperature if sampling else None,
                # Sampling as GRPO samples (TRL: top_k 0, top_p 1.0), not with transformers'
                # default top_k of 50, which would evaluate a sharper policy than was trained.
                top_k=0 if sampling else None,
                top_p=1.0 if sampling else None,
                **self.turn,
            )
        self.generation_s += time.perf_counter() - started
        prompt = inputs["input_ids"][0].tolist()
        completion = output[0][len(prompt) :].tolist()
        return parse_response(self.tokenizer, completion, prefix=prompt, tools=TOOLS)


def sampler_seed(task_id: str, seed: int, turn: int) -> int:
    """One seed per (task, episode seed, turn). A seed shared by every task would give all of
    them the same random draws, so episodes of similar tasks would succeed or fail together."""
    return int(sha256_bytes(f"{task_id}/{seed}/{turn}".encode())[:15], 16)


def play(policy: Policy, backend, task: dict, protocol: Protocol, seed: int) -> dict:
    """One episode: its verdict and, if valid, its score."""
    from trainer.agent import action_for, task_prompt, tool_message

    session = backend.create(task)
    try:
        observation = session.observation
        turns = 0
        if observation.valid:
            messages = task_prompt(task, observation.screenshot)
            while turns < protocol.max_steps and observation.valid and not observation.done:
                reply = policy.act(messages, sampler_seed(task["id"], seed, turns))
                calls = reply.get("tool_calls") or []
                if not calls:
                    break  # the policy answered in prose: the episode ends, the checker decides
                messages.append(reply)
                # Every call of the reply, in order, each one action of max_steps: what TRL
                # does in training (it runs all tool calls of a turn; trainer/environment.py
                # counts each against max_turns).
                for call in (c["function"] for c in calls):
                    if turns >= protocol.max_steps or observation.done:
                        break  # the episode is over; nothing more is asked of the policy
                    turns += 1
                    # A call the tools refuse (a wrong argument, a click off the screen) is the
                    # policy's mistake: nothing happens and it is told so, as in training, never
                    # an invalid episode and never a crash.
                    try:
                        action = action_for(call["name"], call.get("arguments") or {})
                        observation = session.step(action)
                    except ValueError as e:  # ActionRejected is a ValueError on every backend
                        messages.append(tool_message(call["name"], note=f"Refused: {e}"))
                        continue
                    messages.append(tool_message(call["name"], observation.screenshot))
                    if not observation.valid:
                        break
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
    }


def evaluate(policy: Policy, backend, tasks: list[dict], protocol: Protocol, log=None) -> dict:
    outcomes: dict[str, list[int]] = {}
    invalid = retries = 0
    episodes = []
    for task in tasks:
        results = outcomes.setdefault(task["id"], [])
        for seed in protocol.seeds:
            for episode in range(protocol.episodes_per_task):
                for attempt in range(protocol.max_invalid_retries + 1):
                    record = play(policy, backend, task, protocol, seed * 1000 + episode)
                    record["attempt"] = attempt
                    episodes.append(record)
                    if log:
                        log(record)
                    if record["verdict"] == "valid":
                        results.append(int(record["score"] == 1.0))
                        break
                    invalid += 1
                    retries += attempt < protocol.max_invalid_retries
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


def track(record: dict, checkpoint: Path, target, target_path: str) -> None:
    """One wandb run per evaluation: the held-out point at this checkpoint's valid count."""
    from envab.hashing import sha256_file
    from envab.tracking import start_run

    run_dir = checkpoint.parent.parent
    pins = json.loads((run_dir / "pins.json").read_text())
    counts = {
        r["checkpoint"]: r["valid_trajectories"] for r in read_jsonl(run_dir / "checkpoints.jsonl")
    }
    run = start_run(
        "eval",
        target.experiment_id,
        pins["arm"],
        pins["seed"],
        sha256_file(target_path),
        {"protocol": record["protocol"], "backend": record["backend"]},
        results=run_dir.parent.parent,
        checkpoint=record["checkpoint"],
    )
    point = {"valid_trajectories": counts.get(record["checkpoint"])}
    if record["scored"]:
        point["heldout/success_rate"] = record["success_rate"]
    run.log({**point, "heldout/invalid": record["invalid"], "heldout/wall_s": record["wall_s"]})
    run.finish()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval.heldout", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--target", required=True)
    parser.add_argument("--receipts", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--backend", required=True, help="JSON: the evaluation arm's config")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from envab import preregistration
    from envab.config import ConfigError
    from envs.drums import connect
    from trainer import agent
    from trainer.guards import GuardError, check_receipts, heldout_ids

    try:
        target = preregistration.check_frozen(args.target)
        check_receipts(args.receipts)
    except (ConfigError, GuardError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tasks = list(read_jsonl(args.heldout))
    if {t["id"] for t in tasks} != heldout_ids(args.receipts):
        print(f"error: {args.heldout} is not the frozen held-out set", file=sys.stderr)
        return 2
    # A turn may be as long at evaluation as in training: the run's pinned completion length.
    pins = json.loads((Path(args.checkpoint).parent.parent / "pins.json").read_text())
    protocol = Protocol.from_target(target.raw, pins["training"]["grpo"]["max_completion_length"])
    agent.use_tool_set(pins["training"]["tools"])  # the tools the policy was trained with
    backend_config = json.loads(args.backend)
    backend_name = target.evaluation_backend
    prices = target.raw["prices"]
    started = time.perf_counter()
    policy = Policy(args.checkpoint, protocol.temperature, protocol.max_new_tokens)
    with connect(backend_config["url"], mode=backend_config.get("mode")) as backend:
        result = evaluate(policy, backend, tasks, protocol, log=lambda r: print(json.dumps(r)))
    wall = time.perf_counter() - started
    host_price = prices["host_usd_per_hour"][backend_name]
    record = {
        "checkpoint": Path(args.checkpoint).name,
        "backend": backend_name,
        "protocol": protocol.__dict__,
        **result,
        "wall_s": wall,
        "inference_s": policy.generation_s,
        "cost_usd": wall / 3600 * host_price
        + policy.generation_s / 3600 * prices["inference_usd_per_hour"],
    }
    atomic_write_json(args.out, record)
    track(record, Path(args.checkpoint), target, args.target)
    rate = "not scored" if not record["scored"] else f"{record['success_rate']:.3f}"
    print(
        f"eval {record['checkpoint']}: held-out success {rate} over {record['episodes']} "
        f"valid episodes, {record['invalid']} invalid, {wall:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
