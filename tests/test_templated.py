"""The templated layout: deterministic, valid, and the screen (the template's cue) is needed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from envs.tasks import templated
from envs.tasks.build import build, make_task
from envs.tasks.local import LocalBackend
from envs.tasks.validate import validate

REPO = Path(__file__).resolve().parent.parent
ARGS = dict(seed=1, per_family=48, families=["click_button"], layout="templated", templates=4)


@pytest.fixture(scope="module")
def templated_set():
    return build(**ARGS)


def test_two_processes_build_identical_bytes_and_record_the_layout(tmp_path):
    cmd = [sys.executable, "-m", "envs.tasks.build", "--seed", "1", "--per-family", "8",
           "--families", "click_button", "--layout", "templated", "--templates", "3"]
    for name in ("a", "b"):
        done = subprocess.run([*cmd, "--out", str(tmp_path / name), "--check"], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    for name in ("tasks.jsonl", "solutions.jsonl", "index.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    assert (index["layout"], index["templates"]) == ("templated", 3)
    task = json.loads((tmp_path / "a" / "tasks.jsonl").read_text().splitlines()[0])
    assert task["generator"]["layout"] == "templated" and task["generator"]["templates"] == 3
    assert task["generator"]["template"] in range(3)


def test_the_seeded_layout_is_unchanged_and_says_nothing_new():
    task, _ = make_task(1, "click_button", 0)
    assert set(task["generator"]) == {"version", "seed", "index"}


def test_the_validator_accepts_every_templated_task(templated_set):
    tasks, solutions = templated_set
    results = validate(LocalBackend().create, tasks, solutions)
    assert [r.id for r in results if not r.accepted] == []
    # each other template's slot for the target is a near miss that must score 0
    for r in results:
        slots = [p for p in r.plays if p.name.startswith("template")]
        assert len(slots) == 3 and all(p.valid and p.score == 0.0 for p in slots), r.id


def test_same_instruction_different_template_means_a_different_click(templated_set):
    tasks, solutions = templated_set
    clicks = defaultdict(lambda: defaultdict(set))  # instruction -> template -> click
    for task, solution in zip(tasks, solutions, strict=True):
        p = solution["oracle"][0]["parameters"]
        clicks[task["instruction"]][task["generator"]["template"]].add((p["x"], p["y"]))
    compared = 0
    for by_template in clicks.values():
        assert all(len(c) == 1 for c in by_template.values())  # (cue, label) fixes the click
        positions = [next(iter(c)) for c in by_template.values()]
        assert len(set(positions)) == len(positions)  # ... and the label alone does not
        compared += len(positions) > 1
    assert compared >= 4
    assert len({t["generator"]["template"] for t in tasks}) == 4


def test_every_label_has_its_own_slot_in_every_template():
    labels = templated.CLICK_LABELS
    ts = templated.make_templates(1, "click_button", 4, labels, 128, 128)
    assert [t.cue for t in ts] == list(templated.CUES)
    for label in labels:
        assert len({t.slots[label] for t in ts}) == 4
    for t in ts:
        assert len(set(t.slots.values())) == len(labels)
    assert templated.make_templates(2, "click_button", 4, labels, 128, 128) != ts


def test_the_cue_is_global_and_differs_between_templates(templated_set):
    from trainer.agent import first_screenshot

    tasks, _ = templated_set
    band = {}
    for task in tasks:
        shot = first_screenshot(task)
        band.setdefault(task["generator"]["template"], shot.crop((0, 100, 128, 126)).tobytes())
    assert len(set(band.values())) == 4


@pytest.mark.parametrize("templates", [1, 5])
def test_template_counts_out_of_range_are_one_clear_error(tmp_path, templates):
    done = subprocess.run(
        [sys.executable, "-m", "envs.tasks.build", "--out", str(tmp_path), "--families",
         "click_button", "--layout", "templated", "--templates", str(templates)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1 and "templates must be 2..4" in done.stderr
    assert not (tmp_path / "tasks.jsonl").exists()


def test_a_family_without_templates_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="type_field.*no templated layout"):
        make_task(1, "type_field", 0, layout="templated")
