"""The checkpoint as a policy: asked for one tool call at a time in the trainer's prompt format
(trainer/agent.py), greedy or seeded sampling as the protocol says. The only part of an
evaluation that needs torch, so a job that reuses an evaluation or refuses its inputs never
loads it."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from trl.chat_template_utils import add_response_schema, parse_response

from envab.trainer import agent
from envab.trainer.compute import Compute
from envab.trainer.generation import (
    Generation,
    UnsampleableToken,
    check_completion,
    unsampleable_ids,
)
from envab.trainer.model import load


class Policy:
    """The checkpoint, asked for one tool call at a time in the trainer's prompt format."""

    def __init__(
        self,
        checkpoint: str | Path,
        tools: agent.ToolSet,
        generation: Generation,
        expected: dict[str, str] | None = None,
        compute: Compute | None = None,
        base_expected: dict[str, str] | None = None,
    ):
        # `expected`: the files training recorded for the checkpoint; any other refuses the load.
        # `compute`: the run's device and dtype (the CPU default when not given);
        # `base_expected`: a LoRA checkpoint's base model's files (trainer/model.py).
        compute = compute or Compute()
        self.model, self.processor = load(
            checkpoint, expected, compute.dtype, compute.device, base_expected=base_expected
        )
        self.model.eval()
        self.tokenizer = add_response_schema(self.processor.tokenizer)
        self.tools = tools
        self.generation = generation
        self.kwargs = generation.generate_kwargs(self.tokenizer)  # as GRPO generated its turns
        self.unsampleable = set(unsampleable_ids(self.tokenizer))
        self.generation_s = 0.0

    def act(self, messages: list[dict], seed: int) -> dict:
        """The assistant message (parsed, tool calls included) for the conversation so far."""
        tools = list(self.tools.tools)
        inputs = self.processor.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        ).to(self.model.device)
        if self.generation.temperature > 0:
            torch.manual_seed(seed)
        started = time.perf_counter()
        with torch.no_grad():
            output = self.model.generate(**inputs, **self.kwargs)
        self.generation_s += time.perf_counter() - started
        prompt = inputs["input_ids"][0].tolist()
        completion = output[0][len(prompt) :].tolist()
        if check_completion(completion, None, self.unsampleable):
            raise UnsampleableToken("the turn holds a token no turn may contain")
        return parse_response(self.tokenizer, completion, prefix=prompt, tools=tools)
