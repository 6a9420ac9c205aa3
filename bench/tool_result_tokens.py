"""What one turn costs of the completion budget, as TRL 1.16 counts it (trainer/preflight.py).

    python bench/tool_result_tokens.py

TRL appends each tool result to the completion and counts it against `max_completion_length`,
screenshot included; a turn that would overrun the budget is dropped and the episode ends there.
Prints, with the tiny Qwen3-VL model built offline (the 4B's image processor has the same patch
16, merge 2x2), the tokens of one tool result (TRL's own `_get_tool_suffix_ids`) and of its
visual part, per screen size, under the processor's own pixel bounds and under the Qwen3-VL-4B
config's (`training.vision`), and the tokens of the shortest tool call; then the turns each
shipped config's budget holds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from envab.trainer import model as pin
from envab.trainer import preflight

REPO = Path(__file__).resolve().parent.parent
SIZES = [(128, 128), (640, 480), (1024, 768), (1920, 1080)]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = pin.build_builtin(pin.BuiltinSource(), ["probe"], Path(tmp) / "model")
        _, processor = pin.load(model_dir)
        config = yaml.safe_load((REPO / "config/qwen3-vl-4b.yaml").read_text())
        vision = config["training"]["vision"]
        own = dict(processor.image_processor.size)
        print("| screen | bounds | visual tokens | tool result tokens |")
        print("|---|---|---|---|")
        for label, size in (("the tiny model's own", own), ("the 4B config's", None)):
            processor.image_processor.size = size or {
                "shortest_edge": vision["min_pixels"],
                "longest_edge": vision["max_pixels"],
            }
            for w, h in SIZES:
                image = preflight.probe_screenshot((w, h))
                visual = preflight.visual_tokens(processor, image)
                result = preflight.tool_result_tokens(processor, image)
                print(f"| {w}x{h} | {label} | {visual} | {result} |")
        processor.image_processor.size = own
        call = preflight.call_tokens(processor)
        print(f"\nthe shortest tool call, click(x=12, y=34): {call} tokens")
        for path in ("config.yaml", ".test/config.yaml", "config/qwen3-vl-4b.yaml"):
            grpo = yaml.safe_load((REPO / path).read_text())["training"]["grpo"]
            print(f"{path}: max_turns {grpo.get('max_turns')}, "
                  f"max_completion_length {grpo.get('max_completion_length')}")  # fmt: skip


if __name__ == "__main__":
    main()
