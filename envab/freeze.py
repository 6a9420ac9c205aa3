"""The freeze stage's CLI: one subcommand per frozen item, each writing the receipt it is given.

    python -m envab.freeze target preregistration/target.yaml --receipt R/preregistration.json \
        [--setups-per-valid '{"drums": 0.125}']
    python -m envab.freeze split --target T --receipts R/preregistration.json --tasks tasks.jsonl \
        --seed 0 --heldout-fraction 0.25 [--unit class] [--stratify domain] --train train.jsonl \
        --heldout heldout.jsonl --receipt R/split.json
    python -m envab.freeze code --target T --receipts R/preregistration.json \
        --repository . --receipt R/code.json
    python -m envab.freeze pins --target T --receipts R/*.json --arm drums --seed 1 \
        --arm-config '{...}' --training '{...}' --out pins.json

(The model is frozen by the trainer's own CLI, `python -m envab.trainer.pin`, which knows how to
build it.) Every subcommand but `target` first checks target.yaml against its frozen digest, found
among the `--receipts` it builds on. Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from envab import anchor, codepins, preregistration, software
from envab.errors import Refusal, refused
from envab.hashing import aggregate_digest, sha256_file
from envab.io import read_jsonl, write_jsonl
from envab.receipts import read_receipt, repo_commit, subject, write_receipt
from envab.run_pins import RunPins
from envab.split import (
    STRATA,
    functional_class,
    rule_text,
    split_tasks,
    task_digest,
)


def setups_per_valid(arms: dict, num_generations: int) -> dict[str, float]:
    """Per configured arm, the fewest environment set-ups one valid trajectory costs: one per
    attempt on an arm that restores per rollout (a QEMU VM, the embedded host in restore mode),
    one per fork group of num_generations elsewhere. Fewest, so that a handicap refused with it
    (Preregistration.check_budget_fit) cannot fit however the run goes."""
    return {
        arm: 1.0
        if spec.get("backend") == "qemu" or spec.get("mode") == "restore"
        else 1.0 / num_generations
        for arm, spec in arms.items()
    }


def cmd_target(args) -> None:
    prereg = preregistration.Preregistration.load(args.target)
    if args.setups_per_valid:
        # a control sized past the budget is refused before anything is frozen
        prereg.check_budget_fit(json.loads(args.setups_per_valid))
    anchored = anchor.anchor_path(args.target, prereg.experiment_id)
    first = not anchored.is_file()
    print(preregistration.freeze(args.target, args.receipt))
    if first and anchored.is_file():  # the team commits it: what a later freeze must match
        print(f"anchored: {anchored} (commit it)")


def cmd_split(args) -> None:
    _, receipts = preregistration.frozen_inputs(args)
    tasks = list(read_jsonl(args.tasks))
    split = split_tasks(tasks, args.seed, args.heldout_fraction, args.unit, args.stratify)
    write_jsonl(args.train, split.train)
    write_jsonl(args.heldout, split.heldout)

    def listing(side: list[dict]) -> list[dict]:
        return [{"id": t["id"], "sha256": task_digest(t)} for t in side]

    # The registered rule that chose the task set from a larger one (tasks.osworld.select), and
    # the tasks job's per-task report of what it left out and why, are part of what is frozen.
    report = json.loads(Path(args.tasks_report).read_text()) if args.tasks_report else {}
    chosen = "selection" in report
    write_receipt(
        args.receipt,
        "split",
        subjects=[subject(args.tasks), subject(args.train), subject(args.heldout)]
        + ([subject(args.tasks_report)] if chosen else []),
        predicate={
            **(
                {"selection": {**report["selection"], "loaded": report["loaded"]}} if chosen else {}
            ),
            "rule": rule_text(args.unit, args.stratify),
            "unit": args.unit,
            "stratify": args.stratify,
            "seed": args.seed,
            "heldout_fraction": args.heldout_fraction,
            **(
                {"heldout_classes": sorted({functional_class(t) for t in split.heldout})}
                if args.unit == "class"
                else {}
            ),
            "tasks": len(tasks),
            f"per_{args.stratify}": {
                side: dict(sorted(Counter(t.get(args.stratify) for t in tasks_).items()))
                for side, tasks_ in (("train", split.train), ("heldout", split.heldout))
            },
            "train": listing(split.train),
            "heldout": listing(split.heldout),
            "disjoint": True,  # split_tasks raises otherwise
        },
        depends_on=receipts.paths,
    )
    print(f"split: {len(split.train)} train, {len(split.heldout)} held-out")


def cmd_code(args) -> None:
    _, receipts = preregistration.frozen_inputs(args)
    patterns = codepins.code_pins(args.repository)
    groups = codepins.pin_groups(patterns)
    files = {path: digest for g in groups.values() for path, digest in g["files"].items()}
    # A freeze on a dirty tree is recorded, file by file: the commit alone would not say what ran.
    dirty = codepins.uncommitted(sorted(files))
    # The registered code: written into the anchor by the experiment's first freeze; any later
    # freeze names the files that differ from it (envab/anchor.py).
    plain = {anchor.repository_path(p): d for p, d in files.items()}
    prereg_receipt = read_receipt(receipts[preregistration.RECEIPT])["predicate"]
    if prereg_receipt.get("first_freeze"):
        anchor.register_code(args.target, prereg_receipt["experiment_id"], plain)
    registered = anchor.registered_code(args.target, prereg_receipt["experiment_id"])
    differs = anchor.code_differences(registered, files) if registered is not None else None
    write_receipt(
        args.receipt,
        "code",
        subjects=[subject(path, digest) for path, digest in sorted(files.items())],
        predicate={
            "patterns": patterns,
            "groups": groups,
            "sha256": aggregate_digest(files),
            "source": {**repo_commit(), "uncommitted": dirty},
            # None: the anchor registers no code (an experiment from before it did)
            "differs_from_registered": differs,
        },
        depends_on=receipts.paths,
    )
    print(f"code: {len(files)} files pinned in {len(groups)} groups")
    if dirty:
        print(f"code: {len(dirty)} pinned files differ from the commit, recorded: {dirty[:5]}")
    if differs:
        print(f"code: {len(differs)} pinned files differ from the registered code: {differs[:5]}")


def cmd_pins(args) -> None:
    """What one (arm, seed) run is pinned to. `comparable_sha256` covers everything but the arm
    and the seed: the analysis refuses to compare runs where it differs."""
    prereg, receipts = preregistration.frozen_inputs(args)
    RunPins.make(
        experiment_id=prereg.experiment_id,
        receipts={path.name: sha256_file(path) for path in receipts.paths},
        training=json.loads(args.training),
        software=software.versions(),  # the lock the run is under (envab/software.py)
        arm=args.arm,
        seed=args.seed,
        arm_config=json.loads(args.arm_config),
    ).write(args.out)
    print(f"pins: {args.arm} seed {args.seed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envab.freeze", description="freeze stage")
    sub = parser.add_subparsers(dest="command", required=True)

    def frozen_parser(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        preregistration.add_frozen_arguments(p)
        return p

    p = sub.add_parser("target", help="freeze target.yaml (once)")
    p.add_argument("target")
    p.add_argument("--receipt", help="default: receipts/<experiment_id>/preregistration.json")
    p.add_argument(
        "--setups-per-valid",
        help="JSON, arm -> the fewest environment set-ups per valid trajectory (setups_per_valid):"
        " a handicap control that cannot fit the budget is refused",
    )
    p.set_defaults(run=cmd_target)

    p = frozen_parser("split", "split the task set, write split.json")
    p.add_argument("--tasks", required=True)
    p.add_argument(
        "--tasks-report",
        help="the tasks job's report (tasks/index.json): its selection rule goes in the receipt",
    )
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--heldout-fraction", type=float, required=True)
    p.add_argument("--unit", choices=("task", "class"), default="task", help="envab/split.py")
    p.add_argument("--stratify", choices=STRATA, default="family", help="the field to group by")
    p.add_argument("--train", required=True)
    p.add_argument("--heldout", required=True)
    p.add_argument("--receipt", required=True)
    p.set_defaults(run=cmd_split)

    p = frozen_parser("code", "hash the pinned source files, write code.json")
    p.add_argument(
        "--repository",
        default=".",
        help="the folder of the Snakefile, whose files envab.codepins.CODE_PINS names",
    )
    p.add_argument("--receipt", required=True)
    p.set_defaults(run=cmd_code)

    p = frozen_parser("pins", "record what one (arm, seed) run is pinned to")
    p.add_argument("--arm", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--arm-config", required=True, help="JSON")
    p.add_argument("--training", required=True, help="JSON: the training settings (sft, grpo)")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_pins)

    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (Refusal, FileNotFoundError, ValueError) as e:
        return refused(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
