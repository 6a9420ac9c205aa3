"""Freeze the model: build (builtin) or fetch (hub) it, check it against the config's manifest,
write its receipt.

    python -m envab.trainer.pin --target preregistration/target.yaml \
        --receipts receipts/<exp>/preregistration.json --source builtin:tiny-qwen3-vl \
        --spec '{"seed": 0}' --tasks results/<exp>/tasks/train.jsonl \
        --manifest '{"config.json": "..."}' --out results/<exp>/model \
        --receipt receipts/<exp>/model.json

The builtin tiny model's tokenizer is trained on the training split's instructions only, so it
never sees held-out text. With `--training` (config `training`) the pinned processor then counts
what `max_turns` turns cost on the tasks' largest screen, as TRL counts them, and refuses a
completion budget that cannot hold them (trainer/preflight.py `budget_at_freeze`): the freeze
fails before any training. Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from envab import preregistration
from envab.errors import Refusal, refused
from envab.hashing import aggregate_digest
from envab.receipts import subject, write_receipt
from envab.trainer.manifest import read_manifest_file
from envab.trainer.model import (
    ModelPinError,
    check_manifest,
    materialize,
    parse_source,
    read_pin_file,
    spec_from_mapping,
)


def pin_model(args) -> tuple[dict[str, str], dict | None]:
    _, receipts = preregistration.frozen_inputs(args)
    out = Path(args.out)
    spec = json.loads(args.spec)
    source = parse_source(args.source, spec_from_mapping(spec))
    materialize(source, out, tasks=args.tasks)
    files = check_manifest(out, expected_files(args.manifest, args.source))
    budget = args.training and check_budget(out, args.tasks, args.training)
    write_receipt(
        args.receipt,
        "model",
        subjects=[subject(out / path, digest) for path, digest in files.items()],
        predicate={
            "source": args.source,
            "spec": spec,
            "directory": out.as_posix(),
            "files": files,
            "sha256": aggregate_digest(files),
        },
        depends_on=receipts.paths,
    )
    return files, budget


def check_budget(model_dir: Path, tasks_file: str, training: dict) -> dict:
    """The completion budget checked against the pinned processor, with the run's pixel bounds;
    PreflightFailed (a refusal) when the registered turns cannot fit."""
    from transformers import AutoProcessor

    from envab.io import read_jsonl
    from envab.trainer import preflight

    vision = training.get("vision") or {}
    bounds = {k: vision[k] for k in ("min_pixels", "max_pixels") if k in vision}
    processor = AutoProcessor.from_pretrained(model_dir, local_files_only=True, **bounds)
    grpo = training["grpo"]
    check = preflight.budget_at_freeze(
        processor, read_jsonl(tasks_file), grpo["max_turns"], grpo["max_completion_length"]
    )
    if not check["ok"]:
        raise preflight.PreflightFailed(f"training.grpo: {check['detail']}")
    return check


def expected_files(manifest: str, source: str) -> dict[str, str]:
    """The manifest given inline (JSON) or as the file `pin --write` made; a file pinned for
    another source is refused."""
    if manifest.lstrip().startswith("{"):
        return json.loads(manifest)
    pinned = read_pin_file(manifest)
    if pinned.get("source") not in (None, source):
        raise ModelPinError(f"{manifest} pins {pinned['source']}, not the config's {source}")
    return read_manifest_file(manifest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.trainer.pin", description=__doc__.split("\n")[0]
    )
    preregistration.add_frozen_arguments(parser)
    parser.add_argument(
        "--source", required=True, help="builtin:tiny-qwen3-vl or hf://owner/name@commit"
    )
    parser.add_argument("--spec", default="{}", help="JSON: builder settings of the builtin model")
    parser.add_argument("--tasks", required=True, help="train.jsonl: the tiny tokenizer's corpus")
    parser.add_argument(
        "--manifest", required=True, help="JSON (relative path -> sha256) or a pinned YAML file"
    )
    parser.add_argument(
        "--training",
        type=json.loads,
        help="JSON: config training; checks that its turns fit its completion budget",
    )
    parser.add_argument("--out", required=True, help="the model folder")
    parser.add_argument("--receipt", required=True, help="receipts/<exp>/model.json")
    args = parser.parse_args(argv)
    try:
        files, budget = pin_model(args)
    except (Refusal, ValueError) as e:
        return refused(e)
    print(f"model: {len(files)} files match the manifest")
    if budget:
        print(
            f"budget: {args.training['grpo']['max_turns']} turns on a "
            f"{budget['screen'][0]}x{budget['screen'][1]} screen need {budget['needed']} of "
            f"max_completion_length {budget['max_completion_length']} tokens"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
