"""The freeze stage's CLI: one subcommand per frozen item, each writing its receipt.

    python -m envab.freeze target preregistration/target.yaml
    python -m envab.freeze split --target T --tasks tasks.jsonl --seed 0 --heldout-fraction 0.25 \
        --train train.jsonl --heldout heldout.jsonl
    python -m envab.freeze code --target T --groups '{"trainer": ["trainer/**/*.py"]}'
    python -m envab.freeze model --target T --source builtin:tiny-qwen3-vl --spec '{"seed": 0}' \
        --tasks tasks.jsonl --manifest '{"config.json": "..."}' --out results/<exp>/model
    python -m envab.freeze pins --target T --arm drums --seed 1 --arm-config '{...}' --out pins.json

Every subcommand but `target` first checks target.yaml against its frozen digest. Errors are one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from envab import codepins, preregistration
from envab.config import ConfigError, Target
from envab.hashing import aggregate_digest, sha256_file, sha256_json
from envab.io import atomic_write_json, read_jsonl, write_jsonl
from envab.receipts import receipt_dir, repo_commit, subject, write_receipt
from envab.split import RULE, SplitError, split_tasks, task_digest

PREREG = preregistration.RECEIPT


def _receipts(target: Target) -> Path:
    return receipt_dir(target.experiment_id)


def cmd_target(args) -> None:
    print(preregistration.freeze(args.target))


def cmd_split(args) -> None:
    target = preregistration.check_frozen(args.target)
    tasks = list(read_jsonl(args.tasks))
    split = split_tasks(tasks, args.seed, args.heldout_fraction)
    write_jsonl(args.train, split.train)
    write_jsonl(args.heldout, split.heldout)
    receipts = _receipts(target)

    def listing(side: list[dict]) -> list[dict]:
        return [{"id": t["id"], "sha256": task_digest(t)} for t in side]

    write_receipt(
        receipts / "split.json",
        "split",
        subjects=[subject(args.tasks), subject(args.train), subject(args.heldout)],
        predicate={
            "rule": RULE,
            "seed": args.seed,
            "heldout_fraction": args.heldout_fraction,
            "tasks": len(tasks),
            "per_family": {
                side: dict(sorted(Counter(t.get("family") for t in tasks_).items()))
                for side, tasks_ in (("train", split.train), ("heldout", split.heldout))
            },
            "train": listing(split.train),
            "heldout": listing(split.heldout),
            "disjoint": True,  # split_tasks raises otherwise
        },
        depends_on=[receipts / PREREG],
    )
    print(f"split: {len(split.train)} train, {len(split.heldout)} held-out")


def cmd_code(args) -> None:
    target = preregistration.check_frozen(args.target)
    groups = codepins.pin_groups(json.loads(args.groups))
    files = {path: digest for g in groups.values() for path, digest in g["files"].items()}
    receipts = _receipts(target)
    write_receipt(
        receipts / "code.json",
        "code",
        subjects=[subject(path, digest) for path, digest in sorted(files.items())],
        predicate={
            "patterns": json.loads(args.groups),
            "groups": groups,
            "sha256": aggregate_digest(files),
            "source": repo_commit(),
        },
        depends_on=[receipts / PREREG],
    )
    print(f"code: {len(files)} files pinned in {len(groups)} groups")


def cmd_model(args) -> None:
    from trainer import model as model_source  # torch is only needed by this subcommand

    target = preregistration.check_frozen(args.target)
    out = Path(args.out)
    try:
        source = model_source.parse_source(
            args.source, model_source.spec_from_mapping(json.loads(args.spec))
        )
        model_source.materialize(source, out, tasks=args.tasks)
        files = model_source.check_manifest(out, json.loads(args.manifest))
    except model_source.ModelPinError as e:
        raise ConfigError(str(e)) from None
    receipts = _receipts(target)
    write_receipt(
        receipts / "model.json",
        "model",
        subjects=[subject(out / path, digest) for path, digest in files.items()],
        predicate={
            "source": args.source,
            "spec": json.loads(args.spec),
            "directory": out.as_posix(),
            "files": files,
            "sha256": aggregate_digest(files),
        },
        depends_on=[receipts / PREREG],
    )
    print(f"model: {len(files)} files match the manifest")


def cmd_pins(args) -> None:
    """What one (arm, seed) run is pinned to. `comparable_sha256` covers everything but the arm
    and the seed: the analysis refuses to compare runs where it differs."""
    target = preregistration.check_frozen(args.target)
    receipts = _receipts(target)
    shared = {
        "experiment_id": target.experiment_id,
        "receipts": {name: sha256_file(receipts / name) for name in args.receipts},
        "training": json.loads(args.training),
    }
    record = {
        **shared,
        "arm": args.arm,
        "seed": args.seed,
        "arm_config": json.loads(args.arm_config),
        "comparable_sha256": sha256_json(shared),
    }
    atomic_write_json(args.out, record)
    print(f"pins: {args.arm} seed {args.seed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envab.freeze", description="freeze stage")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("target", help="freeze target.yaml (once)")
    p.add_argument("target")
    p.set_defaults(run=cmd_target)

    p = sub.add_parser("split", help="split the task set, write split.json")
    p.add_argument("--target", required=True)
    p.add_argument("--tasks", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--heldout-fraction", type=float, required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--heldout", required=True)
    p.set_defaults(run=cmd_split)

    p = sub.add_parser("code", help="hash the pinned source files, write code.json")
    p.add_argument("--target", required=True)
    p.add_argument("--groups", required=True, help="JSON: group -> list of globs")
    p.set_defaults(run=cmd_code)

    p = sub.add_parser(
        "model", help="build or fetch the model, check its manifest, write model.json"
    )
    p.add_argument("--target", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--spec", default="{}", help="JSON: builder settings of the builtin model")
    p.add_argument("--tasks", required=True, help="train.jsonl: the tiny tokenizer's corpus")
    p.add_argument("--manifest", required=True, help="JSON: relative path -> sha256")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_model)

    p = sub.add_parser("pins", help="record what one (arm, seed) run is pinned to")
    p.add_argument("--target", required=True)
    p.add_argument("--arm", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--arm-config", required=True, help="JSON")
    p.add_argument("--training", required=True, help="JSON: the training settings (sft, grpo)")
    p.add_argument("--receipts", nargs="+", required=True, help="receipt file names")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_pins)

    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (ConfigError, SplitError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
