"""The templated layout: deterministic, valid, and the screen (the template's cue) is needed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from envab.envs.tasks import templated
from envab.envs.tasks.build import build, make_task
from envab.envs.tasks.local import LocalBackend
from envab.envs.validate import validate

REPO = Path(__file__).resolve().parent.parent
ARGS = dict(seed=1, per_family=48, families=["click_button"], layout="templated", templates=2)


@pytest.fixture(scope="module")
def templated_set():
    return build(**ARGS)


def test_two_processes_build_identical_bytes_and_record_the_layout(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "envab.envs.tasks.build",
        "--seed",
        "1",
        "--per-family",
        "8",
        "--families",
        "click_button",
        "--layout",
        "templated",
        "--templates",
        "3",
        "--width",
        "200",
    ]
    for name in ("a", "b"):
        done = subprocess.run(
            [*cmd, "--out", str(tmp_path / name), "--check"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    for name in ("tasks.jsonl", "solutions.jsonl", "index.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    assert (index["layout"], index["templates"], index["screen"]) == ("templated", 3, [200, 128])
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
    # each other template's slot for the target is a near miss that must score 0, alone and
    # after the target itself ("click the row in every column" must not pass)
    for r in results:
        for prefix in ("template", "target_then_template"):
            slots = [p for p in r.plays if p.name.startswith(prefix)]
            assert len(slots) == 1 and all(p.valid and p.score == 0.0 for p in slots), r.id


def test_decoys_fill_the_other_column_at_the_toolbar_rows(templated_set):
    tasks, _ = templated_set
    for task in tasks:
        live = task["generator"]["template"]
        widgets = [
            c["parameters"]
            for c in task["config"]
            if c["type"] == "widget" and c["parameters"]["kind"] == "button"
        ]
        rows = defaultdict(dict)  # row top -> column -> label
        for w in widgets:
            rows[w["rect"][1]][0 if w["rect"][0] < 64 else 1] = w["label"]
        assert all(set(r) == {0, 1} for r in rows.values()), task["id"]  # no row left half-empty
        toolbar = {r[live] for r in rows.values()}
        decoys = {r[1 - live] for r in rows.values()}
        assert toolbar <= set(templated.CLICK_LABELS) and decoys <= set(templated.DECOY_LABELS)
        assert task["instruction"] in {f"Click {x}." for x in toolbar}


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
    assert len({t["generator"]["template"] for t in tasks}) == 2


def test_a_label_keeps_its_row_and_each_template_docks_in_its_own_column():
    labels = templated.CLICK_LABELS
    ts = templated.make_templates(1, "click_button", 2, labels, 128, 128)
    assert [t.cue for t in ts] == list(templated.CUES[:2])
    for t in ts:
        assert {c for c, _ in t.slots.values()} == {t.index}  # docked: one column per template
        assert len({r for _, r in t.slots.values()}) == len(labels)  # a row per label
    assert {label: r for label, (_, r) in ts[0].slots.items()} == {
        label: r for label, (_, r) in ts[1].slots.items()
    }  # the text alone fixes the row
    assert templated.make_templates(2, "click_button", 2, labels, 128, 128) != ts
    wide = templated.make_templates(1, "click_button", 3, labels, 200, 128)  # 3 columns
    assert [sorted({c for c, _ in t.slots.values()}) for t in wide] == [[0], [1], [2]]


def test_the_cue_is_global_and_differs_between_templates(templated_set):
    from envab.envs.desktop.render import THEMES
    from envab.trainer.agent import first_screenshot

    tasks, _ = templated_set
    for task in tasks:
        shot = first_screenshot(task)
        count, colour = max(shot.getcolors(maxcolors=128 * 128))
        # The template's theme is the screen's most common colour, over half of its pixels.
        assert colour == THEMES[templated.CUES[task["generator"]["template"]]]
        assert count > shot.width * shot.height // 2


@pytest.mark.parametrize("templates", [1, 3])
def test_template_counts_out_of_range_are_one_clear_error(tmp_path, templates):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "envab.envs.tasks.build",
            "--out",
            str(tmp_path),
            "--families",
            "click_button",
            "--layout",
            "templated",
            "--templates",
            str(templates),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "templates must be 2..2 on a 128px wide screen" in done.stderr
    assert not (tmp_path / "tasks.jsonl").exists()


def test_a_family_without_templates_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="type_field.*no templated layout"):
        make_task(1, "type_field", 0, layout="templated")


def test_a_shuffled_cue_keeps_the_task_and_says_nothing_of_its_column(templated_set):
    """training.sft.cue: shuffled plays each demonstration with its theme drawn at random: the
    same buttons and oracle, gates that hold, and a theme independent of the live column."""
    from envab.envs.tasks.build import cue_shuffled
    from envab.trainer import agent
    from envab.trainer.sft import demonstration

    tasks, solutions = templated_set
    tools = agent.tool_set("click")
    pairs = defaultdict(int)  # (template, theme shown)
    for task, solution in zip(tasks, solutions, strict=True):
        shuffled = cue_shuffled(task)
        assert cue_shuffled(task) == shuffled  # seeded by the task id
        window = next(e for e in shuffled["config"] if e["type"] == "window")
        theme = window["parameters"]["theme"]
        pairs[task["generator"]["template"], theme] += 1
        widgets = [e for e in shuffled["config"] if e["type"] == "widget"]
        assert widgets == [e for e in task["config"] if e["type"] == "widget"]
        if theme != templated.CUES[task["generator"]["template"]]:
            assert shuffled["evaluator"] != task["evaluator"]  # the gates follow the screen
        # The environment accepts it (its gates hold) and the oracle still solves it.
        demo = demonstration(shuffled, solution["oracle"], tools, LocalBackend())
        assert demo[-1]["tool_calls"][0]["function"]["name"] == "done"
    # Every template is shown under every theme: the theme no longer tells the column.
    assert set(pairs) == {(i, cue) for i in range(2) for cue in templated.CUES[:2]}, dict(pairs)


def test_only_a_templated_task_has_a_cue_to_shuffle():
    from envab.envs.tasks.build import cue_shuffled
    from envab.trainer import agent
    from envab.trainer.guards import GuardError, HeldoutGuard
    from envab.trainer.sft import demonstrations

    task, solution = make_task(1, "click_button", 0)  # the seeded layout
    with pytest.raises(ValueError, match="only a templated task has a screen cue"):
        cue_shuffled(task)
    # The warm start says so in one line, naming its setting, before any demonstration is played.
    with pytest.raises(GuardError, match="training.sft.cue: shuffled: task click_button-s1-000"):
        demonstrations(
            [task],
            {task["id"]: solution},
            HeldoutGuard(frozenset()),
            agent.tool_set("click"),
            LocalBackend(),
            cue="shuffled",
        )
