"""Every verdict the outcome prints, shown flipping on the input that should flip it, where no
other test did: the primary endpoint on time to target (faster, slower, no difference, every pair
alike), a slowdown inside the smallest effect, the speed endpoint of an answer given no blocks,
the line over the timed controls, the warm start's rule, a replay with nothing to replay, a
run's reward consistency, a control not run, determinism not judged, a secondary test's
significance and the run table's confirmation column. Each case is the real function on the
smallest input that decides it; the same functions run in the real workflow's tests
(test_answer, test_timing, test_replay)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from test_controls import PREREG as CONTROLS_PREREG
from test_controls import RATES as CONTROL_RATES
from test_controls import run as controls_run
from test_outcome import PREREG, confirmed_load, load, timing_execution

from envab.analysis import controls, trace_replay
from envab.analysis.blocks import blocked_ratio
from envab.analysis.controls import judge
from envab.analysis.outcome import compute_outcome, render_markdown
from envab.analysis.reward_consistency import consistency
from envab.analysis.statistics import NO_SPREAD, t_test_of_zero
from envab.analysis.survival import SeedTime, paired_t
from envab.eval.replay import summary
from envab.preregistration import ConfirmationProtocol, Control, PrimaryEndpoint

RATES = [0.4, 0.45, 0.6]  # every run crosses 0.5 at its third look (96 valid trajectories)
BOUND = {"rule": "lower_bound", "confidence": 0.95}  # the shipped target's crossing rule
# PREREG with a confirmation registered: a crossing counts only where confirm.json confirmed it
CONFIRMING = SimpleNamespace(
    **vars(PREREG), confirmation=ConfirmationProtocol(0.05, 0.05, 0.8, 1000)
)


def _seconds(arm: str, seed: int, case: str) -> float:
    """Seconds per valid trajectory of `arm`'s run `seed`: the baseline (restore) varies by
    seed; the candidate (drums) is faster, slower, the same up to noise, or exactly half."""
    base = 2.0 + 0.1 * seed
    if arm == "restore":
        return 2.0 if case in ("constant", "identical") else base
    return {
        "faster": 1.0 + 0.2 * seed,
        "slower": 3.0 + 0.2 * seed,
        # 10 % either way by seed: the log ratios cancel, nothing to find
        "same": base * (1.1 if seed % 2 else 1 / 1.1),
        # every pair in exactly the same ratio, no spread: the t test's limit decides
        "constant": 1.0,
        "identical": 2.0,
    }[case]


@pytest.mark.parametrize(
    ("case", "verdict"),
    [
        ("faster", "drums faster"),
        ("slower", "drums slower"),
        ("same", "no difference shown at alpha 0.05"),
        ("constant", "drums faster"),  # every pair exactly half: p 0, as the blocks say
        ("identical", "no difference shown at alpha 0.05"),  # every pair exactly 1: p 1
    ],
)
def test_the_primary_on_time_to_target_says_each_verdict_on_its_input(tmp_path, case, verdict):
    runs = [
        load(tmp_path, arm, s, RATES, _seconds(arm, s, case))
        for arm in ("restore", "drums")
        for s in (1, 2, 3, 4)
    ]
    outcome = compute_outcome(runs, PREREG)
    (primary,) = outcome["primary"]
    assert primary["endpoint"] == "paired_time_ratio:wall_clock_s"
    assert primary["verdict"] == verdict, primary
    assert f"**drums vs restore: {verdict}.**" in render_markdown(outcome)
    alike = case in ("constant", "identical")
    (line,) = [
        x for x in render_markdown(outcome).splitlines() if f"**drums vs restore: {verdict}.**" in x
    ]
    assert (NO_SPREAD in line) == alike, line


def test_one_rule_where_every_value_is_the_same_for_seeds_blocks_and_one_sided_tests():
    # the time-to-target t test and the blocks' take the t test's limit alike
    seeds = [SeedTime(s, True, 10.0) for s in (1, 2, 3)]  # the same times: exactly alike
    halved = [SeedTime(r.seed, True, r.time / 2) for r in seeds]
    alike = [paired_t(seeds, halved, 100)["p_value"], blocked_ratio([math.log(0.5)] * 3, 0.05)]
    assert alike[0] == alike[1]["p_value"] == 0.0
    assert paired_t(seeds, seeds, 100)["p_value"] == blocked_ratio([0.0] * 3, 0.05)["p_value"] == 1
    assert t_test_of_zero([0.0] * 3)["no_spread"] == NO_SPREAD
    assert t_test_of_zero([0.1, 0.2, 0.3])["no_spread"] is None
    # one-sided, as the handicap control asks: a constant gap the wrong way is no evidence
    assert t_test_of_zero([-1.0] * 3, alternative="greater")["p_value"] == 1.0
    assert t_test_of_zero([1.0] * 3, alternative="greater")["p_value"] == 0.0


@pytest.mark.parametrize(
    ("slowdown", "verdict"),
    [
        (1.1, "slower, not shown beyond the smallest effect of interest (0.8)"),
        (1.4, "slower, beyond the smallest effect of interest (0.8)"),
    ],
)
def test_a_slowdown_is_beyond_the_smallest_effect_only_past_its_inverse(slowdown, verdict):
    # eight blocks, 0.5 % apart: a precise ratio, so only where it lies decides the words
    logs = [math.log(slowdown) + d for d in (-0.005, 0.005) * 4]
    assert blocked_ratio(logs, 0.05, 0.8)["verdict"] == verdict


def _speed_prereg(controls=()):
    return SimpleNamespace(
        **vars(PREREG),
        primary=PrimaryEndpoint("seconds_per_valid_trajectory", 0.05, 0.8),
        timed_controls=tuple(controls),
        timing=SimpleNamespace(aa_rule="within_smallest_effect"),
    )


def _blocks(control_factor: float | None = None) -> list[dict]:
    """Eight blocks with drums at half restore's seconds (a little noise between them), and a
    drums A/A window `control_factor` times drums' where given."""
    noise = [1.01, 0.98, 1.02, 0.99, 1.0, 1.03, 0.97, 1.0]
    executions = []
    for k, n in enumerate(noise):
        execution = timing_execution(k, drums_s=2.5 * n, restore_s=5.0)
        if control_factor is not None:
            window = dict(execution["windows"]["drums"])
            window["wall_clock_s"] = 2.5 * n * control_factor * (1 + 0.01 * (k % 3 - 1))
            execution["windows"]["drums-ctl"] = window
        executions.append(execution)
    return executions


