"""The session protocol's types: verdicts, gates, actions, and the never-score-0 rule."""

from __future__ import annotations

import pytest
from PIL import Image

from envab.envs.protocol import (
    GATE_VERDICT,
    Gate,
    Observation,
    Verdict,
    Verification,
    check_action,
    checked,
    is_blank,
    verdict_for,
)


def test_every_gate_maps_to_an_invalid_verdict():
    assert set(GATE_VERDICT) == set(Gate)
    assert Verdict.VALID not in GATE_VERDICT.values()
    assert verdict_for([]) == Verdict.VALID
    assert verdict_for(["step_timeout", "worker_alive"]) == Verdict.TIMEOUT  # first one decides
    # A gate a newer host reports: an environment failure, and the name survives.
    assert verdict_for(["no_such_gate", "state_hash"]) == Verdict.ENV_FAILURE
    v = Verification.invalid(["no_such_gate"])
    assert (v.valid, v.score, v.verdict, v.failed_gates) == (
        False,
        None,
        "env_failure",
        ("no_such_gate",),
    )


def test_an_invalid_verification_never_carries_a_score():
    v = Verification.invalid([Gate.STATE_HASH], env_id="e1")
    assert (v.valid, v.score, v.reward, v.verdict) == (False, None, None, "state_mismatch")
    with pytest.raises(ValueError, match="no score"):
        Verification(0.0, False, "env_failure", ("worker_alive",))
    with pytest.raises(ValueError, match="contradicts"):
        Verification(1.0, True, "timeout")
    with pytest.raises(ValueError, match="0.0 or 1.0"):
        Verification(0.5, True, "valid")


def test_verification_reads_like_the_wire_object():
    v = Verification(1.0, True, "valid", (), {"trusted": True})
    assert v["score"] == 1.0 and v["valid"] is True and v["failed_gates"] == []
    assert dict(v) == v.to_dict() and "verdict" in v and "nope" not in v
    assert Verification.from_dict(v.to_dict()) == v
    bad = Verification.from_dict(
        {
            "score": None,
            "valid": False,
            "verdict": "blank_screen",
            "failed_gates": ["screen_not_blank"],
        }
    )
    assert bad.reward is None and bad.failed_gates == ("screen_not_blank",)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("valid", "false"),  # a string's truth would make it valid
        ("valid", 1),
        ("score", "1"),
        ("score", True),
        ("verdict", ["valid"]),
        ("failed_gates", "screen_not_blank"),
        ("failed_gates", [1]),
        ("audit", "trusted"),
    ],
)
def test_an_answer_of_the_wrong_types_is_an_invalid_episode_by_name(field, value):
    answer = {"score": 1.0, "valid": True, "verdict": "valid", "failed_gates": [], "audit": {}}
    assert Verification.from_dict(answer).reward == 1.0  # the same answer, well typed
    read = Verification.from_dict({**answer, field: value})
    assert read.reward is None and not read.valid
    assert read.failed_gates == ("host_answer",) and read.verdict == "env_failure"
    assert read.audit["host_answer_types"] == [field]


def test_observation_validity_follows_its_verdict():
    Observation(3, None, False, "timeout", ("step_timeout",))
    with pytest.raises(ValueError):
        Observation(3, None, True, "timeout")


@pytest.mark.parametrize(
    ("action", "error"),
    [
        ("CLICK", "must be an object"),
        ({"action_type": "JUMP"}, "JUMP"),
        ({"action_type": "CLICK", "parameters": {"x": 1}}, "'y'"),
        ({"action_type": "CLICK", "parameters": {"x": True, "y": 1}}, "'x'"),
        ({"action_type": "TYPING", "parameters": {"text": 5}}, "'text'"),
        ({"action_type": "PRESS", "parameters": []}, "parameters must be an object"),
    ],
)
def test_malformed_actions_are_named(action, error):
    with pytest.raises(ValueError, match=error):
        check_action(action)


def test_well_formed_actions_pass_through():
    scroll = {"action_type": "SCROLL", "parameters": {"dx": 0, "dy": -2, "x": 5, "y": 6}}
    assert check_action(scroll) == scroll
    assert check_action({"action_type": "DONE"}) == {"action_type": "DONE", "parameters": {}}


def test_blank_means_a_single_colour():
    assert is_blank(Image.new("RGB", (8, 8), (0, 0, 0)))
    assert is_blank(Image.new("L", (8, 8), 255))
    img = Image.new("RGB", (8, 8))
    img.putpixel((3, 3), (0, 0, 1))
    assert not is_blank(img)


def test_the_one_checker_rule_never_scores_a_failure_zero():
    def crash(evaluator, state):
        raise KeyError("widget")

    ok = checked(lambda e, s: 1.0, {}, {}, {"env": "e1"})
    assert (ok.valid, ok.score, ok.audit["env"]) == (True, 1.0, "e1")
    for checker, failure in ((crash, "crash"), (lambda e, s: 0.5, "bad_score")):
        audit = {}
        result = checked(checker, {}, {}, audit)
        assert (result.valid, result.score, result.verdict) == (False, None, "verifier_unavailable")
        assert result.failed_gates == ("verifier_available",)
        assert audit["checker_failure"] == failure and audit["checker_error"]


def test_partial_credit_is_full_credit_or_a_valid_zero_and_the_fraction_is_kept():
    def osworld(answer):
        checker = lambda e, s: answer  # noqa: E731
        checker.partial_credit = True  # as envs/xdesktop/evaluate.py declares
        return checker

    for answer, score in ((1.0, 1.0), (1, 1.0), (0.9375, 0.0), (0.0, 0.0)):
        audit = {}
        result = checked(osworld(answer), {}, {}, audit)
        assert (result.valid, result.score, result.verdict) == (True, score, "valid")
        assert result.audit["partial_score"] == answer
    for answer in (1.5, -0.1, float("nan"), "1.0", None):
        audit = {}
        result = checked(osworld(answer), {}, {}, audit)
        assert (result.valid, result.score) == (False, None), answer
        assert audit["checker_failure"] == "bad_score" and "partial_score" not in audit
