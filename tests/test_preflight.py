"""Pre-flight checks before a run's first step (trainer/preflight.py), on a real GRPOTrainer with
the tiny Qwen3-VL model: they pass on the shipped stack, and each fails, in one line, on the
fault it is there for — a chat template that drops tool-message images, a vision tower that is
not wired in, a completion budget that cannot hold the registered turns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from tiny_grpo import empty_prompts, grpo_args

from envab.trainer import agent, preflight
from envab.trainer import model as pin

TASK = {
    "id": "probe",
    "instruction": "Click the button labelled Save",
    "config": [{"type": "screen", "parameters": {"width": 128, "height": 128}}],
}
TOOL_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    return pin.build_builtin(pin.BuiltinSource(), [TASK["instruction"]], out)


class Screen:
    """Enough of an environment for TRL to build its tool list from."""

    def reset(self, **row) -> list[dict]:
        return agent.first_turn(TASK, Image.new("RGB", (128, 128), "white"))

    def click(self, x: int, y: int) -> list[dict]:
        """Click the left mouse button at a pixel of the screen.

        Args:
            x: Horizontal pixel coordinate, from the left edge of the screen.
            y: Vertical pixel coordinate, from the top edge of the screen.
        """
        return agent.tool_result(Image.new("RGB", (128, 128), "white"))

    def get_reward(self) -> float:
        return 0.0


def build(tiny, tmp_path, processor_change=None):
    from trl import GRPOTrainer

    model, processor = pin.load(tiny)
    args = grpo_args(tmp_path / "trl", processor.tokenizer)
    trainer = GRPOTrainer(
        model=model,
        processing_class=processor,
        args=args,
        train_dataset=empty_prompts(2),
        environment_factory=Screen,
    )
    if processor_change:  # after TRL recognised the template and set its response parser
        processor_change(processor)
    return trainer, processor


def test_the_shipped_stack_passes_and_the_checks_draw_no_random_number(tiny, tmp_path):
    trainer, processor = build(tiny, tmp_path)
    before = torch.get_rng_state()
    checks = preflight.run(trainer, processor, TASK, max_turns=1, max_completion_length=128)
    assert torch.equal(before, torch.get_rng_state())
    by_name = {c["check"]: c for c in checks}
    assert set(by_name) == {
        "tool_images_reach_model",
        "screenshot_changes_logits",
        "tool_call_round_trips",
        "completion_budget_fits",
    }
    assert all(c["ok"] and c["screen"] == [128, 128] for c in checks)
    images = by_name["tool_images_reach_model"]
    assert images["visual_tokens"] == images["expected"] == 16  # 128 px: 8 x 8 patches, merged 2x2
    assert by_name["screenshot_changes_logits"]["max_logit_change"] > 0


def test_a_template_that_drops_tool_message_images_is_refused(tiny, tmp_path):
    def drop_tool_images(processor):
        template = processor.chat_template
        tool_block = template.index('message.role == "tool"')
        processor.chat_template = template[:tool_block] + template[tool_block:].replace(
            TOOL_IMAGE, "", 1
        )
        assert processor.chat_template != template

    trainer, processor = build(tiny, tmp_path, drop_tool_images)
    with pytest.raises(preflight.PreflightFailed, match="pre-flight tool_images_reach_model"):
        preflight.run(trainer, processor, TASK, max_turns=1, max_completion_length=128)


def blind(value):
    """What a vision tower that is not wired in hands on: zeros of every shape it would."""
    if torch.is_tensor(value):
        return torch.zeros_like(value)
    if isinstance(value, (list, tuple)):
        return type(value)(blind(v) for v in value)
    if hasattr(value, "items"):
        return type(value)(**{k: blind(v) for k, v in value.items()})
    return value


def test_a_policy_that_does_not_read_its_screenshots_is_refused(tiny, tmp_path):
    trainer, processor = build(tiny, tmp_path)
    hook = trainer.model.model.visual.register_forward_hook(lambda m, a, output: blind(output))
    try:
        with pytest.raises(preflight.PreflightFailed, match="does not read its screenshots"):
            preflight.run(trainer, processor, TASK, max_turns=1, max_completion_length=128)
    finally:
        hook.remove()
    assert preflight.run(trainer, processor, TASK, max_turns=1, max_completion_length=128)


def test_a_completion_budget_that_cannot_hold_the_turns_is_refused_with_its_arithmetic(
    tiny, tmp_path
):
    trainer, processor = build(tiny, tmp_path)
    with pytest.raises(preflight.PreflightFailed, match=r"4 turns of a \d+-token call") as e:
        preflight.run(trainer, processor, TASK, max_turns=4, max_completion_length=128)
    assert "over max_completion_length 128" in str(e.value)
    big = {**TASK, "config": []}  # no Pillow screen: the X desktop's 1024 x 768
    checks = preflight.run(trainer, processor, big, max_turns=1, max_completion_length=128)
    assert checks[0]["screen"] == [1024, 768]
