"""What a training run checks before its first step, and what it checks on every task it meets.

- the freeze receipts verify (every digest, see envab.verify);
- the code that runs now is the code that was frozen (receipts/<exp>/code.json): a changed trainer,
  reward or environment adapter is refused, never silently trained with;
- the run's pins (results/<exp>/<arm>/seed<k>/pins.json) still match the receipts;
- no held-out task id reaches the trainer: the training data is checked up front, and
  `HeldoutGuard` is called on every task an environment is reset to.
"""

from __future__ import annotations

from pathlib import Path

from envab import codepins, software
from envab.errors import Refusal
from envab.hashing import sha256_file
from envab.receipts import Receipts, read_receipt
from envab.run_pins import RunPins
from envab.verify import verify_receipts


class GuardError(Refusal, RuntimeError):
    """A reason to refuse the run; the message is one line."""


def held_out(name: str) -> bool:
    """Whether a receipt's subject is the held-out split, which a training process never opens."""
    return Path(name).name == "heldout.jsonl"


def check_receipts(receipts: Receipts, root: str | Path = ".", unread=None) -> None:
    """Every digest of the freeze receipts; a training process passes `unread=held_out`: it
    never opens the held-out split (the judge and the evaluation jobs check it where they read
    it, and `verify` always)."""
    checks = verify_receipts(receipts.paths, root, unread=unread)
    failed = [c for c in checks if c.failed]
    if failed:
        named = ", ".join(f"{c.status} {c.path}" for c in failed[:5])
        raise GuardError(f"the freeze receipts do not verify ({named})")


def check_code(receipts: Receipts, root: str | Path = ".") -> None:
    """Re-expand the frozen glob patterns: an edited, removed or added file is refused."""
    predicate = read_receipt(receipts["code.json"])["predicate"]
    try:
        changed = codepins.changed_since(predicate, root)
    except FileNotFoundError as e:
        raise GuardError(f"frozen code is missing: {e}") from None
    if changed:
        raise GuardError(
            f"code changed since the experiment was frozen: {', '.join(changed[:5])}; "
            f"restore it, or register a new experiment_id"
        )


def check_pins(pins_path: str | Path, receipts: Receipts) -> RunPins:
    pins = RunPins.load(pins_path)
    drift = sorted(
        name for name, digest in pins.receipts.items() if sha256_file(receipts[name]) != digest
    )
    if drift:
        raise GuardError(f"{pins_path} was pinned to other receipts than these: {drift}")
    if moved := software.drift(pins.software):
        raise GuardError(
            f"{pins_path} was pinned under other software than is installed ({', '.join(moved)}); "
            "install the lock it was pinned under, or pin it again"
        )
    return pins


def check_split_file(path: str | Path, receipts: Receipts, side: str = "train") -> None:
    """`path` must be the frozen split's `side` file, byte for byte."""
    split = read_receipt(receipts["split.json"])
    frozen = next(s for s in split["subject"] if s["name"].endswith(f"{side}.jsonl"))
    if sha256_file(path) != frozen["digest"]["sha256"]:
        raise GuardError(f"{path} is not the frozen {side} split ({frozen['name']})")


def heldout_ids(receipts: Receipts) -> frozenset[str]:
    split = read_receipt(receipts["split.json"])["predicate"]
    return frozenset(t["id"] for t in split["heldout"])


class HeldoutGuard:
    """Fails the run the moment a held-out task id reaches the trainer."""

    def __init__(self, heldout: frozenset[str]):
        self.heldout = heldout

    def check_dataset(self, task_ids) -> None:
        leaked = sorted(set(task_ids) & self.heldout)
        if leaked:
            raise GuardError(f"held-out task ids in the training data: {leaked[:5]}")

    def __call__(self, task_id: str) -> None:
        if task_id in self.heldout:
            raise GuardError(f"held-out task {task_id!r} reached the trainer")
