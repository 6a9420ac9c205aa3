"""The validator and the checkers: oracle 1, no-op and near misses 0, broken checkers caught."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from envab.envs.arms import ArmError
from envab.envs.desktop import Desktop
from envab.envs.tasks import checkers
from envab.envs.tasks.build import build, make_task
from envab.envs.tasks.checkers import CheckerError, check
from envab.envs.tasks.local import LocalBackend
from envab.envs.validate import open_backend, validate
from envab.io import read_jsonl, write_jsonl

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def default_set():
    return build(seed=1, per_family=12)


def rejected(results) -> list[str]:
    return [r.id for r in results if not r.accepted]


def test_the_validator_accepts_every_default_task(default_set):
    tasks, solutions = default_set
    results = validate(LocalBackend().create, tasks, solutions)
    assert rejected(results) == []
    assert len(results) == 96
    for r in results:  # no-op, oracle and at least one near miss, all valid
        assert len(r.plays) >= 3 and all(p.valid for p in r.plays)
        assert [p.score for p in r.plays if p.name == "oracle"] == [1.0]


def test_a_checker_that_always_passes_is_rejected(default_set, monkeypatch):
    tasks, solutions = default_set
    for name in checkers.CHECKERS:
        monkeypatch.setitem(checkers.CHECKERS, name, lambda options, state, vals: True)
    results = validate(LocalBackend().create, tasks, solutions)
    assert sorted(rejected(results)) == sorted(t["id"] for t in tasks)
    assert all("noop scored 1.0, expected 0.0" in r.reasons for r in results)


def test_a_checker_blind_to_scope_is_rejected(default_set, monkeypatch):
    tasks, solutions = default_set
    monkeypatch.setattr(
        checkers,
        "out_of_scope_digest",
        lambda state, may_change: "the expected digest, whatever changed",
    )
    scope_blind = {
        t["id"]: {
            **t,
            "evaluator": {
                **t["evaluator"],
                "scope": {
                    **t["evaluator"]["scope"],
                    "unchanged_sha256": "the expected digest, whatever changed",
                },
            },
        }
        for t in tasks
    }
    results = validate(LocalBackend().create, list(scope_blind.values()), solutions)
    assert sorted(rejected(results)) == sorted(t["id"] for t in tasks)
    # The scope probe (the oracle, then one change outside the task's scope) is what catches it.
    assert all(r.reasons == ["scope_probe scored 1.0, expected 0.0"] for r in results)


def test_a_checker_that_crashes_makes_plays_invalid_not_zero(default_set, monkeypatch):
    tasks, solutions = default_set

    def crash(options, state, vals):
        raise CheckerError("cannot read the state")

    monkeypatch.setitem(checkers.CHECKERS, "values_match", crash)
    results = validate(LocalBackend().create, tasks[:3], solutions[:3])
    assert len(rejected(results)) == 3
    plays = [p for r in results for p in r.plays]
    assert {(p.valid, p.score, p.verdict) for p in plays} == {(False, None, "verifier_unavailable")}


def test_checkers_raise_when_they_cannot_run_and_never_return_zero_for_it():
    task, _ = make_task(1, "sequence3", 0)
    d = Desktop()
    d.setup(task["config"])
    state = d.state()
    assert check(task["evaluator"], state) == 0.0  # runs fine: not done yet
    with pytest.raises(CheckerError, match="unknown checker None"):
        check({k: v for k, v in task["evaluator"].items() if k != "func"}, state)
    with pytest.raises(CheckerError, match="unknown checker 'nope'"):
        check({**task["evaluator"], "func": "nope"}, state)
    with pytest.raises(CheckerError, match="missing or malformed 'scope'"):
        check({k: v for k, v in task["evaluator"].items() if k != "scope"}, state)
    gone = copy.deepcopy(state)
    named = set(task["evaluator"]["options"]["expect"])
    gone["widgets"] = [w for w in gone["widgets"] if w["id"] not in named]
    with pytest.raises(CheckerError, match="state has no widget"):
        check(task["evaluator"], gone)


def test_scope_and_fail_turn_a_reached_goal_into_zero():
    task, solution = make_task(1, "click_button", 0)
    session = LocalBackend().create(task)
    for action in solution["oracle"]:
        session.step(action)
    assert session.verify()["score"] == 1.0
    state = session.desktop.state()
    other = next(
        w for w in state["widgets"] if w["id"] not in task["evaluator"]["options"]["expect"]
    )
    other["value"] = not other["value"] if other["kind"] == "checkbox" else 3
    assert check(task["evaluator"], state) == 0.0  # something outside the scope changed
    session.step({"action_type": "FAIL", "parameters": {}})
    assert session.verify()["score"] == 0.0  # the agent gave up: no success
    session.close()


def test_local_sessions_gate_the_initial_state_and_the_generation():
    task, solution = make_task(1, "type_field", 0)
    tampered = copy.deepcopy(task)
    tampered["evaluator"]["initial_state_sha256"] = "0" * 64
    s = LocalBackend().create(tampered)
    v = s.verify()
    assert (v["valid"], v["score"], v["verdict"]) == (False, None, "state_mismatch")
    s = LocalBackend().create(task)
    assert s.observation.generation == 0 and s.observation.screenshot.size == (128, 128)
    obs = s.step(solution["oracle"][0], generation=0)
    assert obs.generation == 1 and obs.valid
    obs = s.step(solution["oracle"][1], generation=0)  # chosen from an old screenshot
    assert not obs.valid and obs.verdict == "stale_generation"
    assert s.verify()["verdict"] == "stale_generation"


def test_the_cli_exits_non_zero_naming_the_rejected_task(tmp_path):
    tasks, solutions = build(seed=1, per_family=1)
    broken = tasks[2]["id"]
    expect = tasks[2]["evaluator"]["options"]["expect"]
    wid = next(iter(expect))
    expect[wid] = "something the oracle never types"
    write_jsonl(tmp_path / "tasks.jsonl", tasks)
    write_jsonl(tmp_path / "solutions.jsonl", solutions)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "envab.envs.validate",
            "--tasks",
            str(tmp_path / "tasks.jsonl"),
            "--solutions",
            str(tmp_path / "solutions.jsonl"),
            "--report",
            str(tmp_path / "r.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"rejected {broken}: oracle scored 0.0, expected 1.0"]
    assert "7/8 tasks accepted" in done.stdout
    assert (tmp_path / "r.json").exists()
    assert list(read_jsonl(tmp_path / "solutions.jsonl")) == solutions


def test_the_validator_runs_over_the_real_embedded_host(tmp_path):
    tasks, solutions = build(seed=1, per_family=1)
    tasks[0] = copy.deepcopy(tasks[0])
    tasks[0]["evaluator"]["initial_state_sha256"] = "f" * 64  # a set-up that is not the task's
    host_log = tmp_path / "host.log"  # where its reasons for an env_failure would be
    with open_backend(None, "fork", host_log=str(host_log)) as backend:
        assert type(backend).__name__ == "DrumsBackend"
        results = validate(backend.create, tasks, solutions)
    assert rejected(results) == [tasks[0]["id"]], [(r.id, r.reasons) for r in results]
    assert results[0].reasons[0] == "noop was invalid (state_mismatch)"
    assert all(len(r.plays) >= 3 for r in results)
    assert host_log.stat().st_size > 0


def test_the_cli_validates_on_the_arm_its_arm_flag_names(tmp_path):
    tasks, solutions = build(seed=1, per_family=1)
    write_jsonl(tmp_path / "tasks.jsonl", tasks)
    write_jsonl(tmp_path / "solutions.jsonl", solutions)
    files = [
        "--tasks",
        str(tmp_path / "tasks.jsonl"),
        "--solutions",
        str(tmp_path / "solutions.jsonl"),
    ]

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "envab.envs.validate", *files, *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = cli(
        "--arm",
        '{"backend": "drums", "url": "embedded", "mode": "restore"}',
        "--report",
        str(tmp_path / "r.json"),
    )
    assert done.returncode == 0, done.stderr
    assert f"{len(tasks)}/{len(tasks)} tasks accepted" in done.stdout
    # A wrong arm is refused at the edge with one line, before any host starts.
    bad = cli("--arm", '{"backend": "drums", "url": "embedded"}')
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1].endswith(
        "argument --arm: arm: 'mode' is a required property"
    )
    assert (
        cli("--arm", "{backend: qemu}")
        .stderr.splitlines()[-1]
        .startswith("python -m envab.envs.validate: error: argument --arm: not JSON")
    )
    assert cli("--arm", '{"backend": "qemu"}', "--embedded", "fork").returncode == 2  # one place


def test_the_cli_flags_map_to_arms():
    with open_backend() as backend:
        assert isinstance(backend, LocalBackend)
    with (
        pytest.raises(ArmError, match="^arm: 'mode' is a required property$"),
        open_backend(url="embedded"),
    ):
        pass
