"""Cross-arm trace replay: the actions a run logged, played again through every arm's backend,
and what each arm answers compared (screens, verdicts and gates, rewards).

    python -m envab.eval.replay --target T --receipts R... --train train.jsonl \
        --trajectories results/<exp>/drums/seed1/trajectories.jsonl \
        --arm qemu '{"backend": "qemu", ...}' --arm drums '{"backend": "drums", ...}' \
        --sample 32 --seed 0 --out replay.json [--judged-later]

The workflow runs it as a job per A/B run where the pre-registration registers `replay` (rules/
eval.smk: results/<exp>/<arm>/seed<k>/replay.json); the outcome reads each run's verdict
(analysis/trace_replay.py).

Where training is bit-deterministic, exact divergence shows that only the infrastructure changed.
Where it is not (GPUs, vLLM), the arms' runs take their own paths and their curves can only be
compared statistically; what stands in for the exact check is this: the same task played with the
same actions must end in the same verdict and score, with the same screens after every action, on
every arm. A sample of the run's attempts (drawn from `--seed`, every verdict eligible) is
replayed on a fresh environment of each arm (`backend.create`, no fork group, no prefix), and
per attempt the replay is compared with what the run recorded (its verdict and score) and with
the other arms' replays (verdicts, failed gates, scores, the digest of each screen's pixels).

An environment that answers the same actions differently on one arm (a reward the checker
computes from a screen that did not settle, a gate that trips on one sandbox only) is a
difference in what the arms trained on, which no speed result outranks.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Mapping, Sequence
from contextlib import ExitStack

from envab import preregistration
from envab.envs.arms import open_arm
from envab.errors import Refusal
from envab.hashing import sha256_json
from envab.io import atomic_write_json, read_jsonl
from envab.trainer.agent import screenshot_sha256
from envab.trainer.guards import check_receipts, held_out


def replay(backend, task: Mapping, actions: Sequence[Mapping]) -> dict:
    """Play `actions` on a fresh environment of `task`: its verdict, failed gates and score, the
    actions the environment refused, and each screen's pixel digest (the first, then one after
    each action it took)."""
    session = backend.create(dict(task))
    screens: list[str] = []
    refused = 0
    try:
        observation = session.observation
        if observation.valid:
            screens.append(screenshot_sha256(observation.screenshot))
        for action in actions:
            if not observation.valid or observation.done:
                break
            try:
                observation = session.step(dict(action))
            except ValueError:  # refused (off screen): nothing changed, as in training
                refused += 1
                continue
            if observation.valid:
                screens.append(screenshot_sha256(observation.screenshot))
        verification = session.verify()
    finally:
        session.close()
    return {
        "verdict": verification.verdict,
        "failed_gates": sorted(verification.failed_gates),
        "score": verification.score if verification.verdict == "valid" else None,
        "refused": refused,
        "screens_sha256": sha256_json(screens),
    }


def sample(attempts: list[dict], size: int, seed: int) -> list[dict]:
    """`size` of the attempts that logged their actions, drawn from `seed` (all, if fewer)."""
    logged = [a for a in attempts if "sent" in a]  # older runs did not log their actions
    if len(logged) <= size:
        return logged
    return random.Random(seed).sample(logged, size)


def compare(recorded: Mapping, replays: Mapping[str, dict]) -> dict:
    """One attempt: each arm's replay against the run's record (verdict, score), and the arms'
    replays against one another (verdict, failed gates, score, screens)."""
    record_score = recorded.get("score") if recorded.get("verdict") == "valid" else None
    against_record = {
        arm: r["verdict"] == recorded.get("verdict") and r["score"] == record_score
        for arm, r in replays.items()
    }
    keys = ("verdict", "failed_gates", "score", "screens_sha256")
    answers = {json.dumps([r[k] for k in keys]) for r in replays.values()}
    return {
        "task_id": recorded["task_id"],
        "recorded": {"verdict": recorded.get("verdict"), "score": record_score},
        "replays": dict(replays),
        "as_recorded": against_record,
        "arms_agree": len(answers) == 1,
    }


def summary(compared: list[dict], arms: Sequence[str]) -> dict:
    """The counts, and the verdict: `same` where every replay matches the record and every arm
    answered every attempt alike; `differ` otherwise, with the attempts that did not."""
    n = len(compared)
    per_arm = {
        arm: {
            "as_recorded": sum(c["as_recorded"][arm] for c in compared),
            "valid": sum(c["replays"][arm]["verdict"] == "valid" for c in compared),
        }
        for arm in arms
    }
    agree = sum(c["arms_agree"] for c in compared)
    differing = [c for c in compared if not c["arms_agree"] or not all(c["as_recorded"].values())]
    if n == 0:
        verdict = "not replayed: no attempt logged its actions"
    else:
        verdict = "same" if not differing else "differ"
    return {
        "attempts": n,
        "arms": list(arms),
        "per_arm": per_arm,
        "arms_agree": agree,
        "verdict": verdict,
        "differing": differing,
    }


def one_at_a_time(config: str) -> dict:
    """An arm's config (JSON) as the replay opens it: the replay plays one attempt at a time, so
    a QEMU pool boots one VM rather than the pool a GRPO step fills (8 VMs under TCG take
    about 45 s to start, the 8 replays on one VM 5 s). The pool's size changes no answer."""
    arm = json.loads(config)
    return {**arm, "vms": 1} if arm.get("backend") == "qemu" else arm


