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
from envab.trainer.model import load


class Policy:
    """The checkpoint, asked for one tool call at a time in the trainer's prompt format."""

    def __init__(
        self,
        checkpoint: str | Path,
        tools: agent.ToolSet,
        temperature: float,
        max_new_tokens: int,
        expected: dict[str, str] | None = None,
    ):
        # `expected`: the files training recorded for the checkpoint; any other refuses the load.
        self.model, self.processor = load(checkpoint, expected)
        self.model.eval()
        self.tokenizer = add_response_schema(self.processor.tokenizer)
        self.tools = tools
        self.turn = agent.turn_generation_kwargs(self.tokenizer)  # one tool call per turn
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
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
        )
        sampling = self.temperature > 0
        if sampling:
            torch.manual_seed(seed)
        started = time.perf_counter()
        with torch.no_grad():
            output = self.model.generate(
                **inputs,
                max_new_tokens=self.max_new_tokens,
                do_sample=sampling,
                temperature=self.temperature if sampling else None,
                # Sampling as GRPO samples (TRL: top_k 0, top_p 1.0), not with transformers'
                # default top_k of 50, which would evaluate a sharper policy than was trained.
                top_k=0 if sampling else None,
                top_p=1.0 if sampling else None,
                **self.turn,
            )
        self.generation_s += time.perf_counter() - started
        prompt = inputs["input_ids"][0].tolist()
        completion = output[0][len(prompt) :].tolist()
        return parse_response(self.tokenizer, completion, prefix=prompt, tools=tools)
