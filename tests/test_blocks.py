"""The timing blocks' rules (trainer/timing.py, analysis/blocks.py): the registered order, the
load rule, and the paired speed ratio, each shown flipping on the input that should flip it."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest
from test_machine_load import kernel_counts_waits, outside_job

from envab.analysis.blocks import blocked_ratio, judge_blocks, trimmed
from envab.trainer.timing import block_order, inadmissible, measured, unequal_load


def test_pairs_of_blocks_run_abba_in_an_order_the_seed_fixes():
    order = block_order(["qemu", "drums"], 8, seed=7)
    assert order == block_order(["qemu", "drums"], 8, seed=7)  # registered: reproducible
    for first, second in zip(order[::2], order[1::2], strict=True):
        assert second == tuple(reversed(first))  # ABBA or BAAB
    # over enough seeds both orientations occur: the order is drawn, not fixed
    firsts = {block_order(["qemu", "drums"], 2, seed=s)[0] for s in range(20)}
    assert firsts == {("qemu", "drums"), ("drums", "qemu")}
    assert len(block_order(["a", "b"], 5, seed=1)) == 5


def window(**over) -> dict:
    return {
        "exit": 0,
        "valid_trajectories": 64,
        "wall_clock_s": 16.0,
        "provisioned_s": 20.0,
        "outside_load": 0.02,
        "steal_fraction": 0.0,
        **over,
    }


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({}, None),
        ({"outside_load": 0.4}, "outside load 0.40 > 0.15"),
        ({"steal_fraction": 0.2}, "steal 0.20 > 0.05"),
        ({"exit": 2}, "the run exited 2"),
        ({"valid_trajectories": 0}, "no valid trajectory in the window"),
    ],
)
def test_a_window_past_the_rule_is_named(over, why):
    assert inadmissible(window(**over), max_outside_load=0.15, max_steal=0.05) == why


def test_steady_load_beside_both_arms_is_measured_under_but_load_that_came_and_went_is_not():
    steady = {"qemu": window(outside_demand=0.30), "drums": window(outside_demand=0.26)}
    assert unequal_load(steady, max_load_difference=0.1) is None
    moved = {"qemu": window(outside_demand=0.02), "drums": window(outside_demand=0.31)}
    assert unequal_load(moved, max_load_difference=0.1) == (
        "outside demand differs by 0.29 > 0.1 (drums 0.31, qemu 0.02)"
    )


def test_demand_past_the_whole_machine_is_refused_by_any_bound_and_kept_by_none():
    # Demand passes 1 where more threads wanted a CPU than the machine has (the tests' own
    # workers beside a test's run, say): a bound of 1.0 is a bound, not "no bound". A shared
    # machine on purpose registers null.
    crowded = {"qemu": window(outside_demand=1.6), "drums": window(outside_demand=0.4)}
    assert inadmissible(crowded["qemu"], max_outside_load=1.0, max_steal=1.0) == (
        "outside demand 1.60 > 1"
    )
    assert unequal_load(crowded, max_load_difference=1.0) == (
        "outside demand differs by 1.20 > 1 (drums 0.40, qemu 1.60)"
    )
    assert inadmissible(crowded["qemu"], max_outside_load=None, max_steal=1.0) is None
    assert unequal_load(crowded, max_load_difference=None) is None
    # no bound on demand is no bound on the rest of the rule
    assert inadmissible(window(exit=1), max_outside_load=None, max_steal=1.0) == (
        "the run exited 1"
    )


def test_the_rule_judges_what_the_outside_job_wanted_not_what_the_arm_left_it():
    # v17's whole job under one steady registered load: the CPU-hungry QEMU arm left the load
    # 0.13 of the machine, drums 0.25; both arms had the same job beside them (demand 0.25)
    same_job = {
        "qemu": window(outside_load=0.13, outside_demand=0.26),
        "drums": window(outside_load=0.25, outside_demand=0.25),
    }
    assert unequal_load(same_job, max_load_difference=0.1) is None
    assert inadmissible(same_job["drums"], max_outside_load=0.2, max_steal=0.05) == (
        "outside demand 0.25 > 0.2"
    )
    # a record that measured no demand (a kernel without per-thread schedstat, or v17's) is
    # judged, as before, by the load obtained
    before = {"qemu": window(outside_load=0.13), "drums": window(outside_load=0.25)}
    assert unequal_load(before, max_load_difference=0.1) == (
        "outside load differs by 0.12 > 0.1 (drums 0.25, qemu 0.13)"
    )
    # where one window measured demand and another did not, both by the same measure
    mixed = {
        "qemu": window(outside_load=0.13),
        "drums": window(outside_load=0.25, outside_demand=0.14),
    }
    assert unequal_load(mixed, max_load_difference=0.1) == (
        "outside load differs by 0.12 > 0.1 (drums 0.25, qemu 0.13)"
    )


def test_a_measured_window_records_demand_no_less_than_the_load_obtained():
    # a real window beside a real outside job that always wants a CPU (it is not below this
    # process, so it is outside the window's run)
    kernel_counts_waits()
    pid = outside_job(busy=1.0)
    try:
        record = measured(["sleep", "1.5"], dict(os.environ), Path(os.devnull))
    finally:
        os.kill(pid, 15)
    cores = os.cpu_count() or 1
    assert record["exit"] == 0
    # the worker alone wanted one core for the whole window; the suite's other work adds to it
    assert record["outside_demand"] >= 0.85 / cores, record
    assert record["outside_demand"] >= record["outside_load"] - 1e-9, record


def test_a_clear_speedup_is_faster_beyond_the_smallest_effect():
    logs = [math.log(0.2) + d for d in (-0.05, 0.03, 0.0, 0.04, -0.02, 0.01, -0.03, 0.02)]
    judged = blocked_ratio(logs, alpha=0.05, smallest_effect=0.8)
    assert judged["ratio"] == pytest.approx(0.2, rel=0.02)
    assert judged["interval"][1] < 0.8
    assert judged["verdict"] == "faster, beyond the smallest effect of interest (0.8)"


def test_a_small_speedup_is_faster_but_not_beyond_the_smallest_effect():
    logs = [math.log(0.9) + d for d in (-0.01, 0.01, 0.0, 0.005, -0.005, 0.002, -0.002, 0.0)]
    judged = blocked_ratio(logs, alpha=0.05, smallest_effect=0.8)
    assert judged["verdict"] == "faster, not shown beyond the smallest effect of interest (0.8)"


def test_no_difference_is_said_and_equivalence_where_the_interval_is_narrow():
    rng = random.Random(3)
    noisy = [rng.gauss(0, 0.5) for _ in range(8)]
    assert blocked_ratio(noisy, 0.05, 0.8)["verdict"] == "no difference shown at alpha 0.05"
    tight = [0.01, -0.01, 0.005, -0.005, 0.0, 0.002, -0.002, 0.001]
    assert (
        blocked_ratio(tight, 0.05, 0.8)["verdict"]
        == "no difference beyond the smallest effect of interest (0.8)"
    )


def test_a_slowdown_reads_as_slower():
    logs = [math.log(1.5) + d for d in (-0.02, 0.02, 0.01, -0.01)]
    assert (
        blocked_ratio(logs, 0.05, 0.8)["verdict"]
        == "slower, beyond the smallest effect of interest (0.8)"
    )


def test_one_block_is_not_tested():
    assert blocked_ratio([0.1], 0.05, 0.8)["verdict"] == "not tested: fewer than two blocks"


def test_the_sensitivity_line_drops_the_fastest_and_slowest_block():
    assert trimmed([3.0, 1.0, 2.0, 5.0, 4.0]) == [2.0, 3.0, 4.0]
    assert trimmed([1.0, 2.0, 3.0]) == []


def execution(block, run, drums_s, qemu_s, admissible=True):
    return {
        "block": block,
        "execution": run,
        "admissible": admissible,
        "windows": {
            "drums": window(wall_clock_s=drums_s),
            "qemu": window(wall_clock_s=qemu_s),
        },
    }


def test_a_block_counts_by_its_last_execution_and_every_execution_is_kept():
    executions = [
        execution(0, 0, 4.0, 40.0, admissible=False),  # disturbed: run again
        execution(0, 1, 4.0, 16.0),
        execution(1, 0, 4.2, 16.8),
        execution(2, 0, 3.8, 15.2),
    ]
    judged = judge_blocks(executions, "qemu", "drums", 0.05, 0.8)
    assert judged["executions"] == 4 and judged["blocks_kept"] == [0, 1, 2]
    assert judged["log_ratios"] == pytest.approx([math.log(0.25)] * 3)
    # the disturbed execution, had it counted, would have moved block 0 to 0.1
    assert judged["ratio"] == pytest.approx(0.25)


def test_a_block_whose_last_execution_is_inadmissible_does_not_count():
    executions = [execution(0, 0, 4.0, 16.0), execution(1, 0, 4.0, 40.0, admissible=False)]
    judged = judge_blocks(executions, "qemu", "drums", 0.05, 0.8)
    assert judged["blocks_kept"] == [0]
    assert judged["verdict"] == (
        "not tested: the admissibility rule (load, steal, a finished window) kept 1 of 2 blocks, "
        "fewer than two"
    )
    # one block registered, and kept: too few by the registration, not by the load rule
    assert judge_blocks(executions[:1], "qemu", "drums", 0.05, 0.8)["verdict"] == (
        "not tested: fewer than two blocks"
    )


def timed(base_s: list[float], control_s: list[float]) -> list[dict]:
    """Blocks with the base arm and one timed control (drums-aa or drums-handicap)."""
    return [
        {
            "block": k,
            "execution": 0,
            "admissible": True,
            "windows": {"drums": window(wall_clock_s=b), "drums-ctl": window(wall_clock_s=c)},
        }
        for k, (b, c) in enumerate(zip(base_s, control_s, strict=True))
    ]


def control(expect: str):
    from envab.preregistration import Control

    if expect == "same":
        return Control(name="ctl", arm="drums", expect="same")
    return Control(name="ctl", arm="drums", expect="slower", reset_delay_s=0.16)


BASE = [5.0, 5.3, 4.8, 5.1, 5.2, 4.9, 5.0, 5.4]
NOISE = [1.01, 0.98, 1.02, 0.99, 1.0, 1.03, 0.97, 1.0]  # timing noise between two windows


@pytest.mark.parametrize(
    ("expect", "factor", "verdict"),
    [
        ("same", 1.0, "as expected"),  # an A/A: no difference where there is none
        ("same", 1.25, "NOT as expected"),  # an "A/A" 25 % slower: the blocks see a difference
        ("slower", 1.25, "as expected"),  # a handicap at the smallest effect (1 / 0.8): found
        ("slower", 1.0, "NOT as expected"),  # a handicap that slowed nothing: not found
    ],
)
def test_a_timed_control_is_judged_by_the_primary_endpoint_and_flips(expect, factor, verdict):
    from envab.analysis.speed import control_lines, judge_control

    executions = timed(BASE, [b * n * factor for b, n in zip(BASE, NOISE, strict=True)])
    judged = judge_control(executions, control(expect), alpha=0.05, smallest=0.8)
    assert judged["verdict"] == verdict, judged["judged"]
    assert judged["judged"]["baseline"] == "drums" and judged["judged"]["candidate"] == "drums-ctl"
    # at this noise eight blocks tell 0.8 from 1 nearly always: the verdict means something
    assert judged["judged"]["power_at_smallest"]["power"] > 0.99
    text = "\n".join(control_lines([judged]))
    assert f"drums-ctl/drums ({expect}:" in text and f"**{verdict}**" in text


@pytest.mark.parametrize(
    ("noise", "rule", "verdict"),
    [
        # a precise A/A whose two windows differ by 3 %: "covers 1" fails over a difference too
        # small to matter (v13 under load: 1.03 [1.01, 1.06]); equivalence passes it
        ([1.03 * n for n in NOISE], "covers_one", "NOT as expected"),
        ([1.03 * n for n in NOISE], "within_smallest_effect", "as expected"),
        # a noisy A/A whose interval covers 1 and reaches past 0.8: "covers 1" passes it by its
        # width alone; equivalence fails it (the blocks cannot show the arm agrees with itself)
        ([0.6, 1.5, 0.7, 1.4, 0.8, 1.3, 1.0, 1.0], "covers_one", "as expected"),
        ([0.6, 1.5, 0.7, 1.4, 0.8, 1.3, 1.0, 1.0], "within_smallest_effect", "NOT as expected"),
        (NOISE, "within_smallest_effect", "as expected"),
    ],
)
def test_a_timed_a_a_is_judged_by_the_registered_rule_and_each_rule_flips(noise, rule, verdict):
    from envab.analysis.speed import control_lines, judge_control

    executions = timed(BASE, [b * n for b, n in zip(BASE, noise, strict=True)])
    judged = judge_control(executions, control("same"), alpha=0.05, smallest=0.8, aa_rule=rule)
    assert (judged["rule"], judged["verdict"]) == (rule, verdict), judged["judged"]
    text = "\n".join(control_lines([judged]))
    words = "inside the smallest effect" if rule == "within_smallest_effect" else "covers 1"
    assert words in text and f"**{verdict}**" in text


def test_a_timed_control_on_one_block_is_not_tested():
    from envab.analysis.speed import judge_control

    judged = judge_control(timed([5.0], [5.0]), control("same"), alpha=0.05, smallest=0.8)
    assert judged["verdict"] == "not tested"


def test_the_blocks_power_falls_with_their_noise_as_the_t_test_says():
    from envab.analysis.blocks import power_at_smallest

    quiet = [math.log(n) for n in NOISE]
    noisy = [15 * x for x in quiet]  # about 0.27 SD: the power well below 1
    low, high = power_at_smallest(noisy, 0.05, 0.8), power_at_smallest(quiet, 0.05, 0.8)
    assert low["power"] < 0.9 < high["power"]
    # the same power as statsmodels' TTestPower gives where it answers at all
    from statsmodels.stats.power import TTestPower

    n, sd = low["blocks"], low["sd_log_ratio"]
    theirs = TTestPower().power(effect_size=abs(math.log(0.8)) / sd, nobs=n, alpha=0.05)
    assert low["power"] == pytest.approx(theirs, rel=1e-6)
    assert power_at_smallest([0.1], 0.05, 0.8)["power"] is None
