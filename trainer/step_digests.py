"""A digest of every GRPO generation batch, for the exact-divergence check.

While training is deterministic, two arms run with the same seed see the same batches step for
step: the same prompt tokens and screenshots, the same sampled completions, the same rewards and
advantages. The first step at which any of these differs is where the environment changed what
the model learned from (analysis/divergence.py); "never" is the strongest evidence that only the
infrastructure changed. One line per step of steps.jsonl:

    {"step": 3, "prompt_ids": "<sha256>", "completion_ids": ..., "pixel_values": ...,
     "rewards": ..., "advantages": ..., "reward_values": [1.0, 0.0, null, ...]}

Hashing reads the tensors only; it draws no random numbers and changes nothing TRL computes.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch
from trl import GRPOTrainer

from envab.io import append_jsonl
from envab.trainer.ranks import Ranks

FIELDS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "pixel_values")


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (bfloat16 through its raw 16-bit words)."""
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    digest = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    digest.update(t.numpy().tobytes())
    return digest.hexdigest()


def step_record(step: int, batch: dict, rewards: torch.Tensor | None) -> dict:
    """The digest line of one generation batch (TRL's output of _generate_and_score_completions)."""
    record = {"step": step}
    for field in FIELDS:
        if isinstance(batch.get(field), torch.Tensor):
            record[field] = tensor_sha256(batch[field])
    record["advantages"] = tensor_sha256(batch["advantages"])
    if rewards is not None:
        record["rewards"] = tensor_sha256(rewards)
        values = rewards.detach().cpu().flatten().tolist()
        record["reward_values"] = [None if math.isnan(v) else v for v in values]
    return record


class DigestingGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer, writing one digest line per generation batch to `steps_path`."""

    def __init__(self, *args, steps_path: str | Path, ranks: Ranks | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps_path = Path(steps_path)
        self.ranks = ranks or Ranks()
        if self.ranks.main:
            self.steps_path.touch()  # exists from the start, even if no step runs (appended to)
        self._step_rewards: torch.Tensor | None = None

    def _calculate_rewards(self, *args, **kwargs):
        self._step_rewards = super()._calculate_rewards(*args, **kwargs)
        return self._step_rewards

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        record = step_record(self.state.global_step + 1, batch, self._step_rewards)
        if not self.ranks.several:
            append_jsonl(self.steps_path, record)
            return batch
        # Several processes: each one's share of the batch, written by rank 0 in rank order.
        for rank, share in enumerate(self.ranks.gather(record)):
            if self.ranks.main:
                append_jsonl(self.steps_path, {**share, "rank": rank})
        return batch
