"""The embedded default model, `builtin:tiny-qwen3-vl`: a Qwen3-VL small enough to train on a CPU.

Built offline and deterministically from (task instructions, spec): the same inputs give the same
bytes in every file, so the model can be pinned by a per-file sha256 manifest like a hub repo.
The pieces are the real Qwen3-VL ones (config, model class, tokenizer class, image and video
processors, processor, TRL's chat template), only smaller:

- a byte-level BPE tokenizer trained on the task instructions plus rendered chat scaffolding and
  tool calls, with Qwen3-VL's added tokens (same strings, same special flags, same order);
- TRL's `qwen3_vl.jinja`, byte for byte, because TRL recognises the template (and so parses tool
  calls) only by exact string equality;
- image patch, temporal patch and merge sizes equal to the vision config's, and a pixel budget
  that turns a 128x128 screenshot into (128/16/2)^2 = 16 vision tokens.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    Qwen2Tokenizer,
    Qwen2VLImageProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)
from transformers.utils.chat_template_utils import render_jinja_template

from envab.trainer.tiny_spec import TinySpec

# Qwen3-VL's added tokens, in the order (and so with the relative ids) of the released tokenizer.
# The flag is `special`: special tokens are dropped by decode(skip_special_tokens=True); the tool
# and think markers are not, so a decoded completion still carries its <tool_call> block.
QWEN3_VL_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)


# --- the chat template ---------------------------------------------------------------------------


def trl_qwen3_vl_template() -> str:
    """TRL's Qwen3-VL chat template, read from the installed trl (the text TRL compares to)."""
    return (resources.files("trl") / "chat_templates" / "qwen3_vl.jinja").read_text(
        encoding="utf-8"
    )


# --- the tokenizer corpus ------------------------------------------------------------------------
# Representative computer-use tools. The trainer's environment class defines the real ones; these
# only need to render the same kind of text (JSON schemas, tool calls) for the BPE merges.


def click(x: int, y: int) -> str:
    """Click the left mouse button at a pixel of the screen.

    Args:
        x: Horizontal pixel coordinate, from the left edge of the screen.
        y: Vertical pixel coordinate, from the top edge of the screen.
    """


def double_click(x: int, y: int) -> str:
    """Double-click the left mouse button at a pixel of the screen.

    Args:
        x: Horizontal pixel coordinate, from the left edge of the screen.
        y: Vertical pixel coordinate, from the top edge of the screen.
    """


def type_text(text: str) -> str:
    """Type text with the keyboard into the focused element.

    Args:
        text: The text to type.
    """


def press(key: str) -> str:
    """Press and release one key, or a combination such as ctrl+a.

    Args:
        key: The key name, e.g. enter, tab, escape, backspace, ctrl+a.
    """


def scroll(x: int, y: int, dy: int) -> str:
    """Scroll the mouse wheel over a pixel of the screen.

    Args:
        x: Horizontal pixel coordinate, from the left edge of the screen.
        y: Vertical pixel coordinate, from the top edge of the screen.
        dy: Wheel clicks; positive scrolls down, negative scrolls up.
    """


def done() -> str:
    """Declare the task finished."""


def fail() -> str:
    """Declare the task impossible to finish."""


TOOLS = (click, double_click, type_text, press, scroll, done, fail)
_KEYS = ("enter", "tab", "escape", "backspace", "delete", "space", "ctrl+a", "ctrl+s", "up", "down")


def _sample_call(rng: random.Random, instruction: str, side: int) -> dict:
    name = rng.choice(("click", "click", "double_click", "type_text", "press", "scroll"))
    if name in ("click", "double_click"):
        args = {"x": rng.randrange(side), "y": rng.randrange(side)}
    elif name == "type_text":
        words = instruction.split()
        args = {"text": " ".join(rng.sample(words, k=min(len(words), rng.randint(1, 3))))}
    elif name == "press":
        args = {"key": rng.choice(_KEYS)}
    else:
        args = {
            "x": rng.randrange(side),
            "y": rng.randrange(side),
            "dy": rng.choice((-3, -1, 1, 3)),
        }
    return {"type": "function", "function": {"name": name, "arguments": args}}


def sample_conversation(rng: random.Random, instruction: str, side: int) -> list[dict]:
    """One episode as the trainer renders it: task + screenshot, tool calls, screenshots back."""
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}
    ]
    for _ in range(rng.randint(1, 4)):
        call = _sample_call(rng, instruction, side)
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append(
            {"role": "tool", "name": call["function"]["name"], "content": [{"type": "image"}]}
        )
    final = rng.choice(("done", "done", "done", "fail"))
    messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": final, "arguments": {}}}],
        }
    )
    return messages


def tokenizer_corpus(instructions: Sequence[str], spec: TinySpec) -> list[str]:
    """Instructions plus chats rendered with the real template and tools (seeded, ordered)."""

    if not instructions:
        raise ValueError("tiny model: the task set has no instructions to train the tokenizer on")
    rng = random.Random(spec.seed)
    chats = [
        sample_conversation(rng, instructions[i % len(instructions)], spec.screen_side)
        for i in range(spec.sample_conversations)
    ]
    rendered, _ = render_jinja_template(
        chats, tools=list(TOOLS), chat_template=trl_qwen3_vl_template()
    )
    # Without tools the template opens differently; one such chat keeps that text in the corpus.
    plain, _ = render_jinja_template(
        chats[:1], chat_template=trl_qwen3_vl_template(), add_generation_prompt=True
    )
    return list(instructions) + rendered + plain


