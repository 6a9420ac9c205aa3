"""The task split: deterministic for a seed, stratified by family, disjoint, different per seed."""

from __future__ import annotations

import pytest

from envab.split import Split, SplitError, check_disjoint, split_tasks


def tasks(families=("a", "b", "c"), per_family=8) -> list[dict]:
    return [
        {"id": f"{f}-{i}", "family": f, "instruction": f"do {f} {i}", "config": [], "evaluator": {}}
        for f in families
        for i in range(per_family)
    ]


def test_split_is_deterministic_for_a_seed():
    first = split_tasks(tasks(), seed=3, heldout_fraction=0.25)
    again = split_tasks(list(reversed(tasks())), seed=3, heldout_fraction=0.25)
    assert first == again


def test_split_differs_for_another_seed():
    assert split_tasks(tasks(), 3, 0.25).heldout_ids != split_tasks(tasks(), 4, 0.25).heldout_ids


def test_split_is_stratified_and_disjoint():
    split = split_tasks(tasks(per_family=8), seed=0, heldout_fraction=0.25)
    for family in "abc":
        assert sum(t["family"] == family for t in split.heldout) == 2
        assert sum(t["family"] == family for t in split.train) == 6
    assert not set(split.train_ids) & set(split.heldout_ids)
    assert sorted(split.train_ids + split.heldout_ids) == sorted(t["id"] for t in tasks())


def test_duplicate_ids_are_refused():
    with pytest.raises(SplitError, match="duplicate task ids"):
        split_tasks(tasks() + tasks()[:1], 0, 0.25)


def test_a_renamed_copy_across_the_split_is_caught():
    train = tasks(("a",), 2)
    renamed = {**train[0], "id": "renamed"}
    with pytest.raises(SplitError, match="share task content"):
        check_disjoint(Split(train=train, heldout=[renamed]))
