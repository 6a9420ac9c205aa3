"""The seeded task factory: determinism, no solutions in the tasks, hashes, varied layouts."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from envab.envs.desktop import Desktop, screen_of
from envab.envs.protocol import is_blank
from envab.envs.tasks.build import build, make_task
from envab.envs.tasks.families import FAMILIES
from envab.hashing import sha256_file
from envab.io import read_jsonl

REPO = Path(__file__).resolve().parent.parent


def run_build(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envab.envs.tasks.build", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def default_set(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    done = run_build(out, "--seed", "1", "--check")
    assert done.returncode == 0, done.stderr
    assert "byte-identical" in done.stdout
    return out


def test_builds_are_byte_identical_for_a_seed_and_differ_for_another(default_set, tmp_path):
    again, other = tmp_path / "again", tmp_path / "other"
    assert run_build(again, "--seed", "1").returncode == 0
    assert run_build(other, "--seed", "2").returncode == 0
    for name in ("tasks.jsonl", "solutions.jsonl", "index.json"):
        assert (again / name).read_bytes() == (default_set / name).read_bytes(), name
    for name in ("tasks.jsonl", "solutions.jsonl"):
        assert (other / name).read_bytes() != (default_set / name).read_bytes(), name


def test_the_default_set_is_eight_families_of_twelve_with_an_honest_index(default_set):
    index = json.loads((default_set / "index.json").read_text())
    tasks = list(read_jsonl(default_set / "tasks.jsonl"))
    solutions = list(read_jsonl(default_set / "solutions.jsonl"))
    assert len(FAMILIES) >= 8
    assert index["families"] == {f: 12 for f in FAMILIES} and index["tasks"] == len(tasks) == 96
    for name in ("tasks.jsonl", "solutions.jsonl"):
        assert index["sha256"][name] == sha256_file(default_set / name)
    assert len({t["id"] for t in tasks}) == 96
    assert [s["id"] for s in solutions] == [t["id"] for t in tasks]
    assert index["near_misses"] == sum(len(s["near_misses"]) for s in solutions)
    assert all(s["near_misses"] for s in solutions)


def test_tasks_carry_no_solutions(default_set):
    text = (default_set / "tasks.jsonl").read_text()
    assert "oracle" not in text and "near_misses" not in text and "action_type" not in text


def test_initial_state_hash_is_the_hash_of_the_set_up_desktop(default_set):
    for task in read_jsonl(default_set / "tasks.jsonl"):
        d = Desktop(*screen_of(task["config"]))
        d.setup(task["config"])
        assert d.state_hash() == task["evaluator"]["initial_state_sha256"], task["id"]
        assert not is_blank(d.screenshot()), task["id"]


def test_check_fails_on_a_nondeterministic_build(tmp_path, monkeypatch, capsys):
    from envab.envs.tasks import build as build_module

    monkeypatch.setattr(build_module, "task_rng", lambda *key: random.Random())  # OS entropy
    assert build_module.main(["--per-family", "2", "--out", str(tmp_path), "--check"]) == 1
    assert "build is not deterministic: tasks.jsonl differs" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_task_depends_on_seed_family_and_index_only():
    tasks, solutions = build(seed=7, per_family=3)
    task, solution = make_task(7, "choose_list", 2)
    assert task in tasks and solution in solutions
    assert make_task(8, "choose_list", 2)[0]["config"] != task["config"]


def test_the_screen_matters_layouts_and_target_ids_vary_within_a_family(default_set):
    tasks = {t["id"]: t for t in read_jsonl(default_set / "tasks.jsonl")}
    last_click, target_ids = defaultdict(set), defaultdict(set)
    for s in read_jsonl(default_set / "solutions.jsonl"):
        task = tasks[s["id"]]
        click = [a for a in s["oracle"] if a["action_type"] == "CLICK"][-1]
        last_click[task["family"]].add((click["parameters"]["x"], click["parameters"]["y"]))
        target_ids[task["family"]].add(tuple(sorted(task["evaluator"]["options"]["expect"])))
    for family in FAMILIES:
        assert len(last_click[family]) >= 8, family  # of 12 tasks
        assert len(target_ids[family]) >= 3, family  # ids do not give the target away


def test_instructions_are_short_and_in_a_small_vocabulary(default_set):
    tasks, _ = build(seed=3, per_family=40)
    words = set()
    for t in tasks:
        assert len(t["instruction"]) <= 60, t["instruction"]
        words |= set(re.findall(r"[A-Za-z]+", t["instruction"]))
    assert len(words) <= 110, len(words)


def test_a_screen_too_small_is_one_clear_error(tmp_path):
    done = run_build(tmp_path, "--seed", "1", "--width", "96", "--height", "96")
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0
    assert "on a 96x96 screen" in done.stderr
    assert not (tmp_path / "tasks.jsonl").exists()
