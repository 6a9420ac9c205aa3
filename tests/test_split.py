"""The task split: deterministic for a seed, stratified by family, disjoint, different per seed."""

from __future__ import annotations

import pytest

from envab.envs.tasks.build import build
from envab.split import Split, SplitError, check_disjoint, functional_class, split_tasks


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


# -- holding out functional classes ---------------------------------------------------------------


def templated(seed=1, per_family=64):
    tasks, _ = build(seed, per_family, families=["click_button"], layout="templated", templates=2)
    return tasks


def test_the_class_rule_holds_out_whole_label_theme_pairs_whose_parts_stay_in_training():
    tasks = templated()
    split = split_tasks(tasks, 0, 0.25, unit="class")
    held = {functional_class(t) for t in split.heldout}
    trained = {functional_class(t) for t in split.train}
    assert held and not held & trained  # no held-out task's correct click was trained on
    assert len(held) == round(len(held | trained) * 0.25)
    for _, instruction, template in held:  # each part of it was: the label, and the screen
        assert any(c[1] == instruction for c in trained)
        assert any(c[2] == template for c in trained)
    assert split_tasks(tasks, 0, 0.25, unit="class") == split
    assert split_tasks(tasks, 1, 0.25, unit="class") != split


def test_the_class_rule_refuses_what_it_cannot_hold_out():
    with pytest.raises(SplitError, match="needs a templated task set"):
        split_tasks(build(1, 4)[0], 0, 0.25, unit="class")
    # Two labels in two themes: holding out three of four classes would leave a part untrained.
    tasks = [
        {"id": f"t{i}", "family": "f", "instruction": label, "generator": {"template": theme}}
        for i, (label, theme) in enumerate([("a", 0), ("a", 1), ("b", 0), ("b", 1)])
    ]
    with pytest.raises(SplitError, match="keep every instruction and template"):
        split_tasks(tasks, 0, 0.75, unit="class")
    assert len(split_tasks(tasks, 0, 0.25, unit="class").heldout) == 1
