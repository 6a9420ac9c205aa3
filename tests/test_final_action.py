"""OSWorld scores some verdicts from the agent's last action, not from the desktop's state: an
infeasible task (`func: infeasible`) scores 1 when the agent answered FAIL and 0 otherwise, and a
feasible task whose agent answered FAIL scores 0 whatever its metric says. The X desktop's
checker carries that rule (envs/xdesktop/evaluate.py, `by_final_action`) and the host applies it
before any checker runs, through the same gates as every verdict. Shown on a real host with the
Pillow desktop's worker processes, its checker given the rule as the X desktop's has it."""

from __future__ import annotations

import copy

import pytest

from envab.envs.host.pool import HostConfig, Pool
from envab.envs.tasks.build import build
from envab.envs.tasks.checkers import check as pillow_check
from envab.envs.xdesktop.evaluate import by_final_action
from envab.envs.xdesktop.evaluate import check as xdesktop_check

FAIL = {"action_type": "FAIL", "parameters": {}}
DONE = {"action_type": "DONE", "parameters": {}}
FEASIBLE = {"func": "compare_text_file", "result": {"type": "vm_file"}}
INFEASIBLE = {"func": "infeasible"}


@pytest.mark.parametrize(
    ("evaluator", "last", "score"),
    [
        (INFEASIBLE, "FAIL", 1.0),
        (INFEASIBLE, "DONE", 0.0),
        (INFEASIBLE, "CLICK", 0.0),
        (INFEASIBLE, None, 0.0),  # no action at all
        (FEASIBLE, "FAIL", 0.0),
        (FEASIBLE, "DONE", None),  # its metric decides
        (FEASIBLE, None, None),
    ],
)
def test_the_rule(evaluator, last, score):
    assert by_final_action(evaluator, last) == score
    assert xdesktop_check.final_action is by_final_action


@pytest.fixture(scope="module")
def host():
    tasks, solutions = build(seed=1, per_family=1)
    task = next(t for t in tasks if t["id"] == "click_button-s1-000")
    oracle = next(s for s in solutions if s["id"] == task["id"])["oracle"]
    pool = Pool(HostConfig(mode="fork", step_timeout_s=10))

    def check(evaluator, state):  # the Pillow checker, with the X desktop's last-action rule
        return pillow_check(evaluator, state)

    check.final_action = by_final_action
    pool.check = check
    pool.start()
    yield pool, task, oracle
    pool.stop()


def play(pool, task, actions) -> dict:
    env = pool.create(task)
    assert env["valid"]
    for i, action in enumerate(actions):
        assert pool.step(env["env_id"], action, i)["valid"]
    return pool.verify(env["env_id"])


def test_an_infeasible_task_scores_by_the_agents_last_action(host):
    pool, task, oracle = host
    infeasible = {**copy.deepcopy(task), "evaluator": dict(INFEASIBLE)}
    answered = play(pool, infeasible, [FAIL])
    assert (answered["valid"], answered["score"]) == (True, 1.0)
    assert answered["audit"]["final_action"] == "FAIL"
    assert play(pool, infeasible, [*oracle, DONE])["score"] == 0.0
    assert play(pool, infeasible, [])["score"] == 0.0


def test_fail_on_a_feasible_task_scores_zero_even_when_its_state_is_solved(host):
    pool, task, oracle = host
    assert play(pool, task, oracle)["score"] == 1.0  # the metric decides: solved
    failed = play(pool, task, [*oracle, FAIL])
    assert (failed["valid"], failed["score"]) == (True, 0.0)


def test_a_gate_still_decides_before_the_rule(host):
    pool, task, _ = host
    infeasible = {**copy.deepcopy(task), "evaluator": dict(INFEASIBLE)}
    env = pool.create(infeasible)
    pool.step(env["env_id"], FAIL, 5)  # a stale generation: the gate fails, the episode is invalid
    verdict = pool.verify(env["env_id"])
    assert (verdict["valid"], verdict["score"]) == (False, None)
