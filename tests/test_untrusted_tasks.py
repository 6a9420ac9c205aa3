"""A task file is untrusted: nothing it names may run code on the training host or write outside
the getters' cache there. Such a task is refused at freeze, with the task and the field named."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from envab.envs.osworld.source import TaskSourceError, load_jsonl
from envab.envs.tasks.evaluators import bare_file_name, runs_code

REPO = Path(__file__).resolve().parent.parent
TASK = next((REPO / "envs/xdesktop/tasks/examples").rglob("xd-terminal-write-file.json"))


def freeze(tmp_path, task: dict):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task) + "\n")
    return load_jsonl(path)


def with_evaluator(**changes) -> dict:
    task = copy.deepcopy(json.loads(TASK.read_text()))
    task["evaluator"].update(changes)
    return task


def test_the_shipped_task_freezes(tmp_path):
    assert len(freeze(tmp_path, json.loads(TASK.read_text())).tasks) == 1


@pytest.mark.parametrize(
    ("metric", "runs"),
    [
        ("check_gnome_favorite_apps", "eval"),  # eval() of text the environment printed
        ("check_python_file_by_test_suite", "importlib.util.spec_from_file_location"),
        ("compare_image_text", "subprocess.run"),
    ],
)
def test_a_metric_that_runs_code_on_the_host_is_refused(tmp_path, metric, runs):
    assert runs_code("metrics", metric) == runs
    with pytest.raises(
        TaskSourceError, match=rf"xd-terminal-write-file: metric '{metric}' runs code"
    ):
        freeze(tmp_path, with_evaluator(func=metric))


@pytest.mark.parametrize("dest", ["../../etc/cron.d/x", "/root/.bashrc", "..", "", "a/b.txt", 5])
def test_a_getter_dest_outside_the_cache_is_refused(tmp_path, dest):
    task = with_evaluator()
    getter = task["evaluator"]["result"]
    getter = getter[0] if isinstance(getter, list) else getter
    getter["dest"] = dest
    with pytest.raises(
        TaskSourceError, match=r"evaluator\.result.*\.dest .* is not a bare file name"
    ):
        freeze(tmp_path, task)


def test_bare_file_names():
    assert bare_file_name("plants.txt") and bare_file_name(".hidden")
    assert not any(bare_file_name(n) for n in ("x/../y", "..", "C:\\x", "a\0b", None))


@pytest.mark.parametrize(
    "screen",
    [
        {"width": 100_000, "height": 100_000},  # a display and a template the host cannot hold
        {"width": 1920.5, "height": 1080},
        {"width": "1920", "height": 1080},
        {"width": -1, "height": 1080},
        {"width": 1920},
    ],
)
def test_a_screen_size_out_of_bounds_is_refused_at_freeze_and_by_the_host(tmp_path, screen):
    from envab.envs.xdesktop.evaluate import screen_of

    task = copy.deepcopy(json.loads(TASK.read_text()))
    task["config"] = [{"type": "screen", "parameters": screen}, *task.get("config", [])]
    with pytest.raises(TaskSourceError, match=f"task {task['id']}: config: screen"):
        freeze(tmp_path, task)
    with pytest.raises(ValueError, match="not whole pixels within 64x64 to 3840x2160"):
        screen_of(task["config"])


def test_a_screen_size_within_bounds_freezes(tmp_path):
    from envab.envs.xdesktop.evaluate import screen_of

    task = copy.deepcopy(json.loads(TASK.read_text()))
    task["config"] = [{"type": "screen", "parameters": {"width": 1920, "height": 1080}}]
    assert len(freeze(tmp_path, task).tasks) == 1
    assert screen_of(task["config"]) == (1920, 1080)
