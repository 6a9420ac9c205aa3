"""How often the warm start's first turn is a tool call TRL can parse, per SFT setting.

An episode whose first call the model writes as malformed JSON ends with 0 turns (TRL's parser
reads the turn as plain text). This plays the training tasks' oracles once on an arm (as the SFT
job does: every screenshot the environment's), then for each SFT setting trains the warm start
from the pinned model and samples the first turn of every task, training and held-out, at the
GRPO temperature:

    python bench/warm_start_calls.py --model results/<exp>/model \
        --train results/<exp>/tasks/train.jsonl --heldout results/<exp>/tasks/heldout.jsonl \
        --solutions results/<exp>/tasks/solutions.jsonl --tools computer_13 \
        --arm '{"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "gvisor",
                "world": "xdesktop"}' \
        --settings '{"steps": 100, "batch_size": 4, "learning_rate": 0.003}' \
                   '{"steps": 200, "batch_size": 4, "learning_rate": 0.003}' --samples 16

One line per setting and task: the share of sampled first turns that hold a parsed tool call.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from envab.envs.arms import files_beside, open_arm
from envab.io import read_jsonl
from envab.progress import Console
from envab.trainer import agent
from envab.trainer.compute import Compute
from envab.trainer.generation import Generation
from envab.trainer.guards import HeldoutGuard
from envab.trainer.sft import demonstrations


def first_screens(tasks: list[dict], backend) -> dict:
    """Task id -> the environment's first screenshot (one create each)."""
    screens = {}
    for task in tasks:
        with backend.create(task) as session:
            if not session.observation.valid:
                raise SystemExit(f"{task['id']}: the environment failed at create")
            screens[task["id"]] = session.observation.screenshot
    return screens


def first_turn_calls(model_dir: Path, tasks, screens, tools, generation, samples: int) -> dict:
    """Task id -> how many of `samples` sampled first turns hold a parsed tool call."""
    from envab.eval.policy import Policy

    policy = Policy(model_dir, tools, generation)
    return {
        t["id"]: sum(
            bool(policy.act(agent.task_prompt(t, screens[t["id"]]), seed).get("tool_calls"))
            for seed in range(samples)
        )
        for t in tasks
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="the pinned model folder")
    p.add_argument("--train", type=Path, required=True)
    p.add_argument("--heldout", type=Path, required=True)
    p.add_argument("--solutions", type=Path, required=True)
    p.add_argument("--tools", default="computer_13")
    p.add_argument("--arm", required=True, help="the arm the demonstrations are played on (JSON)")
    p.add_argument("--settings", nargs="+", required=True, help="training.sft settings (JSON)")
    p.add_argument("--samples", type=int, default=16, help="first turns sampled per task")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    train, heldout = list(read_jsonl(args.train)), list(read_jsonl(args.heldout))
    solutions = {s["id"]: s for s in read_jsonl(args.solutions)}
    tools = agent.tool_set(args.tools)
    started = time.monotonic()
    with open_arm(json.loads(args.arm), files=files_beside(args.train)) as backend:
        guard = HeldoutGuard(frozenset(t["id"] for t in heldout))
        demos = demonstrations(train, solutions, guard, tools, backend)
        screens = first_screens(train + heldout, backend)
    print(f"demonstrations and first screens: {time.monotonic() - started:.1f} s", flush=True)

    from transformers import set_seed

    from envab.trainer.model import load
    from envab.trainer.warm_start import fit

    generation = Generation(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    print("setting\tsplit\ttask\tcalls\tsft_s\tloss")
    for raw in args.settings:
        settings = {"enabled": True, **json.loads(raw)}
        with tempfile.TemporaryDirectory(prefix="warm-start-") as scratch:
            set_seed(args.seed)
            model, processor = load(args.model)
            t0 = time.monotonic()
            loss = fit(model, processor, demos, tools, settings, Compute(), args,
                       Console("sft", None), Path(scratch), Path(scratch) / "model")  # fmt: skip
            sft_s = time.monotonic() - t0
            for split, tasks in (("train", train), ("heldout", heldout)):
                calls = first_turn_calls(Path(scratch) / "model", tasks, screens, tools,
                                         generation, args.samples)  # fmt: skip
                for task_id, n in calls.items():
                    print(f"{raw}\t{split}\t{task_id}\t{n}/{args.samples}\t{sft_s:.1f}\t{loss:.4f}",
                          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
