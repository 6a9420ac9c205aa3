"""What an evaluation's `postconfig` commands print reaches the checker's cache folder, where
desktop-env's `cache_file` getter reads it (OSWorld's host-side cache): the in-environment
server's own steps print, the host hands the files over, and a real checker scores them with a
real metric; names and sizes the environment sends are checked before any checker starts."""

from __future__ import annotations

import pytest

from envab.envs.channel import ChannelCorrupt, check_reply, decode, encode
from envab.envs.xdesktop import checker, evaluate, server
from envab.envs.xdesktop.checker import CheckerFailed
from tests.test_checker_sandbox import Environment, _why_not

WINDOWS = b"0x01 0 mousepad.Mousepad host notes.txt - Mousepad\n0x02 0 st.st host st\n"
# OSWorld's way: a command's output kept under a name, then read with a list metric
LISTED = {
    "postconfig": [{"type": "execute",
                    "parameters": {"command": ["wmctrl", "-lx"], "stdout": "wmctrl.out"}}],
    "func": "check_list",
    "result": {"type": "cache_file", "path": "wmctrl.out"},
    "expected": {"type": "rule", "rules": {"expect": ["mousepad\\.Mousepad.*notes\\.txt"]}},
}  # fmt: skip


def test_a_command_step_that_prints_under_a_name_keeps_what_it_printed_whatever_its_exit(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(server, "HOME", tmp_path)  # where commands run, what the state hash reads
    env = server.Environment(display=None)  # command steps need no display
    step = {"type": "execute", "parameters": {
        "command": ["sh", "-c", "echo differ; echo why >&2; exit 1"],
        "stdout": "diff.out", "stderr": "diff.err"}}  # fmt: skip
    reply = check_reply("postconfig", decode(encode(env.op_postconfig([step]))))
    assert reply["cache"] == {"diff.out": b"differ\n", "diff.err": b"why\n"}
    # without a name to print into, a command that fails still fails the set-up, named
    del step["parameters"]["stdout"], step["parameters"]["stderr"]
    with pytest.raises(server.SetupError, match="exited 1"):
        env.op_postconfig([step])
    assert env.op_postconfig([])["cache"] == {}
    with pytest.raises(ChannelCorrupt, match="cache"):  # a server that sends none is out of step
        check_reply("postconfig", {"state_sha256": "0" * 64})


needs_checker = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


@needs_checker
def test_the_checker_scores_what_the_postconfig_printed_and_nothing_else():
    env = Environment({})
    assert evaluate.evaluate(LISTED, env.http, lambda steps: {"wmctrl.out": WINDOWS}) == 1.0
    other = WINDOWS.replace(b"notes.txt", b"todo.txt")
    assert evaluate.evaluate(LISTED, env.http, lambda steps: {"wmctrl.out": other}) == 0.0
    assert env.requests == []  # read from the cache folder, not asked of the environment
    with pytest.raises(CheckerFailed) as failed:  # printed under another name: no such file
        evaluate.evaluate(LISTED, env.http, lambda steps: {"other.out": WINDOWS})
    assert failed.value.failure == "crash"


@needs_checker
def test_a_getters_file_written_beside_the_printed_ones_is_the_checkers_own():
    # desktop-env's file getters write where `cache_file` reads: the folder is the checker's uid's
    env = Environment({"/gold/wmctrl.out": WINDOWS})
    gold = {"type": "vm_file", "path": "/gold/wmctrl.out", "dest": "gold.out"}
    beside = {**LISTED, "func": "diff_text_file", "expected": gold}
    assert evaluate.evaluate(beside, env.http, lambda steps: {"wmctrl.out": WINDOWS}) == 1.0


@needs_checker
def test_what_no_getter_reads_is_not_handed_over_whatever_it_is():
    printed = {"wmctrl.out": WINDOWS, "../elsewhere": b"x", "apt.out": b"y" * checker.CACHE_BYTES}
    assert evaluate.evaluate(LISTED, Environment({}).http, lambda steps: printed) == 1.0


@pytest.mark.parametrize(
    "cache, failure",
    [
        ({"../wmctrl.out": WINDOWS}, "garbage"),
        ({"/tmp/wmctrl.out": WINDOWS}, "garbage"),
        ({".hidden": WINDOWS}, "garbage"),
        ({"wmctrl.out": "text, not bytes"}, "garbage"),
        ({f"f{i}": b"" for i in range(checker.CACHE_FILES + 1)}, "garbage"),
        (["wmctrl.out"], "garbage"),
        ({"wmctrl.out": b"x" * (checker.CACHE_BYTES + 1)}, "oversize"),
    ],
    ids=["parent", "absolute", "dotfile", "text", "too-many", "not-a-map", "oversize"],
)
def test_a_cache_the_environment_should_not_have_sent_is_a_named_failure(cache, failure):
    with pytest.raises(CheckerFailed) as failed:
        checker.cache_files(cache)
    assert failed.value.failure == failure
    with pytest.raises(CheckerFailed) as failed:  # before any checker process starts
        checker.run(LISTED, Environment({}).http, evaluate.ROUTES, cache=cache)
    assert failed.value.failure == failure


def test_the_freeze_refuses_a_cache_file_no_postconfig_step_prints():
    task = {"id": "t", "config": [], "evaluator": LISTED}
    assert not [g for g, _ in evaluate.blockers(task, "full") if g.startswith("getter:")]
    for steps in ([], [{"type": "execute", "parameters": {"command": ["ls"], "stdout": "x"}}],
                  [{"type": "execute", "parameters": {"command": ["ls"],
                                                      "stdout": "../wmctrl.out"}}]):  # fmt: skip
        bad = {**task, "evaluator": {**LISTED, "postconfig": steps}}
        assert [g for g, _ in evaluate.blockers(bad, "full") if g.startswith("getter:")] == [
            "getter:cache_file"
        ], steps
    for path in ("../wmctrl.out", ["wmctrl.out"], None):  # read from outside the folder, or not
        bad = {**task, "evaluator": {**LISTED, "result": {"type": "cache_file", "path": path}}}
        assert "getter:cache_file" in [g for g, _ in evaluate.blockers(bad, "full")], path


@pytest.mark.parametrize("params, reason", [
    ({"command": ["ls"], "stdout": ["wmctrl.out"]}, "postconfig:stdout"),
    ({"command": ["ls"], "stderr": "a/b"}, "postconfig:stderr"),
    ({"command": ["ls"], "stdout": "$bytes"}, "postconfig:stdout"),
    ({"command": ["ls"], "until": {"returncode": 0}}, "postconfig:until"),
])  # fmt: skip
def test_the_freeze_refuses_a_step_that_prints_where_no_file_can_be_or_waits_on_until(
    params, reason
):
    # "$bytes" is the channel's tag for bytes: a name the environment could not send back
    step = {"type": "execute", "parameters": params}
    task = {"id": "t", "config": [], "evaluator": {**LISTED, "postconfig": [step]}}
    assert reason in [g for g, _ in evaluate.blockers(task, "full")]
    assert evaluate.blockers({**task, "evaluator": LISTED}, "full") == []
