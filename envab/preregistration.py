"""Freezing the pre-registration, and the check every later job makes against it.

Freezing records target.yaml's sha256 in receipts/<experiment>/preregistration.json. Once that
receipt exists the file is never re-frozen: an edited target.yaml is refused, and the only way to
register a changed experiment is a new experiment_id (a new receipts folder).
"""

from __future__ import annotations

from pathlib import Path

from envab.config import ConfigError, Target
from envab.hashing import sha256_file
from envab.receipts import read_receipt, receipt_dir, repo_commit, subject, utc_now, write_receipt

RECEIPT = "preregistration.json"


class FrozenTargetEdited(ConfigError):
    """target.yaml no longer matches the digest it was frozen with."""


def receipt_path(target: Target, root: str | Path = ".") -> Path:
    return receipt_dir(target.experiment_id, root) / RECEIPT


def _edited_message(path: Path, target: Target, frozen: str, now: str) -> str:
    return (
        f"{path} was edited after experiment '{target.experiment_id}' was frozen "
        f"(frozen sha256 {frozen[:12]}…, now {now[:12]}…). A frozen pre-registration is never "
        f"re-frozen or silently retrained: restore the frozen file, or register a new experiment "
        f"by giving it a new experiment_id."
    )


def check_frozen(target_path: str | Path, root: str | Path = ".") -> Target:
    """The frozen Target, or ConfigError if it is not frozen yet or has been edited since."""
    target_path = Path(target_path)
    target = Target.load(target_path)
    receipt = receipt_path(target, root)
    if not receipt.is_file():
        raise ConfigError(
            f"experiment '{target.experiment_id}' is not frozen yet ({receipt} missing): "
            f"run `snakemake --cores 1 freeze` first"
        )
    frozen = read_receipt(receipt)["subject"][0]["digest"]["sha256"]
    now = sha256_file(target_path)
    if now != frozen:
        raise FrozenTargetEdited(_edited_message(target_path, target, frozen, now))
    return target


def frozen_utc(target: Target, root: str | Path = ".") -> str:
    return read_receipt(receipt_path(target, root))["predicate"]["frozen_utc"]


def freeze(target_path: str | Path, root: str | Path = ".") -> Path:
    """Freeze target.yaml once; a repeat with the same bytes is a no-op, an edit is refused."""
    target_path = Path(target_path)
    target = Target.load(target_path)
    receipt = receipt_path(target, root)
    if receipt.is_file():
        check_frozen(target_path, root)
        return receipt
    write_receipt(
        receipt,
        "preregistration",
        subjects=[subject(target_path)],
        predicate={
            "experiment_id": target.experiment_id,
            "frozen_utc": utc_now(),
            "source": repo_commit(Path(target_path).parent),
            "target": target.raw["target"],
        },
    )
    return receipt
