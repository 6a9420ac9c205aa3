"""The trainer's guards refuse a run whose freeze no longer holds, or that meets a held-out task."""

from __future__ import annotations

import json

import pytest
from conftest import SHIPPED_EXP as EXP

from envab.receipts import FREEZE_RECEIPTS, Receipts
from envab.trainer.guards import (
    GuardError,
    HeldoutGuard,
    check_code,
    check_pins,
    check_receipts,
    held_out,
    heldout_ids,
)

RECEIPTS = f"receipts/{EXP}"
PINS = f"results/{EXP}/drums/seed1/pins.json"


def frozen_receipts(root) -> Receipts:
    """The freeze receipts as a job is given them: relative paths, run from the workflow folder."""
    return Receipts([root / RECEIPTS / name for name in FREEZE_RECEIPTS])


def test_a_clean_freeze_passes_every_guard(frozen):
    root = frozen.root
    check_receipts(frozen_receipts(root), root)
    check_code(frozen_receipts(root), root)
    pins = check_pins(root / PINS, frozen_receipts(root))
    assert pins.arm == "drums"


def test_changed_code_is_refused_by_name(frozen):
    path = frozen.root / "envs" / "tasks" / "checkers.py"
    path.write_text(path.read_text() + "\n# an innocent-looking edit\n")
    with pytest.raises(GuardError, match="envs/tasks/checkers.py"):
        check_code(frozen_receipts(frozen.root), frozen.root)
    with pytest.raises(GuardError, match="do not verify"):
        check_receipts(frozen_receipts(frozen.root), frozen.root)


def test_a_file_added_after_freezing_is_refused(frozen):
    (frozen.root / "trainer" / "shortcut.py").write_text("REWARD = 1.0\n")
    with pytest.raises(GuardError, match="trainer/shortcut.py"):
        check_code(frozen_receipts(frozen.root), frozen.root)


def test_pins_made_against_other_receipts_are_refused(frozen):
    pins_path = frozen.root / PINS
    pins = json.loads(pins_path.read_text())
    pins["receipts"]["split.json"] = "0" * 64
    pins_path.write_text(json.dumps(pins))
    with pytest.raises(GuardError, match="split.json"):
        check_pins(pins_path, frozen_receipts(frozen.root))


def test_heldout_ids_never_reach_the_trainer(frozen):
    heldout = heldout_ids(frozen_receipts(frozen.root))
    train = [
        json.loads(line)["id"] for line in (frozen.root / f"results/{EXP}/tasks/train.jsonl").open()
    ]
    guard = HeldoutGuard(heldout)
    guard.check_dataset(train)
    some_heldout = sorted(heldout)[0]
    with pytest.raises(GuardError, match="held-out task ids in the training data"):
        guard.check_dataset([*train, some_heldout])
    guard(train[0])
    with pytest.raises(GuardError, match=some_heldout):
        guard(some_heldout)


def test_a_training_process_checks_every_receipt_but_never_opens_the_held_out_split(frozen):
    heldout = frozen.root / "results" / EXP / "tasks" / "heldout.jsonl"
    heldout.unlink()  # a process that opened it would find it MISSING
    check_receipts(frozen_receipts(frozen.root), frozen.root, unread=held_out)
    with pytest.raises(GuardError, match="heldout.jsonl"):
        check_receipts(frozen_receipts(frozen.root), frozen.root)
    # the rest is still checked: an edited training split is refused all the same
    train = frozen.root / "results" / EXP / "tasks" / "train.jsonl"
    train.write_text(train.read_text() + "\n")
    with pytest.raises(GuardError, match="train.jsonl"):
        check_receipts(frozen_receipts(frozen.root), frozen.root, unread=held_out)