# --- the tokenizer -------------------------------------------------------------------------------


def train_tokenizer(corpus: Iterable[str], spec: TinySpec):
    """A Qwen2Tokenizer (Qwen3-VL's tokenizer class) whose BPE merges are learned from `corpus`."""

    # Train with exactly the normalizer and pre-tokenizer Qwen2Tokenizer rebuilds on load.
    template = Qwen2Tokenizer()
    raw = Tokenizer(models.BPE())
    raw.normalizer = template.backend_tokenizer.normalizer
    raw.pre_tokenizer = template.backend_tokenizer.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=spec.bpe_vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # The trainer breaks count ties by pair, so merges come out the same in every process and
    # with any thread count (checked: three runs each serial and with 2 rayon threads).
    # Added tokens are cut out of the text before BPE sees it, as encoding does, so no merges are
    # spent on spelling "<|im_start|>".
    added_re = re.compile("|".join(re.escape(text) for text, _ in QWEN3_VL_ADDED_TOKENS))
    pieces = (piece for text in corpus for piece in added_re.split(text) if piece)
    raw.train_from_iterator(pieces, trainer=trainer)
    trained = json.loads(raw.to_str())["model"]
    vocab: dict[str, int] = trained["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    # No token may span two newlines ("Ċ" is the byte-level "\n"). A generation prompt ends in
    # "<|im_start|>assistant\n" and the assistant's turn goes on with "\n<tool_call>", but a
    # rendered conversation (what SFT trains on) spells that "\n\n" as one merged token, so a
    # model trained on whole conversations never saw the token that generation must continue
    # from, and its first generated tokens came out wrong. Splitting newline runs makes both
    # tokenize alike.
    merges = [m for m in merges if "ĊĊ" not in "".join(m)]

    added = {
        len(vocab) + i: AddedToken(text, special=special, normalized=False)
        for i, (text, special) in enumerate(QWEN3_VL_ADDED_TOKENS)
    }
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        added_tokens_decoder=added,
        errors="replace",
        split_special_tokens=False,
        model_max_length=spec.max_position_embeddings,
    )
    for token_id, token in added.items():
        got = tokenizer.convert_tokens_to_ids(token.content)
        if got != token_id:
            raise RuntimeError(
                f"tiny model: added token {token.content} got id {got}, not {token_id}"
            )
    tokenizer.chat_template = trl_qwen3_vl_template()
    return tokenizer


# --- processor, config, model --------------------------------------------------------------------


def build_processor(tokenizer, spec: TinySpec):
    factor = spec.patch_size * spec.merge_size
    # Pixel budget: at most one full screen, at least 2x2 merged patches.
    size = {"shortest_edge": (2 * factor) ** 2, "longest_edge": spec.screen_side**2}
    common = dict(
        patch_size=spec.patch_size,
        temporal_patch_size=spec.temporal_patch_size,
        merge_size=spec.merge_size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    image_processor = Qwen2VLImageProcessor(size=size, **common)
    video_processor = Qwen3VLVideoProcessor(size=size, **common)
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=trl_qwen3_vl_template(),
    )


def build_config(tokenizer, spec: TinySpec):
    ids = tokenizer.convert_tokens_to_ids
    head_dim = spec.text_hidden_size // spec.text_heads
    # Qwen3-VL splits half the rotary dimensions into (temporal, height, width) sections,
    # interleaved; the released 4B uses [24, 20, 20] of 64. Same proportions here.
    half = head_dim // 2
    hw = (half * 20) // 64
    mrope_section = [half - 2 * hw, hw, hw]
    text_config = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.text_hidden_size,
        intermediate_size=spec.text_intermediate_size,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads,
        num_key_value_heads=spec.text_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5_000_000.0,
            "mrope_section": mrope_section,
            "mrope_interleaved": True,
        },
        bos_token_id=None,
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        tie_word_embeddings=True,
    )
    vision_config = dict(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden_size,
        intermediate_size=spec.vision_intermediate_size,
        num_heads=spec.vision_heads,
        patch_size=spec.patch_size,
        temporal_patch_size=spec.temporal_patch_size,
        spatial_merge_size=spec.merge_size,
        out_hidden_size=spec.text_hidden_size,
        # A square grid of learned positions, one per patch of a full screen (else interpolated).
        num_position_embeddings=(spec.screen_side // spec.patch_size) ** 2,
        deepstack_visual_indexes=list(spec.deepstack_visual_indexes),
    )
    return Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )


def build_model(config, spec: TinySpec):
    torch.manual_seed(spec.seed)
    model = Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()
    text = config.text_config
    model.generation_config = GenerationConfig(
        eos_token_id=[text.eos_token_id, text.pad_token_id],
        pad_token_id=text.pad_token_id,
        do_sample=False,
    )
    return model


# --- the whole build -----------------------------------------------------------------------------


def build(instructions: Sequence[str], out: str | Path, spec: TinySpec | None = None) -> Path:
    """Write the tiny model (weights, config, tokenizer, processor, template) into `out`."""
    spec = spec or TinySpec()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(tokenizer_corpus(instructions, spec), spec)
    processor = build_processor(tokenizer, spec)
    model = build_model(build_config(tokenizer, spec), spec)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    # The spec that made these files, so a reader can tell what the builder was asked for.
    (out / "tiny_spec.json").write_text(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")
    return out
