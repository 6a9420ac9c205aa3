"""What the embedded default model is built from besides the task instructions: its source name and
its spec (seed and sizes). Apart from trainer/tiny_model.py so that naming or checking a model
never loads torch."""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = "builtin:tiny-qwen3-vl"


@dataclass(frozen=True)
class TinySpec:
    """Everything that decides the built files besides the task instructions."""

    seed: int = 0
    # Upper bound of the learned BPE vocabulary, before Qwen3-VL's added tokens. Prompt length
    # hardly depends on it: Qwen2Tokenizer's pre-tokenizer (rebuilt on every load) already cuts
    # text into words and punctuation runs, and merges never cross those cuts.
    bpe_vocab_size: int = 1024
    text_hidden_size: int = 128
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate_size: int = 256
    max_position_embeddings: int = 4096
    vision_hidden_size: int = 64
    vision_depth: int = 2
    vision_heads: int = 4
    vision_intermediate_size: int = 128
    deepstack_visual_indexes: tuple[int, ...] = (0,)
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    screen_side: int = 128  # the largest screenshot kept at full resolution (square)
    sample_conversations: int = 256  # rendered chats added to the tokenizer corpus

    def __post_init__(self):
        head_dim = self.text_hidden_size // self.text_heads
        if self.text_hidden_size % self.text_heads or head_dim % 2:
            raise ValueError(
                f"TinySpec: text_hidden_size {self.text_hidden_size} must split into "
                f"{self.text_heads} heads of even size"
            )
        if self.vision_hidden_size % self.vision_heads:
            raise ValueError(
                f"TinySpec: vision_hidden_size {self.vision_hidden_size} must divide "
                f"by vision_heads {self.vision_heads}"
            )
        if self.screen_side % (self.patch_size * self.merge_size):
            raise ValueError(
                f"TinySpec: screen_side {self.screen_side} must be a multiple of "
                f"patch_size*merge_size = {self.patch_size * self.merge_size}"
            )
        if any(not 0 <= i < self.vision_depth for i in self.deepstack_visual_indexes):
            raise ValueError(
                f"TinySpec: deepstack_visual_indexes {self.deepstack_visual_indexes} "
                f"must lie in [0, {self.vision_depth})"
            )

    @property
    def vision_tokens_per_screen(self) -> int:
        return (self.screen_side // (self.patch_size * self.merge_size)) ** 2
