"""Exact divergence: the first training step at which two runs of the same seed saw different data.

Each run's steps.jsonl holds, per GRPO generation batch, the sha256 of its prompt tokens, images,
sampled completions, rewards and advantages (trainer/step_digests.py). While training is
deterministic, two arms that differ only in infrastructure produce identical lines; the first step
whose line differs, and in which fields, is where the environment changed what the model learned
from. This is the primary evidence that only the infrastructure changed, so the outcome puts it
first. "never" is said with the number of steps compared; steps only one run reached (one arm
stopped earlier on its wall-clock budget) are counted, not compared.
"""

from __future__ import annotations

from collections.abc import Iterable

# What a step saw and did, in the order the pipeline produces it.
FIELDS = (
    "prompt_ids",
    "prompt_mask",
    "pixel_values",
    "completion_ids",
    "completion_mask",
    "rewards",
    "advantages",
)


def first_divergence(baseline: Iterable[dict], candidate: Iterable[dict]) -> dict:
    """Compare two runs' step digests step by step; the first step that differs, or "never"."""
    a = {line["step"]: line for line in baseline}
    b = {line["step"]: line for line in candidate}
    shared = sorted(set(a) & set(b))
    only = {"baseline": len(set(a) - set(b)), "candidate": len(set(b) - set(a))}
    for step in shared:
        fields = [f for f in FIELDS if a[step].get(f) != b[step].get(f)]
        if fields:
            return {
                "verdict": "diverged",
                "step": step,
                "fields": fields,
                "steps_compared": shared.index(step) + 1,
                "steps_only_in": only,
            }
    if not shared:
        return {"verdict": "not compared", "reason": "no training step in both runs"}
    return {"verdict": "never", "steps_compared": len(shared), "steps_only_in": only}
