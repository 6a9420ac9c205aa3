"""An invalid attempt is out of the update: its completion is masked out of every term of TRL's
loss (the advantage, the KL term, the token count that normalises it). Shown on a real generation
batch of the tiny Qwen3-VL model, multi-turn with a screenshot after each action: the loss and
every parameter's gradient with the invalid attempt in the batch equal those of the same batch
with its row removed — and differ when the masking is left out."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from tiny_grpo import empty_prompts, grpo_args, record_batches

from envab.trainer import agent
from envab.trainer import model as pin
from envab.trainer.generation import GuardedGenerationMixin

INSTRUCTION = "Click the button labelled Save"
INVALID = 1  # which attempt of the batch the environment spoils


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    return pin.build_builtin(pin.BuiltinSource(), [INSTRUCTION], out)


class Screen:
    """Scores attempts 1, 0, 1, 0 ... except one, which it spoils: invalid, reward None (as
    trainer/environment.py's ArmEnvironment does for a failed gate)."""

    made = 0

    def reset(self, **row) -> list[dict]:
        self.index = Screen.made
        Screen.made += 1
        self.invalid = self.index == INVALID
        return agent.first_turn({"instruction": INSTRUCTION}, Image.new("RGB", (128, 128), "white"))

    def click(self, x: int, y: int) -> list[dict]:
        """Click the left mouse button at a pixel of the screen.

        Args:
            x: Horizontal pixel coordinate, from the left edge of the screen.
            y: Vertical pixel coordinate, from the top edge of the screen.
        """
        return agent.tool_result(Image.new("RGB", (128, 128), (x % 256, y % 256, 0)))

    def _act(self, name: str, arguments: dict) -> list[dict]:  # a call of no tool this has
        return agent.tool_result(note=f"Refused: unknown tool {name!r}")

    def _reject_completion(self) -> None:
        self.invalid = True

    def get_reward(self) -> float | None:
        return None if self.invalid else float(self.index % 2 == 0)


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """A trainer after one step, and the generation batch that step trained on."""
    from trl import GRPOTrainer

    model, processor = pin.load(tiny)
    args = grpo_args(
        tmp_path_factory.mktemp("trl"),
        processor.tokenizer,
        num_generations=4,
        prompts_per_step=1,
        max_turns=2,
        max_completion_length=128,
    )
    args.max_steps = 1
    args.beta = 0.04  # the KL term: an invalid row must not reach it either
    trainer = type("Trainer", (GuardedGenerationMixin, GRPOTrainer), {})(
        model=model,
        processing_class=processor,
        args=args,
        train_dataset=empty_prompts(4),
        environment_factory=Screen,
    )
    batches = record_batches(trainer)
    Screen.made = 0
    trainer.train()
    return trainer, batches[0]


def without_rows(batch: dict, drop: set[int]) -> dict:
    """The batch with some attempts removed, images and all (TRL's own splitting helpers)."""
    from trl.trainer.utils import split_pixel_values_by_grid, unsplit_pixel_values_by_grid

    split = split_pixel_values_by_grid(batch)
    rows = len(batch["completion_ids"])
    keep = [i for i in range(rows) if i not in drop]
    out = {}
    for key, value in split.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows:
            out[key] = value[keep]
        elif isinstance(value, list) and len(value) == rows:
            out[key] = [value[i] for i in keep]
        else:
            out[key] = value  # num_items_in_batch and other batch-wide values
    return unsplit_pixel_values_by_grid(out)


def loss_and_grads(trainer, batch: dict) -> tuple[float, dict[str, torch.Tensor]]:
    model = trainer.model
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def test_the_spoiled_attempt_is_masked_and_uncounted(trained):
    trainer, batch = trained
    assert int(batch["completion_mask"][INVALID].sum()) == 0
    assert float(batch["advantages"][INVALID]) == 0.0
    valid_tokens = batch["completion_mask"] * batch.get("tool_mask", 1)
    assert int(batch["num_items_in_batch"]) == int(valid_tokens.sum()) > 0


def test_loss_and_gradient_are_those_of_the_batch_without_the_invalid_attempt(trained):
    trainer, batch = trained
    with_row, grads_with = loss_and_grads(trainer, batch)
    without, grads_without = loss_and_grads(trainer, without_rows(batch, {INVALID}))
    assert with_row == pytest.approx(without, rel=1e-5, abs=1e-7)
    assert grads_with.keys() == grads_without.keys() and grads_with
    for name, grad in grads_with.items():
        torch.testing.assert_close(grad, grads_without[name], rtol=1e-4, atol=1e-7, msg=name)


def test_without_the_masking_the_invalid_attempt_would_reach_the_update(trained):
    """The same comparison with the invalid row's tokens left in (what TRL does on its own: a
    reward of None only zeroes the advantage): the KL term and the token count move the loss."""
    trainer, batch = trained
    unmasked = dict(batch)
    unmasked["completion_mask"] = batch["completion_mask"].clone()
    unmasked["completion_mask"][INVALID] = (batch["completion_ids"][INVALID] != 0).to(
        unmasked["completion_mask"].dtype
    )
    tokens = unmasked["completion_mask"] * batch.get("tool_mask", 1)
    unmasked["num_items_in_batch"] = tokens.sum()
    leaked, _ = loss_and_grads(trainer, unmasked)
    clean, _ = loss_and_grads(trainer, without_rows(batch, {INVALID}))
    assert leaked != pytest.approx(clean, rel=1e-5, abs=1e-7)
