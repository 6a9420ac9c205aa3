"""The built-in controls: a control arm changes exactly one known thing (envs/controls.py), and the
analysis judges each control against its registered verdict (analysis/controls.py), failing a
control whose checks did not find what was put there."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import SHIPPED_TARGET
from test_outcome import write_run

from envab.analysis.controls import judge, render_markdown, setups_before
from envab.analysis.runs import RunRecords
from envab.envs.arms import open_arm
from envab.envs.controls import ControlBackend
from envab.envs.tasks.build import build
from envab.envs.tasks.local import LocalBackend
from envab.preregistration import Control, Preregistration
from envab.schema import ConfigError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def task_and_oracle():
    tasks, solutions = build(seed=3, per_family=1)
    task = next(t for t in tasks if t["family"] == "click_button")
    return task, next(s for s in solutions if s["id"] == task["id"])["oracle"]


def solved(session, oracle):
    for action in oracle:
        session.step(action)
    return session.verify()


def test_flipped_rewards_keep_a_valid_verdict_and_every_gate(task_and_oracle):
    task, oracle = task_and_oracle
    backend = ControlBackend(LocalBackend(), {"flip_rewards": 1.0})
    with backend.create(task) as session:
        v = solved(session, oracle)
    assert (v.valid, v.verdict, v.failed_gates, v.score) == (True, "valid", (), 0.0)
    assert backend.flips == 1


def test_flips_are_a_seeded_fraction_of_valid_verifications(task_and_oracle):
    task, oracle = task_and_oracle

    def scores(seed):
        backend = ControlBackend(LocalBackend(), {"flip_rewards": 0.25, "seed": seed})
        out = []
        for _ in range(200):
            with backend.create(task) as session:
                out.append(solved(session, oracle).score)
        return out

    first = scores(0)
    assert first == scores(0)  # the same episodes flip on a rerun
    assert first != scores(1)
    assert 30 <= first.count(0.0) <= 70  # 0.25 of 200, within about 3 standard deviations


def test_the_handicap_waits_once_per_create_and_changes_nothing_else(task_and_oracle):
    task, oracle = task_and_oracle
    waits = []
    backend = ControlBackend(LocalBackend(), {"reset_delay_s": 0.5}, sleep=waits.append)
    plain = LocalBackend().create(task)
    with backend.create(task) as session:
        assert session.observation.state_sha256 == plain.observation.state_sha256
        v = solved(session, oracle)
    assert waits == [0.5] and backend.delays == 1
    assert (v.valid, v.score) == (True, 1.0)


def test_a_control_arm_opens_wrapped_and_its_forks_are_corrupted_too(task_and_oracle):
    """Through open_arm and the embedded Drums host on loopback: a fork arm stays a fork arm."""
    task, oracle = task_and_oracle
    arm = {"backend": "drums", "url": "embedded", "mode": "fork", "control": {"flip_rewards": 1}}
    with open_arm(arm) as backend:
        assert isinstance(backend, ControlBackend) and backend.can_fork
        with backend.create(task) as parent:
            children = parent.fork(2)
        scores = []
        for child in children:
            with child:
                scores.append(solved(child, oracle).score)
    assert scores == [0.0, 0.0] and backend.flips == 2


def test_set_ups_are_counted_per_fork_group_or_per_attempt():
    forked = [{"fork_parent": f"p{i // 8}"} for i in range(32)]
    assert setups_before(forked, 32) == 4
    assert setups_before(forked, 12) == 2  # the second group has begun
    assert setups_before([{"fork_parent": None}] * 5, 5) == 5


# -- judging ------------------------------------------------------------------------------------

PREREG = SimpleNamespace(
    threshold=0.5,
    target=SimpleNamespace(crossing={"rule": "first_crossing"}),
    equivalence=SimpleNamespace(
        margin=lambda threshold: 0.1, bootstrap_samples=300, confidence=0.95
    ),
)
STEPS = [{"step": s, "rewards": f"r{s}", "prompt_ids": f"p{s}"} for s in range(1, 5)]


def run(tmp_path, arm, rates, seconds_per_valid, steps=STEPS, groups_of=8) -> RunRecords:
    files = write_run(tmp_path, arm, 1, rates, seconds_per_valid, steps=steps)
    attempts = 32 * len(rates) + len(rates)
    trajectories = [{"fork_parent": f"p{i // groups_of}"} for i in range(attempts)]
    return RunRecords(
        **{
            **RunRecords.load(**files).__dict__,
            "trajectories": trajectories,
        }
    )


RATES = [0.25, 0.5, 0.75]


def test_an_a_a_control_passes_only_with_no_divergence_and_equivalent_curves(tmp_path):
    aa = Control("aa", "drums", "same")
    base = run(tmp_path / "a", "drums", RATES, 1.0)
    same = run(tmp_path / "b", "drums-aa", RATES, 1.1)
    assert judge(aa, [base], [same], PREREG)["verdict"] == "as expected"
    parted = copy.deepcopy(STEPS)
    parted[2]["rewards"] = "other"
    diverged = run(tmp_path / "c", "drums-aa", RATES, 1.0, steps=parted)
    result = judge(aa, [base], [diverged], PREREG)
    assert result["verdict"] == "NOT as expected"
    assert result["seeds"][0]["divergence"]["step"] == 3
    apart = run(tmp_path / "d", "drums-aa", [0.25, 0.1, 0.1], 1.0)
    assert judge(aa, [base], [apart], PREREG)["curves"]["verdict"] != "equivalent"
    assert judge(aa, [base], [apart], PREREG)["verdict"] == "NOT as expected"


def test_the_handicap_is_recovered_only_when_the_added_time_is_the_predicted_one(tmp_path):
    """Base: 1 s per valid trajectory; it reaches 0.5 at the second checkpoint (64 valid, 2
    invalid: 66 attempts in groups of 8, so 9 set-ups). A delay of 2 s per set-up adds 18 s."""
    slower = Control("handicap", "drums", "slower", reset_delay_s=2.0)
    base = run(tmp_path / "a", "drums", RATES, 1.0)
    # 64 s + 18 s = 82 s at 64 valid trajectories: 82 / 64 s per valid trajectory
    handicapped = run(tmp_path / "b", "drums-handicap", RATES, 82 / 64)
    result = judge(slower, [base], [handicapped], PREREG)
    timing = result["seeds"][0]["timing"]
    assert (timing["setups"], timing["predicted_added_s"]) == (9, 18.0)
    assert timing["added_s"] == pytest.approx(18.0)
    assert result["verdict"] == "as expected"
    unchanged = run(tmp_path / "c", "drums-handicap", RATES, 1.0)
    assert judge(slower, [base], [unchanged], PREREG)["verdict"] == "NOT as expected"


def test_a_handicap_timed_in_the_blocks_has_its_run_time_shown_not_judged_where_registered(
    tmp_path,
):
    """`timing.handicap_run_time: shown` (a registration whose blocks time the handicap): a
    handicap run that added nothing is no longer failed by its run's added time (the blocks
    judge its speed), and still fails where it diverged; `judged`, or a handicap the blocks do
    not time, keeps the run-level check."""
    from envab.preregistration import TimingRule

    slower = Control("handicap", "drums", "slower", reset_delay_s=2.0)
    base = run(tmp_path / "a", "drums", RATES, 1.0)
    unchanged = run(tmp_path / "b", "drums-handicap", RATES, 1.0)

    def registered(rule, timed=("drums-handicap",)):
        timing = TimingRule(
            blocks=8, order_seed=1, window_valid_trajectories=64, max_outside_load=0.5,
            max_load_difference=0.1, max_steal=0.05, max_reruns=2, aa_rule="covers_one",
            handicap_run_time=rule, controls=timed,
        )  # fmt: skip
        return SimpleNamespace(**vars(PREREG), timing=timing)

    shown = judge(slower, [base], [unchanged], registered("shown"))
    assert (shown["added_time"], shown["verdict"]) == ("shown", "as expected")
    assert "not recovered: shown, not judged" in render_markdown([shown])
    assert "added time shown (the blocks judge speed)" in render_markdown([shown])
    judged = judge(slower, [base], [unchanged], registered("judged"))
    assert (judged["added_time"], judged["verdict"]) == ("judged", "NOT as expected")
    untimed = judge(slower, [base], [unchanged], registered("shown", timed=()))
    assert untimed["verdict"] == "NOT as expected"
    parted = copy.deepcopy(STEPS)
    parted[1]["rewards"] = "other"
    diverged = run(tmp_path / "c", "drums-handicap", RATES, 1.0, steps=parted)
    assert judge(slower, [base], [diverged], registered("shown"))["verdict"] == "NOT as expected"


def test_a_corruption_control_passes_only_when_every_seed_diverges(tmp_path):
    corrupt = Control("corruption", "drums", "differ", flip_rewards=0.25)
    base = run(tmp_path / "a", "drums", RATES, 1.0)
    parted = copy.deepcopy(STEPS)
    parted[0]["rewards"] = "flipped"
    flipped = run(tmp_path / "b", "drums-corruption", RATES, 1.0, steps=parted)
    result = judge(corrupt, [base], [flipped], PREREG)
    assert result["verdict"] == "as expected"
    assert "diverged at step 1" in render_markdown([result])
    missed = run(tmp_path / "c", "drums-corruption", RATES, 1.0)
    assert judge(corrupt, [base], [missed], PREREG)["verdict"] == "NOT as expected"


def test_a_control_on_its_own_budget_is_judged_over_what_both_runs_have(tmp_path):
    """A control registered with fewer valid trajectories than the A/B stops at its first
    checkpoint (32 valid, 1 invalid: 33 attempts, 5 set-ups of 8) before the base run's crossing
    at the second: its divergence is compared over the steps both ran, and a handicap's added time
    at its own last checkpoint (2 s x 5 set-ups = 10 s)."""
    base = run(tmp_path / "a", "drums", RATES, 1.0)
    slower = Control("handicap", "drums", "slower", reset_delay_s=2.0, max_valid_trajectories=32)
    short = run(tmp_path / "b", "drums-handicap", RATES[:1], 42 / 32, steps=STEPS[:1])
    result = judge(slower, [base], [short], PREREG)
    timing = result["seeds"][0]["timing"]
    assert (timing["checkpoint"], timing["judged_at"]) == ("ckpt-001", "control_last")
    assert (timing["setups"], timing["predicted_added_s"]) == (5, 10.0)
    assert timing["added_s"] == pytest.approx(10.0)
    divergence = result["seeds"][0]["divergence"]
    assert divergence["verdict"] == "never" and divergence["steps_compared"] == 1
    assert divergence["steps_only_in"]["baseline"] == len(STEPS) - 1
    assert result["verdict"] == "as expected"
    table = render_markdown([result])
    assert "at ckpt-001 (the control's last)" in table and "32 valid trajectories" in table
    unchanged = run(tmp_path / "c", "drums-handicap", RATES[:1], 1.0, steps=STEPS[:1])
    assert judge(slower, [base], [unchanged], PREREG)["verdict"] == "NOT as expected"
    # The A/A and the corruption on the same short budget: a replay over its one step, and a
    # divergence at step 1.
    aa = Control("aa", "drums", "same", max_valid_trajectories=32)
    replay = run(tmp_path / "d", "drums-aa", RATES[:1], 1.0, steps=STEPS[:1])
    assert judge(aa, [base], [replay], PREREG)["verdict"] == "as expected"
    parted = [{**STEPS[0], "rewards": "flipped"}]
    flipped = run(tmp_path / "e", "drums-corruption", RATES[:1], 1.0, steps=parted)
    corrupt = Control("corruption", "drums", "differ", flip_rewards=0.25, max_valid_trajectories=32)
    assert judge(corrupt, [base], [flipped], PREREG)["verdict"] == "as expected"
    missed = run(tmp_path / "f", "drums-corruption", RATES[:1], 1.0, steps=STEPS[:1])
    assert judge(corrupt, [base], [missed], PREREG)["verdict"] == "NOT as expected"


def test_a_control_trains_to_its_own_budget_and_every_other_run_to_the_a_bs(tmp_path):
    interval = yaml.safe_load(SHIPPED_TARGET.read_text())["evaluation"]["checkpoint_interval"]
    controls = [
        {"name": "aa", "arm": "drums", "expect": "same", "max_valid_trajectories": interval},
        {"name": "corruption", "arm": "drums", "expect": "differ", "flip_rewards": 0.1},
    ]
    prereg = Preregistration.load(registered(tmp_path, controls))
    assert prereg.budget_for("drums-aa").max_valid_trajectories == interval
    assert prereg.budget_for("drums-aa").max_wall_clock_s == prereg.budget.max_wall_clock_s
    # a control never stops at target (budget.stop_at_target is the A/B's): it is judged over
    # the steps it has, so it runs its own budget whole
    assert prereg.budget.stop_at_target
    assert prereg.budget_for("drums-corruption") == replace(prereg.budget, stop_at_target=False)
    assert not prereg.budget_for("drums-aa").stop_at_target
    assert prereg.budget_for("drums") == prereg.budget


# -- registration -------------------------------------------------------------------------------


def registered(tmp_path, controls, equivalence=True, budget=None, timed=()) -> Path:
    """The shipped target with these controls (`timed` of them in the timing blocks), an
    equivalence reference below its threshold and (where given) this budget."""
    target = yaml.safe_load(SHIPPED_TARGET.read_text())
    target["controls"] = controls
    target["timing"]["controls"] = list(timed)
    start = target["target"]["threshold"] / 2
    target["equivalence"] = {"reference_start": start, "margin_fraction": 0.5}
    target["budget"].update(budget or {})
    if not equivalence:
        del target["equivalence"]
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(target))
    return path


@pytest.mark.parametrize(
    ("controls", "equivalence", "message"),
    [
        ([{"name": "aa", "arm": "nope", "expect": "same"}], True, "arm 'nope' is not one of"),
        ([{"name": "h", "arm": "drums", "expect": "slower"}], True, "takes reset_delay_s"),
        (
            [{"name": "aa", "arm": "drums", "expect": "same", "flip_rewards": 0.5}],
            True,
            "takes no change, got flip_rewards",
        ),
        ([{"name": "aa", "arm": "drums", "expect": "same"}] * 2, True, "two controls run as"),
        ([{"name": "aa", "arm": "drums", "expect": "same"}], False, "register one"),
        (
            [{"name": "aa", "arm": "drums", "expect": "same", "max_valid_trajectories": 100}],
            True,
            "must be a multiple of evaluation.checkpoint_interval",
        ),
        (
            [{"name": "aa", "arm": "drums", "expect": "same", "max_valid_trajectories": 2**20}],
            True,
            "no larger than budget.max_valid_trajectories",
        ),
    ],
)
def test_a_control_that_cannot_test_what_it_expects_is_refused(
    tmp_path, controls, equivalence, message
):
    with pytest.raises(ConfigError, match=message):
        Preregistration.load(registered(tmp_path, controls, equivalence))


AA_BOTH = [
    {"name": "aa", "arm": "drums", "expect": "same"},
    {"name": "aa", "arm": "qemu", "expect": "same"},
    {"name": "handicap", "arm": "drums", "expect": "slower", "reset_delay_s": 0.16},
    {"name": "corruption", "arm": "drums", "expect": "differ", "flip_rewards": 0.1},
]


def test_timed_controls_join_every_block_after_the_arms(tmp_path):
    timed = ["drums-aa", "qemu-aa", "drums-handicap"]
    prereg = Preregistration.load(registered(tmp_path, AA_BOTH, timed=timed))
    # an A/A on each arm: one name, two runs
    assert [c.run_arm for c in prereg.timed_controls] == timed
    assert prereg.timed_arms == ("qemu", "drums", *timed)
    untimed = Preregistration.load(registered(tmp_path, AA_BOTH))
    assert untimed.timed_controls == () and untimed.timed_arms == ("qemu", "drums")


def test_in_a_timing_window_every_run_a_controls_too_trains_the_window(tmp_path):
    own = {"max_valid_trajectories": 256}  # one look, as the shipped controls
    prereg = Preregistration.load(
        registered(tmp_path, [{**c, **own} for c in AA_BOTH], timed=["qemu-aa"])
    )
    assert prereg.budget_for("qemu-aa").max_valid_trajectories == own["max_valid_trajectories"]
    window = prereg.timing_window(64)
    # a control's own budget would have its window train 256 where the arms' train 64: the
    # block would time unequal work (embedded-default-v13's first execution did)
    for run in ("qemu", "drums", "qemu-aa", "drums-handicap"):
        budget = window.budget_for(run)
        assert (budget.max_valid_trajectories, budget.stop_at_target) == (64, False), run
    assert prereg.budget_for("qemu-aa").max_valid_trajectories == 256  # the registration's own


@pytest.mark.parametrize(
    ("timed", "message"),
    [
        (["drums-nope"], "'drums-nope' is not a registered control's runs"),
        (["aa"], "'aa' is not a registered control's runs"),  # the runs' name, not the control's
        (["drums-corruption"], "expects differ: the blocks judge speed"),
    ],
)
def test_a_timed_control_that_the_blocks_cannot_judge_is_refused(tmp_path, timed, message):
    with pytest.raises(ConfigError, match=message):
        Preregistration.load(registered(tmp_path, AA_BOTH, timed=timed))


def test_a_controls_arm_is_its_base_arm_with_the_change_and_its_price():
    c = Control("handicap", "drums", "slower", reset_delay_s=1.5, seed=3)
    base = {"backend": "drums", "url": "embedded", "mode": "fork"}
    assert c.run_arm == "drums-handicap"
    assert c.arm_config(base) == {**base, "control": {"reset_delay_s": 1.5, "seed": 3}}
    assert Control("aa", "drums", "same").arm_config(base) == base


def test_a_registered_control_prices_at_its_base_arm(tmp_path):
    prereg = Preregistration.load(
        registered(tmp_path, [{"name": "aa", "arm": "qemu", "expect": "same"}])
    )
    assert prereg.prices.host("qemu-aa") == prereg.prices.host("qemu")


def test_a_handicap_is_judged_where_the_base_run_reached_the_target_confirmed(tmp_path):
    """An unconfirmed crossing is not reached for the controls either: the handicap is then
    judged at the base run's last checkpoint, as for a base run that never crossed."""
    slower = Control("handicap", "drums", "slower", reset_delay_s=2.0)
    prereg = SimpleNamespace(**vars(PREREG), confirmation=SimpleNamespace(delta=0.1))
    base = run(tmp_path / "a", "drums", RATES, 1.0)
    handicapped = run(tmp_path / "b", "drums-handicap", RATES, 82 / 64)
    for verdict, judged_at in (("confirmed", "ckpt-002"), ("not confirmed", "ckpt-003")):
        base.confirmation = {"verdict": verdict, "checkpoint": "ckpt-002"}
        timing = judge(slower, [base], [handicapped], prereg)["seeds"][0]["timing"]
        assert timing["checkpoint"] == judged_at
        assert timing["base_reached_target"] is (verdict == "confirmed")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # 2048 valid / 8 per fork group = 256 set-ups x 5 s = 1280 s: past 1200 s alone
        ({"reset_delay_s": 5.0}, r"5 s x 256 set-ups .* = 1280 s added, 1600 s at its tolerance"),
        # 2 s fits alone (640 s at its tolerance), not beside a plain arm at 694.3 s
        (
            {"reset_delay_s": 2.0, "base_wall_clock_s": 694.3},
            r"694.3 s \(the base arm's pilot\) \+ 640 s = 1334.3 s exceeds .* 1200 s",
        ),
    ],
)
def test_a_handicap_that_cannot_fit_the_budget_is_refused_at_freeze(tmp_path, change, message):
    from envab.freeze import main as freeze_main
    from envab.freeze import setups_per_valid

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    setups = setups_per_valid(config["arms"], config["training"]["grpo"]["num_generations"])
    assert setups["drums"] == 1 / 8 and setups["qemu"] == 1.0
    fits = Preregistration.load(SHIPPED_TARGET)
    fits.check_budget_fit(setups)  # the shipped handicap fits the shipped budget
    # The budget these figures are sized against, whatever the shipped one is.
    budget = {"max_wall_clock_s": 1200, "max_valid_trajectories": 2048}
    handicap = {"name": "handicap", "arm": "drums", "expect": "slower", **change}
    path = registered(tmp_path, [handicap], budget=budget)
    with pytest.raises(ConfigError, match=message):
        Preregistration.load(path).check_budget_fit(setups)
    receipt = tmp_path / "receipts" / "preregistration.json"
    argv = ["target", str(path), "--receipt", str(receipt)]
    assert freeze_main([*argv, "--setups-per-valid", json.dumps(setups)]) == 2
    assert not receipt.exists()  # nothing frozen
