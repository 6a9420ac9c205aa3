"""The train / held-out split of a frozen task set: seeded, stratified by family, disjoint.

The rule, as documented in the receipt: tasks are grouped by ``family`` (tasks without one form
the group ``_none``); each group is sorted by id and shuffled with ``random.Random`` seeded by the
string ``"env-ab-split:<seed>:<family>"``; the first ``max(1, round(n * heldout_fraction))``
tasks of a group of n >= 2 are held out, the rest train. Train and held-out are disjoint by id and
by content digest (the task JSON without its id), so a renamed copy cannot leak across.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from envab.hashing import sha256_json

RULE = __doc__.split("\n\n")[1].replace("\n", " ").split(": ", 1)[1]
NO_FAMILY = "_none"


class SplitError(ValueError):
    pass


def task_digest(task: dict) -> str:
    """Digest of a task's content, id excluded."""
    return sha256_json({k: v for k, v in task.items() if k != "id"})


@dataclass(frozen=True)
class Split:
    train: list[dict]
    heldout: list[dict]

    @property
    def train_ids(self) -> list[str]:
        return [t["id"] for t in self.train]

    @property
    def heldout_ids(self) -> list[str]:
        return [t["id"] for t in self.heldout]


def split_tasks(tasks: list[dict], seed: int, heldout_fraction: float) -> Split:
    if not 0 < heldout_fraction < 1:
        raise SplitError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    ids = [t.get("id") for t in tasks]
    if any(not isinstance(i, str) or not i for i in ids):
        raise SplitError("every task needs a non-empty string id")
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SplitError(f"duplicate task ids: {duplicates[:5]}")

    by_family: dict[str, list[dict]] = defaultdict(list)
    for task in tasks:
        by_family[task.get("family") or NO_FAMILY].append(task)
    train, heldout = [], []
    for family in sorted(by_family):
        group = sorted(by_family[family], key=lambda t: t["id"])
        random.Random(f"env-ab-split:{seed}:{family}").shuffle(group)
        n_heldout = max(1, round(len(group) * heldout_fraction)) if len(group) >= 2 else 0
        heldout += group[:n_heldout]
        train += group[n_heldout:]
    split = Split(sorted(train, key=lambda t: t["id"]), sorted(heldout, key=lambda t: t["id"]))
    check_disjoint(split)
    return split


def check_disjoint(split: Split) -> None:
    """Raise if any id or any task content appears on both sides."""
    shared_ids = set(split.train_ids) & set(split.heldout_ids)
    if shared_ids:
        raise SplitError(f"train and held-out share ids: {sorted(shared_ids)[:5]}")
    train_digests = {task_digest(t): t["id"] for t in split.train}
    leaks = [
        (train_digests[d], t["id"]) for t in split.heldout if (d := task_digest(t)) in train_digests
    ]
    if leaks:
        raise SplitError(
            f"train and held-out share task content (train id, held-out id): {leaks[:5]}"
        )
