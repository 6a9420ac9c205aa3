"""SFT warm start: TRL's SFTTrainer on oracle demonstrations of TRAINING tasks only.

    python -m envab.trainer.sft --target preregistration/target.yaml \
        --receipts receipts/<exp>/*.json \
        --model results/<exp>/model --tasks results/<exp>/tasks/train.jsonl \
        --solutions results/<exp>/tasks/solutions.jsonl --tools click \
        --settings '{"enabled": true, "steps": 200, "batch_size": 16, "learning_rate": 0.003}' \
        --arm '{"backend": "drums", "url": "embedded", "mode": "fork"}' \
        --out results/<exp>/sft/model --receipt receipts/<exp>/sft.json

Run once and shared by every arm and seed. Each demonstration is one training task played by its
oracle actions on the pre-registered evaluation arm's environment (`--arm`), so every screenshot
in it is an environment's, as in GRPO and the evaluation; it is written in exactly their
conversation format (trainer/agent.py): the task prompt with the environment's first
screenshot, then per action the assistant's tool call and the tool message with the new
screenshot, then a final `done` call. A demonstration whose environment fails a gate, or whose
oracle does not score 1, stops the job: a warm start never learns from a broken episode.
The loss is on the assistant turns only. The output folder is hashed into
receipts/<exp>/sft.json, which depends on the freeze receipts; the trainer loads the warm start
only through that receipt.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from envab import preregistration
from envab.envs.arms import files_beside, host_log_beside, open_arm
from envab.envs.protocol import Backend
from envab.envs.tasks.build import cue_shuffled
from envab.errors import Refusal, refused
from envab.hashing import aggregate_digest, file_manifest
from envab.io import read_jsonl
from envab.progress import Console, job_console
from envab.receipts import subject, write_receipt
from envab.trainer import agent
from envab.trainer.compute import check_cuda, compute_settings
from envab.trainer.guards import (
    GuardError,
    HeldoutGuard,
    check_code,
    check_receipts,
    check_split_file,
    held_out,
    heldout_ids,
)
from envab.trainer.model import load_checked

log = logging.getLogger(__name__)


def demonstration(
    task: dict, oracle: list[dict], tools: agent.ToolSet, backend: Backend
) -> list[dict]:
    """One task solved by its oracle on `backend`, as the conversation the policy would have
    had: every screenshot the environment's."""
    with backend.create(task) as session:
        obs = session.observation
        if not obs.valid:
            raise GuardError(f"demonstration {task['id']}: the environment failed {obs.verdict}")
        messages = agent.task_prompt(task, obs.screenshot)
        for action in oracle:
            name, arguments = agent.call_for(action, tools)
            obs = session.step(tools.action_for(name, arguments))
            if not obs.valid:
                raise GuardError(
                    f"demonstration {task['id']}: the environment failed {obs.verdict}"
                )
            messages.append(agent.assistant_call(name, arguments))
            messages.append(agent.tool_message(name, obs.screenshot))
        verification = session.verify()
    if verification.score != 1.0:
        raise GuardError(
            f"demonstration {task['id']}: the oracle did not solve it ({verification.verdict}, "
            f"score {verification.score})"
        )
    messages.append(agent.assistant_call("done", {}))
    return messages


def demonstrations(
    tasks: list[dict],
    solutions: dict[str, dict],
    guard: HeldoutGuard,
    tools: agent.ToolSet,
    backend: Backend,
    cue: str = "shown",
) -> dict:
    """Task id -> its demonstration, for training tasks only. `cue: shuffled` plays each task with
    its screen's cue drawn at random (envs/tasks/build.py cue_shuffled): the warm start then
    learns the tool call and the label's row, and leaves reading the screen to GRPO."""
    guard.check_dataset(t["id"] for t in tasks)
    missing = sorted(t["id"] for t in tasks if t["id"] not in solutions)
    if missing:
        raise GuardError(f"no oracle solution for training task(s) {missing[:5]}")
    if cue == "shuffled":
        try:
            tasks = [cue_shuffled(t) for t in tasks]
        except ValueError as e:
            raise GuardError(f"training.sft.cue: shuffled: {e}") from None
    return {t["id"]: demonstration(t, solutions[t["id"]]["oracle"], tools, backend) for t in tasks}


