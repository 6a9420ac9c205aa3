"""Stop at target: judge a training run's checkpoints while it pauses, so it stops once its fate
is decided (the pre-registration's budget.stop_at_target).

    python -m envab.analysis.stop_at_target --target T --receipts R... --pins P \
        --checkpoint-records C --checkpoints DIR [--heldout heldout.jsonl] \
        --backend '{"backend": "drums", ...}' --confirm-backend '{...}' --store S \
        --judged DIR --out verdict.json [--cores N]

The training job runs this, in a process of its own, after each checkpoint it saves, its clock
paused (trainer/grpo.py). Every checkpoint not yet judged is evaluated on the held-out tasks as
the eval rule evaluates it (eval/heldout.py, the same protocol, backend and evaluation store);
then the pre-registered crossing rule reads the evaluations so far and, where a confirmation is
registered, the confirmatory evaluation judges the accepted crossing (analysis/confirm.py). The
run's fate is then decided: a confirmed crossing is reached, and an unconfirmed one means never
reached, since time-to-target counts only the first accepted crossing and only if it is
confirmed (analysis/time_to_target.py), so nothing the run does later can change its answer.

The verdict file says "stop" (with the reason: target_confirmed, crossing_not_confirmed, or
target_reached where no confirmation is registered) or "go on". It is all the trainer reads: one
word and the checkpoint it was judged at, never a held-out task or a score.

Every evaluation goes to the store, so the workflow's own eval and confirm jobs, which run after
training as before, find each one played and take its record (eval/reuse.py): the records the
answer is built from are the ones that decided the stop.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from envab import preregistration
from envab.analysis import confirm
from envab.analysis.time_to_target import time_to_target
from envab.errors import Refusal
from envab.eval import heldout, workers
from envab.io import atomic_write_json, read_jsonl
from envab.receipts import read_receipt

GO_ON = "go on"
STOP = "stop"


def decide(confirmation: dict | None, crossing: dict, registered: bool) -> tuple[str, str | None]:
    """The decision and its reason from the crossing over the evaluations so far and, where a
    confirmation is registered, its record (None: none has run)."""
    if not registered:
        return (STOP, "target_reached") if crossing["reached"] else (GO_ON, None)
    verdict = (confirmation or {}).get("verdict")
    if verdict in (None, "no crossing to confirm"):
        return GO_ON, None
    if verdict == "confirmed":
        return STOP, "target_confirmed"
    return STOP, "crossing_not_confirmed"


def frozen_heldout(receipts: list[str]) -> str:
    """The held-out split's file, as the frozen split receipt among `receipts` names it."""
    for path in receipts:
        if Path(path).name == "split.json":
            split = read_receipt(path)
            return next(s["name"] for s in split["subject"] if s["name"].endswith("heldout.jsonl"))
    raise Refusal("the judge was given no split receipt to find the held-out split by")


def judge(args) -> dict:
    prereg = preregistration.Preregistration.load(args.target)
    args.heldout = args.heldout or frozen_heldout(args.receipts)
    judged = Path(args.judged)
    (judged / "eval").mkdir(parents=True, exist_ok=True)
    # what the evaluation and the confirmation are both given, as their rules give it
    common = [
        *("--target", args.target, "--receipts", *args.receipts, "--pins", args.pins),
        *("--checkpoint-records", args.checkpoint_records, "--heldout", args.heldout),
        *("--store", args.store, "--cores", str(args.cores)),
        # the evaluations it plays keep their embedded host's log, as the eval rule's do
        *("--host-log", str(judged / "host.log")),
    ]
    records = list(read_jsonl(args.checkpoint_records))
    evals = {}
    for record in records:
        name = record["checkpoint"]
        out = judged / "eval" / f"{name}.json"
        if not out.is_file():
            checkpoint = str(Path(args.checkpoints) / name)
            code = heldout.main(
                [*common, "--checkpoint", checkpoint, "--backend", args.backend, "--out", str(out)]
            )
            if code:
                raise Refusal(f"the held-out evaluation of {name} failed (exit {code})")
        evals[name] = str(out)
    crossing = time_to_target(
        records,
        {name: json.loads(Path(path).read_text()) for name, path in evals.items()},
        prereg.threshold,
        rule=prereg.target.crossing,
    )
    confirmation = None
    if prereg.confirmation and crossing["reached"]:
        out = judged / "confirm.json"
        code = confirm.main(
            [
                *common,
                *("--evals", *evals.values(), "--checkpoints", args.checkpoints),
                *("--backend", args.confirm_backend, "--out", str(out)),
            ]
        )
        if code:
            raise Refusal(f"the confirmatory evaluation failed (exit {code})")
        confirmation = json.loads(out.read_text())
    decision, reason = decide(confirmation, crossing, prereg.confirmation is not None)
    return {"checkpoint": records[-1]["checkpoint"], "decision": decision, "stop_reason": reason}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.analysis.stop_at_target", description=__doc__.split("\n")[0]
    )
    preregistration.add_frozen_arguments(parser)
    parser.add_argument("--pins", required=True, help="the run's pins.json")
    parser.add_argument("--checkpoint-records", required=True, help="the run's checkpoints.jsonl")
    parser.add_argument("--checkpoints", required=True, help="the run's checkpoints/ folder")
    parser.add_argument(
        "--heldout",
        help="heldout.jsonl; by default the held-out file the split receipt names, so that the "
        "training process that starts this judge never carries a held-out path",
    )
    parser.add_argument("--backend", required=True, help="JSON: the run's evaluation arm config")
    parser.add_argument("--confirm-backend", required=True, help="JSON: the confirmation's")
    parser.add_argument("--store", required=True, help="evaluations by key (eval/reuse.py)")
    parser.add_argument("--judged", required=True, help="where the judged evaluations go")
    parser.add_argument("--out", required=True, help="writes: the verdict")
    workers.add_cores_argument(parser)
    args = parser.parse_args(argv)
    began = time.monotonic()
    try:
        verdict = judge(args)
    except (Refusal, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    verdict["judged_s"] = round(time.monotonic() - began, 3)
    atomic_write_json(args.out, verdict)
    print(f"stop at target: {verdict}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
