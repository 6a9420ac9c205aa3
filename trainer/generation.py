"""How one turn is generated, written once for training and evaluation alike: the sampler (TRL's:
no top-k, no top-p cut, at the temperature given), how long a turn may be, and how it ends.

GRPO takes `trl_kwargs` (GRPOConfig.generation_kwargs, which TRL lays over its own settings on
either generation path) and evaluation takes `generate_kwargs` (transformers' generate); both
come from the same `Generation`, and tests/test_generation.py fails if what TRL ends up with and
what evaluation passes ever part.
"""

from __future__ import annotations

from dataclasses import dataclass

from envab.trainer import agent


@dataclass(frozen=True)
class Generation:
    temperature: float  # 0: greedy (evaluation only; GRPO samples)
    max_new_tokens: int
    turn_end: str = "bias"  # training.grpo.turn_end: bias | none

    @classmethod
    def pinned(cls, training: dict, temperature: float | None = None) -> Generation:
        """From a run's pinned `training` section; `temperature` overrides GRPO's (evaluation's
        protocol pre-registers its own)."""
        grpo = training["grpo"]
        return cls(
            temperature=grpo["temperature"] if temperature is None else temperature,
            max_new_tokens=grpo["max_completion_length"],
            turn_end=grpo.get("turn_end", "bias"),
        )

    def turn_kwargs(self, tokenizer) -> dict:
        """The turn's ending: a sequence bias that puts the end of turn right after the first
        `</tool_call>` (trainer/agent.py), or nothing (the model ends its own turns)."""
        return agent.turn_generation_kwargs(tokenizer) if self.turn_end == "bias" else {}

    def trl_kwargs(self, tokenizer, vllm: bool) -> dict | None:
        """GRPOConfig.generation_kwargs. Sampling and length are GRPOConfig's own fields."""
        if vllm and self.turn_end == "bias":
            raise ValueError("vLLM has no sequence bias: turn_end must be none under vLLM")
        return self.turn_kwargs(tokenizer) or None

    def generate_kwargs(self, tokenizer) -> dict:
        """transformers' generate settings for one evaluation turn."""
        sampling = self.temperature > 0
        return {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": sampling,
            "temperature": self.temperature if sampling else None,
            # Sampling as GRPO samples (TRL: top_k 0, top_p 1.0), not with transformers' default
            # top_k of 50, which would evaluate a sharper policy than was trained.
            "top_k": 0 if sampling else None,
            "top_p": 1.0 if sampling else None,
            **self.turn_kwargs(tokenizer),
        }
