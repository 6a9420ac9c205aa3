"""The real X desktop (Xvfb, openbox, Mousepad, the st terminal) on the fork host's gVisor
sandboxes, against real runsc and the image the project builds (debootstrap; built once, cached
under build/xdesktop and shared by every test): one real task played by its oracle, a no-op and a
near miss, each scored by the task's own evaluator through desktop-env's getters and metrics; a
fork of a running desktop; an evaluator this desktop cannot serve. The whole task set runs in
`python bench/real_tasks.py`."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from envab.envs.host.gvisor import gvisor_problem
from envab.envs.host.pool import HostConfig, Pool
from envab.envs.tasks.osworld import load_dir
from envab.envs.xdesktop.image import ensure_desktop

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "envs" / "xdesktop" / "tasks"
TASK_ID = "xd-mousepad-type-save"


def _why_not() -> str | None:
    if gvisor_problem():
        return f"gVisor sandbox: {gvisor_problem()}"
    if shutil.which("debootstrap") is None:
        return "debootstrap not found: the X desktop's root is built with it (setup installs it)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


@pytest.fixture(scope="module")
def tasks():
    frozen = load_dir(TASKS)  # the set freezes as any OSWorld folder does
    solutions = [json.loads(line) for line in (TASKS / "solutions.jsonl").read_text().splitlines()]
    return {t.task["id"]: t.task for t in frozen.tasks}, {s["id"]: s for s in solutions}


@pytest.fixture(scope="module")
def pool():
    built = ensure_desktop(REPO / "build" / "xdesktop")
    config = HostConfig(mode="fork", sandbox="gvisor", world="xdesktop",
                        rootfs=str(built.rootfs), step_timeout_s=30)  # fmt: skip
    pool = Pool(config)
    pool.start()
    yield pool
    pool.stop()


def play(pool: Pool, env: dict, actions: list[dict]) -> dict:
    for action in actions:
        env = pool.step(env["env_id"], action, env["generation"])
        assert env["valid"], env
    return env


def screen(body: dict) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(body["screenshot_png"])))


def test_the_oracle_scores_1_and_a_noop_and_a_near_miss_score_0(pool, tasks):
    task, solution = tasks[0][TASK_ID], tasks[1][TASK_ID]
    scores = {}
    for name, actions in [("oracle", solution["oracle"]), ("no-op", []),
                          ("near miss", solution["near_misses"][1])]:  # fmt: skip
        env = pool.create(task)
        assert env["valid"], env
        first = screen(env)
        assert first.size == (1024, 768) and len(first.getcolors(2**16)) > 10  # a real screen
        end = play(pool, env, actions)
        verdict = pool.verify(env["env_id"])
        assert verdict["valid"] and verdict["audit"]["sandbox"]["runtime"] == "gvisor", verdict
        scores[name] = verdict["score"]
        if actions:  # each action moved the environment on, with its own frame
            assert end["generation"] == len(actions)
        pool.close(env["env_id"])
    assert scores == {"oracle": 1.0, "no-op": 0.0, "near miss": 0.0}


def test_a_fork_of_a_running_desktop_starts_in_its_state_then_each_copy_goes_its_way(pool, tasks):
    task = tasks[0][TASK_ID]
    typing = lambda text: {"action_type": "TYPING", "parameters": {"text": text}}  # noqa: E731
    save = {"action_type": "HOTKEY", "parameters": {"keys": ["ctrl", "s"]}}
    parent = play(pool, pool.create(task), [typing("buy ")])
    forked = pool.fork(parent["env_id"], 2)["children"]
    assert [c["state_sha256"] for c in forked] == [parent["state_sha256"]] * 2
    assert all(c["valid"] and c["generation"] == 1 for c in forked)
    play(pool, forked[0], [typing("milk"), save])
    play(pool, forked[1], [typing("silk"), save])
    scores = [pool.verify(c["env_id"])["score"] for c in forked]
    assert scores == [1.0, 0.0]
    assert pool.verify(parent["env_id"])["score"] == 0.0  # the parent typed but never saved
    for env in [parent, *forked]:
        pool.close(env["env_id"])


def test_an_evaluator_this_desktop_cannot_serve_is_verifier_unavailable(pool, tasks):
    task = json.loads(json.dumps(tasks[0][TASK_ID]))
    task["evaluator"]["result"] = {"type": "accessibility_tree"}  # no accessibility bus here
    env = pool.create(task)
    verdict = pool.verify(env["env_id"])
    assert (verdict["valid"], verdict["score"], verdict["verdict"]) == (
        False,
        None,
        "verifier_unavailable",
    )
    assert "checker_crash" in verdict["audit"]["flags"]
    pool.close(env["env_id"])
