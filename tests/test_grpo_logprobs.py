"""GRPO's gradient is taken on the context the policy acted in: the log-probabilities TRL's
GRPOTrainer computes for the loss are, token for token, those of one plain forward pass of the
same conversation (its first screenshot, its turns, the screenshot a click returned, and the turn
after it), one attempt at a time and unpadded.

What this guards: a batch of attempts is left-padded (prompts of different lengths), right-padded
(completions of different lengths), its images concatenated across rows, and Qwen3-VL's
multimodal positions rebuilt from the token ids; a slip in any of these trains the policy on
inputs it never saw, and GRPO then learns slowly or not at all with no error anywhere. Measured
once on the embedded default's warm start: agreement to 1.5e-5 nats on every token
(docs/results/2026-12-03-grpo-on-the-lookup.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from tiny_grpo import arm_run, call_ids, grpo_args

from envab.envs.tasks.build import build
from envab.envs.tasks.local import LocalBackend
from envab.trainer import agent
from envab.trainer import model as pin
from envab.trainer.environment import environment_factory
from envab.trainer.generation import GuardedGenerationMixin

GROUP, PROMPTS = 2, 3


@pytest.fixture(scope="module")
def tasks():
    """One task of each of three families whose instructions differ in length, so the batch's
    prompts do too."""
    built, _ = build(seed=1, per_family=1)
    chosen = [t for t in built if t["family"] in ("click_button", "switch_tab", "sequence3")]
    return {t["id"]: t for t in chosen}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tasks) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    return pin.build_builtin(pin.BuiltinSource(), [t["instruction"] for t in tasks.values()], out)


class Scripted:
    """Every attempt clicks once, at a point of its own (so the completions differ in length and
    each click returns a different screenshot), then ends its second turn with a short reply of
    its own length. TRL parses, runs and tokenises everything as usual."""

    turn = 0

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        tokenizer = self.processing_class.tokenizer
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        turn, self.turn = self.turn, self.turn + 1
        out = []
        for j in range(len(prompt_ids)):
            if turn == 0:
                ids = call_ids(self.processing_class, "click", {"x": 5 + 23 * j, "y": 9 + 19 * j})
            else:
                ids = [*tokenizer.encode("ok " * (1 + j)), end]
            out.append(ids)
        return out, None


def test_trained_log_probs_are_those_of_a_plain_forward_pass(tiny, tasks, tmp_path):
    from trl import GRPOTrainer

    model, processor = pin.load(tiny)
    args = grpo_args(
        tmp_path / "trl",
        processor.tokenizer,
        num_generations=GROUP,
        prompts_per_step=PROMPTS,
        max_turns=1,
        max_completion_length=512,
    )
    args.max_steps = 1
    args.learning_rate = 1e-12  # the step must not change the model the reference pass uses
    run = arm_run(tasks, LocalBackend(), tmp_path, GROUP, max_turns=1, arm="local")
    cls = type("Trainer", (GuardedGenerationMixin, Scripted, GRPOTrainer), {})
    trainer = cls(
        model=model,
        processing_class=processor,
        args=args,
        train_dataset=Dataset.from_list(agent.training_rows(tasks)),
        environment_factory=environment_factory(run),
    )
    seen = {}
    generate, log_probs = trainer._generate, trainer._get_per_token_logps_and_entropies

    def generating(prompts):
        out = generate(prompts)
        seen.setdefault("generated", out)
        return out

    def scoring(model, input_ids, attention_mask, logits_to_keep, *a, **kw):
        out = log_probs(model, input_ids, attention_mask, logits_to_keep, *a, **kw)
        if torch.is_grad_enabled() and "trained" not in seen:  # the loss's own forward
            seen["trained"] = (input_ids, attention_mask, out[0].detach())
        return out

    trainer._generate, trainer._get_per_token_logps_and_entropies = generating, scoring
    trainer.train()

    prompt_ids, completion_ids, tool_mask = seen["generated"][:3]
    images = seen["generated"][6]
    input_ids, attention_mask, trained = seen["trained"]
    assert len({len(p) for p in prompt_ids}) > 1, "prompts of one length: no left padding tested"
    assert len({len(c) for c in completion_ids}) > 1, "completions of one length: no right padding"
    assert all(len(row) == 2 for row in images), "each attempt: its first screen and the click's"

    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    model = trainer.model.eval()
    compared = 0
    for p, c, mask, row_images in zip(prompt_ids, completion_ids, tool_mask, images, strict=True):
        # TRL shuffles a generation batch before the loss: find this attempt's row by its tokens.
        rows = [
            r
            for r in range(input_ids.shape[0])
            if input_ids[r][attention_mask[r].bool()].tolist() == [*p, *c]
        ]
        assert rows, "an attempt the loss never saw"
        ids = torch.tensor([[*p, *c]])
        pixels = processor.image_processor(images=row_images, return_tensors="pt")
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=pixels["pixel_values"],
                image_grid_thw=pixels["image_grid_thw"],
                mm_token_type_ids=(ids == image_pad).long(),
            ).logits[0]
        plain = torch.log_softmax(logits.float(), -1)[len(p) - 1 : -1].gather(
            1, torch.tensor(c)[:, None]
        )[:, 0]
        policy_tokens = torch.tensor(mask, dtype=torch.bool)  # the tool's result is not trained
        assert policy_tokens.sum() < len(c), "no tool result inside the completion"
        got = trained[rows[0], : len(c)]
        assert torch.allclose(got[policy_tokens], plain[policy_tokens], atol=1e-4), (
            f"largest gap {float((got - plain)[policy_tokens].abs().max()):.2e} nats"
        )
        compared += 1
    assert compared == GROUP * PROMPTS