def test_the_speed_endpoint_is_not_measured_without_blocks_and_judged_with_them(tmp_path):
    runs = [load(tmp_path, arm, 1, RATES, 2.0) for arm in ("restore", "drums")]
    prereg = _speed_prereg()
    (unmeasured,) = compute_outcome(runs, prereg)["primary"]
    assert unmeasured["verdict"] == (
        "not measured here: the timing blocks are the whole registration's answer"
    )
    (measured,) = compute_outcome(runs, prereg, timing=_blocks())["primary"]
    assert measured["verdict"] == "faster, beyond the smallest effect of interest (0.8)"


@pytest.mark.parametrize(
    ("factor", "line"),
    [
        (1.0, "- Controls timed in the same blocks, judged by this endpoint: all as expected "
         "(drums-ctl)."),
        (1.3, "- Controls timed in the same blocks, judged by this endpoint: **drums-ctl NOT as "
         "expected**: the blocks' speed verdict is not backed by its controls."),
    ],
)  # fmt: skip
def test_the_outcome_says_whether_its_timed_controls_back_its_speed(tmp_path, factor, line):
    # an A/A of drums: within 0.8 to 1.25 of drums where it is drums; 30 % slower, it is not
    runs = [load(tmp_path, arm, 1, RATES, 2.0) for arm in ("restore", "drums")]
    prereg = _speed_prereg([Control(name="ctl", arm="drums", expect="same")])
    outcome = compute_outcome(runs, prereg, timing=_blocks(factor))
    assert line in render_markdown(outcome).splitlines()


@pytest.mark.parametrize(
    ("warm", "words"),
    [
        (0.4, "**Warm start.** Held-out success 0.400, below the bar of 0.5: reaching the "
         "target takes learning."),
        (0.5, "**Uninformative: the warm start already meets the target.** Its held-out "
         "success is 0.500 against the bar of 0.5"),
    ],
)  # fmt: skip
def test_a_warm_start_at_the_bar_makes_the_outcome_uninformative(tmp_path, warm, words):
    # crossed by a confidence bound, as the shipped target is: 0.5 of 40 tasks does not cross
    target = SimpleNamespace(**{**vars(PREREG.target), "crossing": BOUND})
    prereg = SimpleNamespace(**{**vars(PREREG), "target": target})
    runs = [load(tmp_path, arm, 1, [warm, *RATES], 2.0, start=0) for arm in ("restore", "drums")]
    outcome = compute_outcome(runs, prereg)
    assert outcome["warm_start"]["uninformative"] == (warm >= 0.5)
    assert words in render_markdown(outcome)


def test_a_run_that_crosses_at_its_warm_start_look_still_gets_an_outcome(tmp_path):
    runs = [load(tmp_path, arm, 1, [0.6, *RATES], 2.0, start=0) for arm in ("restore", "drums")]
    outcome = compute_outcome(runs, PREREG)  # first_crossing: crossed at 0 valid trajectories
    assert outcome["warm_start"]["uninformative"]
    (primary,) = outcome["primary"]  # no time to take a ratio of: said, not a crash
    assert primary["verdict"].startswith("not tested: "), primary
    assert "Uninformative: the warm start already meets the target" in render_markdown(outcome)


def _replayed(arm: str, seed: int, result: dict) -> SimpleNamespace:
    return SimpleNamespace(arm=arm, seed=seed, replay=result)