def run(args) -> dict:
    _, receipts = preregistration.frozen_inputs(args)
    check_receipts(receipts, unread=held_out)  # the training split, never the held-out one
    tasks = {t["id"]: t for t in read_jsonl(args.train)}
    attempts = list(read_jsonl(args.trajectories))
    chosen = sample(attempts, args.sample, args.seed)
    unknown = sorted({a["task_id"] for a in chosen} - set(tasks))
    if unknown:
        raise Refusal(f"{args.trajectories}: task(s) {unknown[:3]} are not in {args.train}")
    arms = [name for name, _ in args.arm]
    compared = []
    with ExitStack() as stack:
        backends = {
            name: stack.enter_context(open_arm(one_at_a_time(config), log_path=args.log))
            for name, config in args.arm
        }
        for attempt in chosen:
            task = tasks[attempt["task_id"]]
            replays = {name: replay(b, task, attempt["sent"]) for name, b in backends.items()}
            compared.append(compare(attempt, replays))
    return {
        "trajectories": args.trajectories,
        "sample": args.sample,
        "seed": args.seed,
        **summary(compared, arms),
        "compared": compared,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.eval.replay", description=__doc__.split("\n")[0]
    )
    preregistration.add_frozen_arguments(parser)
    parser.add_argument("--train", required=True, help="the training split (train.jsonl)")
    parser.add_argument("--trajectories", required=True, help="a run's trajectories.jsonl")
    parser.add_argument(
        "--arm",
        nargs=2,
        action="append",
        required=True,
        metavar=("NAME", "CONFIG"),
        help="an arm to replay on: its name and its config as JSON (repeat for each arm)",
    )
    parser.add_argument("--sample", type=int, default=32, help="attempts replayed (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="draws the sample")
    parser.add_argument("--out", required=True, help="writes: the comparison")
    parser.add_argument("--log", help="the hosts' output")
    parser.add_argument(
        "--judged-later",
        action="store_true",
        help='exit 0 once the comparison is written, "differ" included: the outcome judges it '
        '(the workflow\'s replay job); without it "differ" exits 1',
    )
    args = parser.parse_args(argv)
    try:
        result = run(args)
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    atomic_write_json(args.out, result)
    print(
        f"replay: {result['attempts']} attempts on {', '.join(result['arms'])}: "
        f"{result['arms_agree']} answered alike on every arm; {result['verdict']}",
        file=sys.stderr,
    )
    return 0 if args.judged_later or result["verdict"] != "differ" else 1


if __name__ == "__main__":
    sys.exit(main())
