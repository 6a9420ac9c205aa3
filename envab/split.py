"""The train / held-out split of a frozen task set: seeded, stratified by family, disjoint.

The rule, as documented in the receipt: tasks are grouped by ``family`` (tasks without one form
the group ``_none``); each group is sorted by id and shuffled with ``random.Random`` seeded by the
string ``"env-ab-split:<seed>:<family>"``; the first ``max(1, round(n * heldout_fraction))``
tasks of a group of n >= 2 are held out, the rest train. Train and held-out are disjoint by id and
by content digest (the task JSON without its id), so a renamed copy cannot leak across.

The class rule, for templated task sets (split unit class): a task's functional class is its
(family, instruction, template), i.e. for click_button the (label, theme) pair that decides the
correct click. Each family's classes are sorted and shuffled with ``random.Random`` seeded by
``"env-ab-split:<seed>:<family>:classes"``; walking that order, a class is held out while fewer
than ``max(1, round(n * heldout_fraction))`` of the family's n classes are, provided its
instruction and its template each stay in some training class. Every task of a held-out class is
held out: success on it needs composing what training taught separately (the row from the label,
the column from the screen), never recalling a click seen in training.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from envab.errors import Refusal
from envab.hashing import sha256_json


def _paragraph(n: int) -> str:
    return __doc__.split("\n\n")[n].replace("\n", " ").split(": ", 1)[1]


RULE = _paragraph(1)
CLASS_RULE = _paragraph(2)
UNITS = ("task", "class")
NO_FAMILY = "_none"


class SplitError(Refusal, ValueError):
    pass


# Not content: the id, and the digest of the task file's bytes (which hold the id).
NOT_CONTENT = ("id", "source_sha256")


def task_digest(task: dict) -> str:
    """Digest of a task's content, id (and anything else naming it) excluded."""
    return sha256_json({k: v for k, v in task.items() if k not in NOT_CONTENT})


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


STRATA = ("family", "domain")  # the task field the task rule groups by (an OSWorld set: domain)


def rule_text(unit: str, stratify: str = "family") -> str:
    """The split rule of `unit`, as the split receipt records it."""
    rule = {"task": RULE, "class": CLASS_RULE}[unit]
    return rule.replace("``family``", f"``{stratify}``") if unit == "task" else rule


def functional_class(task: dict) -> tuple[str, str, int]:
    """(family, instruction, template): what decides a templated task's correct action."""
    template = (task.get("generator") or {}).get("template")
    if template is None:
        raise SplitError(
            f"task {task.get('id')!r} names no layout template (generator.template): holding out "
            "functional classes needs a templated task set (tasks.factory.layout: templated)"
        )
    return task.get("family") or NO_FAMILY, task["instruction"], int(template)


def heldout_classes(tasks: list[dict], seed: int, heldout_fraction: float) -> set[tuple]:
    """The classes the class rule holds out (see the module's docstring)."""
    by_family: dict[str, set[tuple]] = defaultdict(set)
    for task in tasks:
        cls = functional_class(task)
        by_family[cls[0]].add(cls)
    chosen: set[tuple] = set()
    for family in sorted(by_family):
        order = sorted(by_family[family])
        random.Random(f"env-ab-split:{seed}:{family}:classes").shuffle(order)
        wanted = max(1, round(len(order) * heldout_fraction))
        training = set(order)
        for cls in order:
            if len(training) == len(order) - wanted:
                break
            rest = training - {cls}
            if any(c[1] == cls[1] for c in rest) and any(c[2] == cls[2] for c in rest):
                training = rest
        if len(training) != len(order) - wanted:
            raise SplitError(
                f"family {family}: cannot hold out {wanted} of {len(order)} classes and keep every "
                "instruction and template in training; lower heldout_fraction"
            )
        chosen |= set(order) - training
    return chosen


def split_tasks(
    tasks: list[dict],
    seed: int,
    heldout_fraction: float,
    unit: str = "task",
    stratify: str = "family",
) -> Split:
    if unit not in UNITS:
        raise SplitError(f"split unit must be one of {', '.join(UNITS)}, got {unit!r}")
    if stratify not in STRATA:
        raise SplitError(f"split stratify must be one of {', '.join(STRATA)}, got {stratify!r}")
    if unit == "class" and stratify != "family":
        raise SplitError("the class unit groups by family; stratify by domain is for the task unit")
    if not 0 < heldout_fraction < 1:
        raise SplitError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    ids = [t.get("id") for t in tasks]
    if any(not isinstance(i, str) or not i for i in ids):
        raise SplitError("every task needs a non-empty string id")
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SplitError(f"duplicate task ids: {duplicates[:5]}")

    if unit == "class":
        held = heldout_classes(tasks, seed, heldout_fraction)
        train = [t for t in tasks if functional_class(t) not in held]
        heldout = [t for t in tasks if functional_class(t) in held]
        split = Split(sorted(train, key=lambda t: t["id"]), sorted(heldout, key=lambda t: t["id"]))
        check_disjoint(split)
        return split
    by_family: dict[str, list[dict]] = defaultdict(list)
    for task in tasks:
        by_family[task.get(stratify) or NO_FAMILY].append(task)
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
