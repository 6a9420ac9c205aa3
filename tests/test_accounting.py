"""The ledger: counts add up, invalid attempts carry no reward, checkpoints fall on the interval."""

from __future__ import annotations

import json

import pytest

from envab.trainer.accounting import Attempt, Ledger, Prices


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def attempt(verdict="valid", score=1.0, env_s=0.5, gen_s=2.0) -> Attempt:
    return Attempt(
        task_id="t1",
        env_id="e1",
        fork_parent=None,
        verdict=verdict,
        failed_gates=() if verdict == "valid" else ("worker_alive",),
        score=score if verdict == "valid" else None,
        turns=3,
        actions=3,
        refused=0,
        env_seconds=env_s,
        generation_seconds=gen_s,
        started_utc="a",
        ended_utc="b",
    )


def ledger(tmp_path, clock) -> Ledger:
    return Ledger(
        str(tmp_path / "trajectories.jsonl"),
        str(tmp_path / "checkpoints.jsonl"),
        arm="drums",
        seed=1,
        checkpoint_interval=4,
        prices=Prices(0.36, 3.6),
        hosts=2,
        clock=clock,
    )


def test_counts_costs_and_checkpoints(tmp_path):
    clock = FakeClock()
    book = ledger(tmp_path, clock)
    outcomes = ["valid", "valid", "env_failure", "valid", "valid", "timeout", "valid"]
    start = book.record_checkpoint("ckpt-start", 0, {"model.safetensors": "s"})
    assert (start["index"], start["due_at_valid"], start["wall_clock_s"]) == (0, 0, 0.0)
    records = []
    for step, verdict in enumerate(outcomes, start=1):
        clock.now += 10
        book.record(attempt(verdict, score=float(step % 2)), step)
        if book.checkpoint_due():
            records.append(book.record_checkpoint(f"ckpt-{step}", step, {"model.safetensors": "x"}))
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(lines) == 7
    assert [r["reward"] for r in lines if r["verdict"] != "valid"] == [None, None]
    assert all(r["reward"] == r["score"] for r in lines if r["verdict"] == "valid")
    # one checkpoint, at the 4th valid attempt (step 5), with the counters at that moment
    assert len(records) == 1
    first = records[0]
    assert (first["step"], first["valid_trajectories"], first["invalid_discarded"]) == (5, 4, 1)
    # training success over the window: valid attempts at steps 1, 2, 4, 5 scored 1, 0, 0, 1
    assert (first["train_window_valid"], first["train_success"]) == (4, 0.5)
    assert (start["train_window_valid"], start["train_success"]) == (0, None)
    assert first["wall_clock_s"] == 40.0  # the first attempt started the clock at 110
    assert first["env_host_hours"] == 2 * 40 / 3600
    assert abs(first["env_cost_usd"] - 0.36 * 2 * 40 / 3600) < 1e-12
    assert first["inference_s"] == 10.0 and abs(first["inference_cost_usd"] - 0.01) < 1e-12
    saved = [json.loads(x) for x in (tmp_path / "checkpoints.jsonl").read_text().splitlines()]
    assert saved == [start, *records]
    with pytest.raises(ValueError, match="start checkpoint comes before the first step"):
        book.record_checkpoint("late-start", 0, {})
    # the counters in the trajectories add up to the ledger's
    assert sum(r["verdict"] == "valid" for r in lines) == book.valid == 5
    assert sum(r["verdict"] != "valid" for r in lines) == book.invalid == 2


def test_budget_stops_at_whichever_limit_comes_first(tmp_path):
    clock = FakeClock()
    book = ledger(tmp_path, clock)
    book.start()
    assert book.stop_reason(60, 3) is None
    for _ in range(3):
        book.record(attempt(), 0)
    assert book.stop_reason(60, 3) == "max_valid_trajectories"
    assert book.stop_reason(60, 10) is None
    clock.now += 61
    assert book.stop_reason(60, 10) == "max_wall_clock_s"
