"""How one turn is generated, written once for training and evaluation alike: the sampler (TRL's:
no top-k, no top-p cut, at the temperature given), how long a turn may be, and how it ends.

GRPO takes `trl_kwargs` (GRPOConfig.generation_kwargs, which TRL lays over its own settings on
either generation path) and evaluation takes `generate_kwargs` (transformers' generate); both
come from the same `Generation`, and tests/test_generation.py fails if what TRL ends up with and
what evaluation passes ever part.

No path may sample a token that no assistant turn can contain (`UNSAMPLEABLE`): Qwen3-VL's vision
placeholders make its position code look for an image or video that is not there (a sampled
`<|video_pad|>` crashed the embedded default's training in the reference model's forward pass),
and `<|im_start|>` would open a turn inside a turn. Each path suppresses them its own way
(transformers: `suppress_tokens`, vLLM: `bad_words`), and `check_completion` is the backstop
for a server that ignores the suppression: the attempt is invalid, never a crash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from envab.trainer import agent

# Tokens a policy's turn never contains: the vision placeholders (what an image or video becomes
# in the prompt; TRL suppresses only <|image_pad|> on its transformers path) and the opening of a
# turn. The end of a turn (<|im_end|>) and of text (<|endoftext|>) stay: they end a completion.
UNSAMPLEABLE = (
    "<|im_start|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# What a sampled unsampleable token is replaced with before anything reads the completion: a
# token the forward pass gives no meaning (no image or video placeholder, no turn), itself
# unsampleable, so finding it in a completion later means the attempt must be invalid.
QUARANTINE = "<|vision_pad|>"


def unsampleable_ids(tokenizer) -> list[int]:
    """The ids of `UNSAMPLEABLE` in this tokenizer (a token it lacks cannot be sampled either)."""
    ids = []
    for token in UNSAMPLEABLE:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.append(token_id)
    return sorted(ids)


def quarantine(completion: Sequence[int], forbidden: set[int], replacement: int) -> list[int]:
    """A sampled completion with every forbidden id replaced by `replacement`."""
    return [replacement if token in forbidden else token for token in completion]


class UnsampleableToken(ValueError):
    """A turn held a token no turn may contain: its episode is invalid (`completion_tokens`), in
    training and in evaluation alike."""


def check_completion(completion: Sequence[int], sampled: Sequence[int] | None, forbidden: set[int]):
    """Whether a completion holds a forbidden token where the policy sampled (`sampled`: TRL's
    tool mask, 1 for a sampled token, 0 for a tool result's; None: every token was sampled).
    A tool result's screenshot is `<|vision_start|><|image_pad|>...`: only sampled tokens count."""
    mask = sampled if sampled is not None else [1] * len(completion)
    return any(m and token in forbidden for token, m in zip(completion, mask, strict=True))


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

    def suppress_kwargs(self, tokenizer, vllm: bool = False) -> dict:
        """The unsampleable tokens, suppressed: by id for transformers (their logits set to -inf,
        whatever else biases them), by text for vLLM (`bad_words`, which survives the JSON of
        server mode; a single-token bad word is banned outright)."""
        if vllm:
            return {"bad_words": [t for t in UNSAMPLEABLE if t in tokenizer.get_vocab()]}
        return {"suppress_tokens": unsampleable_ids(tokenizer)}

    def settings(self, tokenizer) -> dict:
        """What a run records of how its turns were generated (run.json, evaluation records)."""
        return {
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "turn_end": self.turn_end,
            "suppressed_tokens": [t for t in UNSAMPLEABLE if t in tokenizer.get_vocab()],
        }

    def trl_kwargs(self, tokenizer, vllm: bool) -> dict:
        """GRPOConfig.generation_kwargs. Sampling and length are GRPOConfig's own fields."""
        if vllm and self.turn_end == "bias":
            raise ValueError("vLLM has no sequence bias: turn_end must be none under vLLM")
        return {**self.turn_kwargs(tokenizer), **self.suppress_kwargs(tokenizer, vllm)}

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
            **self.suppress_kwargs(tokenizer),
        }


class _AnyTool(dict):
    """A rollout's tool dict that holds every name: TRL answers an unknown tool name with an
    error that quotes the name the policy wrote, which the chat template then tokenizes (a name
    spelled "<|video_pad|>" becomes the placeholder). An unknown name goes to the environment
    instead, which refuses it with the escaped note the evaluation gives."""

    def __init__(self, tools: dict, act):
        super().__init__(tools)
        self._act = act

    def __contains__(self, name) -> bool:
        return True

    def __missing__(self, name):
        return lambda **arguments: self._act(str(name), arguments)


class GuardedGenerationMixin:
    """A mixin for TRL's GRPOTrainer (names as in TRL 1.16's grpo_trainer.py): a sampled
    unsampleable token is quarantined right after each turn is generated, before the next turn's
    positions or the loss's forward pass read it, and its attempt is made invalid
    (`completion_tokens`) before the rewards are asked for; an unknown tool name is refused by
    the environment; and every invalid attempt is masked out of the update."""

    def _forbidden(self) -> tuple[set[int], int]:
        if not hasattr(self, "_unsampleable"):
            tokenizer = self._tokenizer  # TRL's text tokenizer of the processor
            self._unsampleable = (
                set(unsampleable_ids(tokenizer)),
                tokenizer.convert_tokens_to_ids(QUARANTINE),
            )
        return self._unsampleable

    def _generate_single_turn(self, *args, **kwargs):
        completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        forbidden, replacement = self._forbidden()
        completion_ids = [quarantine(ids, forbidden, replacement) for ids in completion_ids]
        return completion_ids, logprobs

    def _tool_call_loop(self, *args, **kwargs):
        if self.environments:
            self._sync_tool_dicts = [
                _AnyTool(tools, environment._act)
                for tools, environment in zip(self._sync_tool_dicts, self.environments, strict=True)
            ]
        return super()._tool_call_loop(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        """TRL's batch with every invalid attempt (its reward None: no advantage) masked out of
        every term of the update, the KL term and the loss's token count included: an attempt
        the environment or the sampler spoiled teaches nothing, on either arm."""
        import torch  # only in training: the evaluation imports this module without torch

        batch = super()._generate_and_score_completions(inputs)
        invalid = [bool(getattr(env, "invalid", False)) for env in self.environments or []]
        if any(invalid):
            rows = torch.tensor(invalid, device=batch["completion_mask"].device)
            batch["completion_mask"] = batch["completion_mask"].masked_fill(rows.unsqueeze(1), 0)
            loss_mask = batch["completion_mask"]
            if batch.get("tool_mask") is not None:
                loss_mask = loss_mask * batch["tool_mask"]
            batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        return batch

    def _generate(self, prompts):
        output = super()._generate(prompts)
        _, completion_ids, tool_mask, *_ = output
        forbidden, _ = self._forbidden()
        for i, ids in enumerate(completion_ids):
            sampled = tool_mask[i] if tool_mask is not None else None
            if check_completion(ids, sampled, forbidden) and self.environments:
                self.environments[i]._reject_completion()
        return output