def test_a_run_with_nothing_to_replay_makes_the_section_not_replayed_never_same():
    arms = ["restore", "drums"]
    same = {
        "task_id": "t1",
        "recorded": {"verdict": "valid", "score": 1.0},
        "replays": {arm: {"verdict": "valid", "failed_gates": [], "score": 1.0} for arm in arms},
        "as_recorded": dict.fromkeys(arms, True),
        "arms_agree": True,
    }
    played = summary([same], arms)
    nothing = summary([], arms)
    assert (played["verdict"], nothing["verdict"]) == (
        "same",
        "not replayed: no attempt logged its actions",
    )
    both = [_replayed("restore", 1, played), _replayed("drums", 1, played)]
    assert trace_replay.section(both)["verdict"] == "same"
    one_empty = [_replayed("restore", 1, played), _replayed("drums", 1, nothing)]
    section = trace_replay.section(one_empty)
    assert section["verdict"] == "not replayed"
    assert trace_replay.predicate(section) != trace_replay.predicate(trace_replay.section(both))


def test_a_runs_rewards_are_consistent_until_one_repeat_of_the_same_actions_disagrees():
    def attempt(reward):
        return {"verdict": "valid", "task_id": "t1", "actions_sha256": "a" * 64, "reward": reward}

    assert consistency([attempt(1.0), attempt(1.0)])["verdict"] == "consistent"
    flipped = consistency([attempt(1.0), attempt(0.0)])
    assert (flipped["verdict"], flipped["disagreeing_groups"]) == ("disagreement", 1)


def test_a_control_with_no_seed_on_both_arms_is_not_run_and_one_seed_judges_it(tmp_path):
    aa = Control("aa", "drums", "same")
    base = controls_run(tmp_path / "a", "drums", CONTROL_RATES, 1.0)
    same = controls_run(tmp_path / "b", "drums-aa", CONTROL_RATES, 1.0)
    missing = judge(aa, [base], [], CONTROLS_PREREG)
    assert (missing["verdict"], missing["reason"]) == ("not run", "no seed ran on both arms")
    assert "| **not run** |" in controls.render_markdown([missing])
    assert judge(aa, [base], [same], CONTROLS_PREREG)["verdict"] == "as expected"


@pytest.mark.parametrize(
    ("seeds", "verdict"),
    [
        ([], "not judged"),  # no A/A compared step digests: the registered rules, unjudged
        ([{"seed": 1, "divergence": {"verdict": "never"}}], "as expected"),
        ([{"seed": 1, "divergence": {"verdict": "diverged", "step": 3}}], "NOT as expected"),
    ],
)
def test_registered_determinism_is_judged_only_where_an_a_a_compared_its_steps(seeds, verdict):
    prereg = SimpleNamespace(determinism="expected")
    judged = controls.determinism(prereg, [{"name": "aa", "seeds": seeds}])
    assert judged["verdict"] == verdict
    assert f"| **{verdict}** |" in controls.render_markdown([], judged)


@pytest.mark.parametrize(("case", "significant"), [("faster", True), ("same", False)])
def test_a_secondary_test_is_significant_only_where_holms_rule_says_so(tmp_path, case, significant):
    runs = [
        load(tmp_path, arm, s, RATES, _seconds(arm, s, case))
        for arm in ("restore", "drums")
        for s in (1, 2, 3, 4, 5, 6)
    ]
    outcome = compute_outcome(runs, PREREG)
    (logrank,) = [f for f in outcome["secondary"] if f["endpoint"] == "logrank:wall_clock_s"]
    assert logrank["significant"] is significant, logrank
    (line,) = [x for x in render_markdown(outcome).splitlines() if "logrank:wall_clock_s" in x]
    assert ("(significant)" in line) is significant, line


def test_the_run_tables_confirmation_column_says_not_registered_or_the_verdict(tmp_path):
    plain = [load(tmp_path / "p", arm, 1, RATES, 2.0) for arm in ("restore", "drums")]
    assert "| not registered |" in render_markdown(compute_outcome(plain, PREREG))
    prereg = CONFIRMING
    confirmed = [
        confirmed_load(tmp_path / "c", arm, 1, RATES, 2.0, "confirmed", "ckpt-003")
        for arm in ("restore", "drums")
    ]
    text = render_markdown(compute_outcome(confirmed, prereg))
    assert "| not registered |" not in text and "| confirmed: " in text


def test_a_registered_confirmation_with_no_record_is_never_called_not_registered(tmp_path):
    prereg = CONFIRMING
    runs = [load(tmp_path, arm, 1, RATES, 2.0) for arm in ("restore", "drums")]
    text = render_markdown(compute_outcome(runs, prereg))
    assert "(crossed at ckpt-003: no confirmatory evaluation)" in text
    assert "| not registered |" not in text
    assert "| no confirmatory evaluation |" in text  # the confirmation column says it too