def train(args, console: Console) -> dict:
    _, receipts = preregistration.frozen_inputs(args)
    check_receipts(receipts, unread=held_out)  # never opens the held-out split
    check_code(receipts)
    settings = json.loads(args.settings)
    compute = compute_settings(json.loads(args.training))
    if compute.device == "cuda":
        check_cuda()
    tools = agent.tool_set(args.tools)
    if not settings.get("enabled"):
        raise GuardError("training.sft.enabled is false: the pinned model is used as it is")
    guard = HeldoutGuard(heldout_ids(receipts))
    check_split_file(args.tasks, receipts, "train")
    tasks = list(read_jsonl(args.tasks))
    solutions = {s["id"]: s for s in read_jsonl(args.solutions)}
    with open_arm(
        json.loads(args.arm), files=files_beside(args.tasks), log_path=host_log_beside(args.log)
    ) as backend:
        demos = demonstrations(
            tasks, solutions, guard, tools, backend, settings.get("cue", "shown")
        )
    # torch, transformers and TRL load only now: a job that refuses its inputs answers at once.
    from transformers import set_seed

    from envab.trainer.warm_start import fit

    set_seed(args.seed)  # before the load, as the warm start's bytes have always been made
    model, processor = load_checked(args.model, receipts, compute)

    out = Path(args.out)
    if out.exists():
        raise GuardError(f"{out} exists; remove it to run the warm start again")
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model_dir = scratch / "model"
        loss = fit(
            model, processor, demos, tools, settings, compute, args, console, scratch, model_dir
        )
        os.replace(model_dir, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    files = file_manifest(out)
    write_receipt(
        args.receipt,
        "sft",
        subjects=[subject(out / path, digest) for path, digest in files.items()],
        predicate={
            "directory": out.as_posix(),
            "files": files,
            "sha256": aggregate_digest(files),
            "settings": settings,
            "tools": args.tools,
            "seed": args.seed,
            "base_model": Path(args.model).as_posix(),
            "demonstrations": len(demos),
            "task_ids": sorted(demos),
            "final_train_loss": loss,
        },
        depends_on=receipts.paths,
    )
    return {"demonstrations": len(demos), "steps": settings["steps"], "loss": loss}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.trainer.sft", description=__doc__.split("\n")[0]
    )
    preregistration.add_frozen_arguments(parser)
    parser.add_argument("--model", required=True, help="the pinned model folder")
    parser.add_argument("--tasks", required=True, help="the training split (train.jsonl)")
    parser.add_argument("--solutions", required=True, help="solutions.jsonl with oracle actions")
    parser.add_argument("--settings", required=True, help="training.sft from the config, as JSON")
    parser.add_argument(
        "--tools",
        default=agent.DEFAULT_TOOL_SET,
        choices=sorted(agent.TOOL_SETS),
        help="config training.tools",
    )
    parser.add_argument(
        "--arm",
        required=True,
        help="the evaluation arm's config, as JSON: the demonstrations' environment",
    )
    parser.add_argument("--out", required=True, help="the warm-started model folder")
    parser.add_argument("--receipt", required=True, help="writes: receipts/<exp>/sft.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--training",
        required=True,
        help="the config's training section, as JSON: its compute and vision settings",
    )
    parser.add_argument("--log", help="the job's log; the console then gets its progress")
    args = parser.parse_args(argv)
    console = job_console("sft", args.log, "the warm start on oracle demonstrations")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        summary = train(args, console)
    except Refusal as e:
        return refused(e, console)
    line = (
        f"{summary['demonstrations']} demonstrations, {summary['steps']} steps, "
        f"mean training loss {summary['loss']:.4f}"
    )
    print(f"sft: {line}")
    console.say(f"done: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
