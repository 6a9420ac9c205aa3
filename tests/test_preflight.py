"""Pre-flight checks before a run's first step (trainer/preflight.py), on a real GRPOTrainer with
the tiny Qwen3-VL model: they pass on the shipped stack, and each fails, in one line, on the
fault it is there for — a chat template that drops tool-message images, a vision tower that is
not wired in, a completion budget that cannot hold the registered turns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from tiny_grpo import empty_prompts, grpo_args

from envab.trainer import agent, preflight
from envab.trainer import model as pin

REPO = Path(__file__).resolve().parent.parent
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


def test_the_freeze_counts_the_budget_from_the_processor_as_the_first_step_does(tiny, tmp_path):
    """The freeze (trainer/pin.py) has no trainer yet: its count, from the pinned processor and
    TRL's own tokenisation of a tool result, must be the pre-flight's, screen for screen."""
    trainer, processor = build(tiny, tmp_path)
    small = {**TASK, "config": [{"type": "screen", "parameters": {"width": 64, "height": 64}}]}
    big = {**TASK, "config": []}  # the X desktop's 1024 x 768
    at_step = preflight.run(trainer, processor, big, max_turns=2, max_completion_length=512)
    at_freeze = preflight.budget_at_freeze(processor, [small, big], 2, 512)
    assert at_freeze["ok"] and at_freeze["screen"] == [1024, 768]  # the largest screen decides
    assert at_freeze["needed"] == at_step[-1]["needed"]
    refused = preflight.budget_at_freeze(processor, [small, TASK], 6, 128)
    assert not refused["ok"] and "6 turns of a" in refused["detail"]


def test_a_budget_that_cannot_hold_the_turns_refuses_the_model_pin(tiny, tmp_path):
    tasks = tmp_path / "train.jsonl"
    tasks.write_text(json.dumps(TASK) + "\n")
    target = REPO / ".test" / "target.yaml"
    prereg = subprocess.run(
        [sys.executable, "-m", "envab.freeze", "target", str(target),
         "--receipt", str(tmp_path / "preregistration.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert prereg.returncode == 0, prereg.stderr
    manifest = json.dumps(pin.model_manifest(tiny))
    for turns, code in ((1, 0), (6, 2)):
        training = {"grpo": {"max_turns": turns, "max_completion_length": 128}}
        out = tmp_path / f"model{turns}"
        result = subprocess.run(
            [sys.executable, "-m", "envab.trainer.pin", "--target", str(target),
             "--receipts", str(tmp_path / "preregistration.json"),
             "--source", "builtin:tiny-qwen3-vl", "--tasks", str(tasks), "--manifest", manifest,
             "--training", json.dumps(training), "--out", str(out),
             "--receipt", str(tmp_path / f"model{turns}.json")],
            capture_output=True, text=True,
        )  # fmt: skip
        assert result.returncode == code, result.stderr
        if code:
            (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
            assert (
                "training.grpo: 6 turns of a" in line and "over max_completion_length 128" in line
            )
            assert not (tmp_path / f"model{turns}.json").exists()  # no receipt for a refusal
        else:
            assert "budget: 1 turns on a 128x128 screen need" in result.stdout
