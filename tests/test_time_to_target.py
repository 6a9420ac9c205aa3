"""Time-to-target: first checkpoint at or above the threshold, or an honest "never reached"."""

from __future__ import annotations

from envab.analysis.time_to_target import time_to_target


def checkpoint(n: int) -> dict:
    return {
        "checkpoint": f"ckpt-{n:06d}",
        "valid_trajectories": n,
        "invalid_discarded": n // 10,
        "wall_clock_s": 2.0 * n,
        "env_host_hours": n / 3600,
        "env_cost_usd": 0.1 * n / 3600,
        "inference_s": 1.5 * n,
        "inference_cost_usd": 0.2 * 1.5 * n / 3600,
    }


def evaluation(rate: float | None) -> dict:
    if rate is None:
        return {"scored": False, "success_rate": None}
    return {"scored": True, "success_rate": rate, "successes": int(rate * 20), "episodes": 20}


CHECKPOINTS = [checkpoint(n) for n in (32, 64, 96, 128)]


def run(rates, threshold=0.5, checkpoints=CHECKPOINTS):
    evals = {c["checkpoint"]: evaluation(r) for c, r in zip(checkpoints, rates, strict=False)}
    return time_to_target(checkpoints, evals, threshold)


def test_reached_at_the_first_checkpoint():
    out = run([0.6, 0.7, 0.8, 0.9])
    assert out["reached"] and out["checkpoint"] == "ckpt-000032"
    assert out["valid_trajectories"] == 32 and out["wall_clock_s"] == 64.0
    assert out["upper_bound"] is False


def test_reached_late_reports_that_checkpoints_counters():
    out = run([0.1, 0.2, 0.45, 0.55])
    assert out["reached"] and out["checkpoint"] == "ckpt-000128"
    assert out["heldout_success_rate"] == 0.55
    assert out["invalid_discarded"] == 12 and out["env_cost_usd"] == 0.1 * 128 / 3600


def test_never_reached_reports_final_rate_and_budget():
    out = run([0.1, 0.2, 0.3, 0.4])
    assert out == {
        "reached": False,
        "rule": {"rule": "first_crossing"},
        "verdict": "never reached target",
        "unconfirmed_crossing": None,
        "final_checkpoint": "ckpt-000128",
        "final_heldout_success_rate": 0.4,
        "unevaluated": [],
        "budget_spent": {k: v for k, v in checkpoint(128).items() if k != "checkpoint"},
    }


def test_a_missing_evaluation_before_the_reaching_one_makes_an_upper_bound():
    rates = [0.1, 0.2, 0.6, 0.7]
    evals = {c["checkpoint"]: evaluation(r) for c, r in zip(CHECKPOINTS, rates, strict=True)}
    del evals["ckpt-000064"]
    out = time_to_target(CHECKPOINTS, evals, 0.5)
    assert out["reached"] and out["checkpoint"] == "ckpt-000096"
    assert out["upper_bound"] is True and out["unevaluated_before"] == ["ckpt-000064"]


def test_an_unscored_evaluation_is_not_a_zero_and_not_a_success():
    out = run([0.1, None, 0.2, None])
    assert not out["reached"]
    assert out["final_checkpoint"] == "ckpt-000096" and out["final_heldout_success_rate"] == 0.2
    assert out["unevaluated"] == ["ckpt-000064", "ckpt-000128"]


def test_exactly_at_the_threshold_counts_as_reached():
    out = run([0.25, 0.5, 0.75, 1.0], threshold=0.5)
    assert out["reached"] and out["checkpoint"] == "ckpt-000064"
    assert not run([0.25, 0.49999, 0.3, 0.2], threshold=0.5)["reached"]


def test_checkpoint_order_is_by_valid_trajectories_not_list_order():
    shuffled = [CHECKPOINTS[2], CHECKPOINTS[0], CHECKPOINTS[3], CHECKPOINTS[1]]
    evals = {c["checkpoint"]: evaluation(0.9) for c in CHECKPOINTS}
    assert time_to_target(shuffled, evals, 0.5)["checkpoint"] == "ckpt-000032"


def test_no_checkpoints_is_never_reached_with_nothing_spent():
    out = time_to_target([], {}, 0.5, final={"valid_trajectories": 0, "wall_clock_s": 3.0})
    assert out["reached"] is False and out["final_heldout_success_rate"] is None
    assert out["budget_spent"]["wall_clock_s"] == 3.0


def test_a_crossing_that_is_not_confirmed_is_never_reached():
    rates = [0.1, 0.6, 0.7, 0.4]
    evals = {c["checkpoint"]: evaluation(r) for c, r in zip(CHECKPOINTS, rates, strict=True)}
    confirmed = {"verdict": "confirmed", "checkpoint": "ckpt-000064"}
    out = time_to_target(CHECKPOINTS, evals, 0.5, None, None, confirmed, True)
    assert out["reached"] and out["checkpoint"] == "ckpt-000064"
    for record, why in (
        ({"verdict": "not confirmed", "checkpoint": "ckpt-000064"}, "crossing not confirmed"),
        (None, "no confirmatory evaluation"),
        ({"verdict": "confirmed", "checkpoint": "ckpt-000096"}, "judged ckpt-000096"),
    ):
        out = time_to_target(CHECKPOINTS, evals, 0.5, None, None, record, True)
        assert not out["reached"] and out["verdict"] == "never reached target"
        assert out["unconfirmed_crossing"]["checkpoint"] == "ckpt-000064"
        assert why in out["unconfirmed_crossing"]["reason"]
        # censored at the budget it spent, with the last scored rate
        assert out["budget_spent"]["valid_trajectories"] == 128
        assert out["final_heldout_success_rate"] == 0.4
    # no confirmation registered: the crossing stands as before
    assert time_to_target(CHECKPOINTS, evals, 0.5, None, None, None, False)["reached"]
