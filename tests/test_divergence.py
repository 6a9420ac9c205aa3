"""Exact divergence between two runs' step digests: hand-built cases, and real tensors hashed."""

from __future__ import annotations

import torch

from envab.analysis.divergence import first_divergence
from envab.trainer.step_digests import step_record, tensor_sha256


def steps(n: int, **changes) -> list[dict]:
    """n identical step lines; changes={step: {field: value}} edits some."""
    lines = []
    for step in range(1, n + 1):
        line = {"step": step, "prompt_ids": f"p{step}", "completion_ids": f"c{step}"}
        line.update({"rewards": f"r{step}", "advantages": f"a{step}"})
        line.update(changes.get(f"s{step}", {}))
        lines.append(line)
    return lines


def test_identical_runs_never_diverge_and_say_how_many_steps_were_compared():
    out = first_divergence(steps(5), steps(3))
    assert out == {
        "verdict": "never",
        "steps_compared": 3,
        "steps_only_in": {"baseline": 2, "candidate": 0},
    }


def test_the_first_differing_step_and_its_fields_are_named():
    candidate = steps(5, s3={"rewards": "x"}, s4={"prompt_ids": "y"})
    out = first_divergence(steps(5), candidate)
    assert out["verdict"] == "diverged" and out["step"] == 3 and out["fields"] == ["rewards"]
    assert out["steps_compared"] == 3


def test_no_shared_step_is_not_a_verdict():
    assert first_divergence([], steps(2))["verdict"] == "not compared"


def test_digests_see_one_token_and_one_reward():
    batch = {
        "prompt_ids": torch.tensor([[1, 2, 3]]),
        "completion_ids": torch.tensor([[4, 5]]),
        "advantages": torch.tensor([0.5, -0.5]),
        "pixel_values": torch.ones(2, 3, dtype=torch.bfloat16),
    }
    rewards = torch.tensor([[1.0], [float("nan")]])
    line = step_record(7, batch, rewards)
    assert line["step"] == 7 and line["reward_values"] == [1.0, None]
    assert line["pixel_values"] == tensor_sha256(torch.ones(2, 3, dtype=torch.bfloat16))
    other = step_record(7, {**batch, "completion_ids": torch.tensor([[4, 6]])}, rewards)
    flipped = step_record(7, batch, torch.tensor([[0.0], [float("nan")]]))
    assert first_divergence([line], [other])["fields"] == ["completion_ids"]
    assert first_divergence([line], [flipped])["fields"] == ["rewards"]
    assert tensor_sha256(torch.tensor([1, 2])) != tensor_sha256(torch.tensor([[1, 2]]))  # shape
