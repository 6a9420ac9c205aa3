"""The tiny tokenizer spells a conversation as generation continues it (no token spans two
newlines), so a model trained on rendered conversations starts its own turn right."""

from __future__ import annotations

from envab.trainer.tiny_model import tokenizer_corpus, train_tokenizer
from envab.trainer.tiny_spec import TinySpec


def test_generation_prompt_plus_turn_tokenizes_like_the_whole_conversation():
    spec = TinySpec()
    tok = train_tokenizer(tokenizer_corpus(["Click Save.", "Click Open."], spec), spec)
    prompt = "<|im_start|>assistant\n"
    turn = '\n<tool_call>\n{"name": "click", "arguments": {"x": 32, "y": 20}}\n</tool_call>'
    whole = tok(prompt + turn, add_special_tokens=False)["input_ids"]
    parts = tok(prompt, add_special_tokens=False)["input_ids"]
    assert whole[: len(parts)] == parts
    assert all("\n\n" not in tok.decode([i]) for i in whole)
