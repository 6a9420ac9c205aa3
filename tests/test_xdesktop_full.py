"""The full X desktop image (LibreOffice, Chromium, GIMP, VLC, Thunderbird) on the fork host's
gVisor sandboxes: each of its own tasks (envs/xdesktop/tasks_full, one per application, and more
scored by desktop-env's Chrome getters through the browser's debugging port and the
accessibility tree) set up, its oracle scoring 1 and its no-op 0 by the task's own evaluator.
The image is built on request only (about 400 MB of Debian packages), never by a test: without
it these skip, saying how to build it. Every task on both sandboxes, near misses and screens
compared: `python bench/real_tasks.py --image full --tasks envs/xdesktop/tasks_full --sandbox
both`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import play_on

from envab.envs.osworld.source import load_dir, select

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "envs" / "xdesktop" / "tasks_full"


def test_the_full_images_tasks_freeze_runnable_on_it_and_not_on_the_base():
    frozen = load_dir(TASKS)
    report = select(frozen, {"runnable": True}, "xdesktop", image="full").report()
    assert report["tasks"] == 10 and report["reasons"]["xdesktop"] == {}
    two = select(frozen, {"runnable": True, "domains": ["chrome"]}, "xdesktop", image="full")
    assert [t.task["id"] for t in two.tasks] == [
        "xdf-chrome-close-tab",
        "xdf-chrome-open-page",
        "xdf-chrome-switch-tab",
        "xdf-chrome-two-tabs",
    ]
    with pytest.raises(Exception, match="keeps none"):
        select(frozen, {"runnable": True}, "xdesktop")  # the base image has none of them


def _tasks():
    tasks = {t.task["id"]: t.task for t in load_dir(TASKS).tasks}
    lines = (TASKS / "solutions.jsonl").read_text().splitlines()
    return [(tasks[s["id"]], s) for s in map(json.loads, lines)]


@pytest.mark.integration
@pytest.mark.parametrize("task, solution", _tasks(), ids=lambda v: v.get("id", ""))
def test_each_application_sets_up_and_its_oracle_scores_1_and_its_noop_0(
    full_image_pool, task, solution
):
    for actions, want in ((solution["oracle"], 1.0), ([], 0.0)):
        verdict = play_on(full_image_pool, task, actions)
        assert (verdict["score"], verdict["valid"]) == (want, True), verdict
