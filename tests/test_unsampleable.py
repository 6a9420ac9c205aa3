"""Nothing the policy samples crashes a run: a policy that wants a vision placeholder never emits
one, in GRPO (TRL's generation, multi-turn with screenshots) or in evaluation; where a server
ignores the suppression, the attempt is invalid with a named gate; text that spells markup (a
tool name, an instruction, a refused argument) stays text.

The policy "wants" a token through a forward hook on the real model: its last position's logits
get a large bias towards a scripted turn (a click, then `<|video_pad|>` on every later turn), as
a trained policy with a strong preference would. The hook reads the whole sequence, so generation
runs without its cache here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from tiny_grpo import empty_prompts, grpo_args, record_batches

from envab.envs.protocol import Gate, Verdict
from envab.envs.tasks.build import build
from envab.envs.tasks.local import LocalBackend
from envab.eval.episodes import Protocol, play
from envab.trainer import agent
from envab.trainer import model as pin
from envab.trainer.generation import (
    UNSAMPLEABLE,
    Generation,
    GuardedGenerationMixin,
    check_completion,
    quarantine,
    unsampleable_ids,
)

WANTED = "<|video_pad|>"  # what crashed the embedded default's corruption control
BIAS = 60.0  # logit units: far above anything the tiny model's own logits reach


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    return pin.build_builtin(pin.BuiltinSource(), ["Click the button labelled Save"], out)


def test_quarantine_and_the_check_read_only_sampled_tokens():
    forbidden = {7, 9}
    assert quarantine([1, 7, 2, 9], forbidden, 9) == [1, 9, 2, 9]
    # a tool result's screenshot is placeholders too: tool_mask 0 there, so it does not count
    assert not check_completion([1, 7, 7, 2], [1, 0, 0, 1], forbidden)
    assert check_completion([1, 7, 7, 2], [1, 0, 1, 1], forbidden)
    assert check_completion([1, 9], None, forbidden)


def test_every_path_suppresses_the_same_tokens(tiny):
    _, processor = pin.load(tiny)
    tokenizer = processor.tokenizer
    ids = unsampleable_ids(tokenizer)
    assert len(ids) == len(UNSAMPLEABLE)  # the tiny tokenizer has every Qwen3-VL added token
    generation = Generation(1.0, 16)
    assert generation.generate_kwargs(tokenizer)["suppress_tokens"] == ids
    assert generation.trl_kwargs(tokenizer, vllm=False)["suppress_tokens"] == ids
    vllm = Generation(1.0, 16, turn_end="none").trl_kwargs(tokenizer, vllm=True)
    assert [tokenizer.convert_tokens_to_ids(t) for t in vllm["bad_words"]] == ids
    assert generation.settings(tokenizer)["suppressed_tokens"] == list(UNSAMPLEABLE)


def test_markup_spelled_in_text_stays_text(tiny):
    _, processor = pin.load(tiny)
    tokenizer = processor.tokenizer
    note = agent.tool_result(note=f"Refused: unknown tool {WANTED!r}")[0]["text"]
    wanted = tokenizer.convert_tokens_to_ids(WANTED)
    assert wanted not in tokenizer(note)["input_ids"]
    assert wanted in tokenizer(f"Refused: unknown tool {WANTED!r}")["input_ids"]  # unescaped: it is
    task = {"instruction": f"Click {WANTED}"}
    assert wanted not in tokenizer(agent.instruction_text(task))["input_ids"]
    reply = {"role": "assistant", "tool_calls": [{"function": {"arguments": {"text": WANTED}}}]}
    assert "<|" not in str(agent.plain_reply(reply))
    assert agent.plain_text("Click the button labelled Save") == "Click the button labelled Save"


class Wanting:
    """A forward hook that biases the last position towards a scripted turn: the first assistant
    turn clicks, every later one starts with WANTED (then ends)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.assistant = tokenizer("assistant\n", add_special_tokens=False)["input_ids"]
        click = '<tool_call>\n{"name": "click", "arguments": {"x": 5, "y": 5}}\n</tool_call>'
        self.click = tokenizer(click, add_special_tokens=False)["input_ids"]
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.wanted = tokenizer.convert_tokens_to_ids(WANTED)

    def next_token(self, ids: list[int]) -> int:
        n = len(self.assistant)
        turns = [
            i + 1 + n
            for i, t in enumerate(ids)
            if t == self.start and ids[i + 1 : i + 1 + n] == self.assistant
        ]
        if not turns:
            return self.end
        written = ids[turns[-1] :]
        script = self.click + [self.end] if len(turns) == 1 else [self.wanted, self.end]
        return script[len(written)] if len(written) < len(script) else self.end

    def __call__(self, module, args, kwargs, output):
        logits = getattr(output, "logits", None)
        if logits is None:  # the loss's fused pass gives log-probabilities, not logits
            return output
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        for row, ids in enumerate(input_ids.tolist()):
            logits[row, -1, self.next_token(ids)] += BIAS
        return output


def want(model, tokenizer):
    return model.register_forward_hook(Wanting(tokenizer), with_kwargs=True)


# --- evaluation ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def task():
    tasks, _ = build(1, 1, families=["click_button"], layout="templated", templates=2)
    return tasks[0]


def policy_for(tiny):
    from envab.eval.policy import Policy

    policy = Policy(tiny, agent.tool_set("click"), Generation(1.0, 40, turn_end="none"))
    want(policy.model, policy.tokenizer)
    policy.kwargs["use_cache"] = False  # the hook reads the whole sequence
    return policy


PROTOCOL = Protocol(1, (0,), 3, 0, 1.0, 40, turn_end="none")


def test_evaluation_goes_on_and_the_wanted_token_is_never_emitted(tiny, task):
    policy = policy_for(tiny)
    forbidden = set(unsampleable_ids(policy.tokenizer))
    emitted = []
    generate = policy.model.generate

    def recording(**kwargs):
        output = generate(**kwargs)
        emitted.append(output[0][kwargs["input_ids"].shape[1] :].tolist())
        return output

    policy.model.generate = recording
    record = play(policy, LocalBackend(), task, PROTOCOL, seed=0)
    assert len(emitted) >= 2  # the click turn, then the turns that wanted WANTED
    assert not any(set(turn) & forbidden for turn in emitted)
    assert record["verdict"] == Verdict.VALID


def test_a_server_that_ignores_the_suppression_makes_the_episode_invalid(tiny, task):
    policy = policy_for(tiny)
    del policy.kwargs["suppress_tokens"]  # what a server that ignores it would sample
    record = play(policy, LocalBackend(), task, PROTOCOL, seed=0)
    assert record["verdict"] == Verdict.INVALID_COMPLETION
    assert record["failed_gates"] == [Gate.COMPLETION_TOKENS]
    assert record["score"] is None


# --- training ------------------------------------------------------------------------------------


class Screen:
    """An environment that shows a screenshot after every action (the multi-turn path in which
    TRL rebuilds the vision positions from the token ids), scores 1 unless its completion is
    rejected."""

    rejected = 0

    def reset(self, **row) -> list[dict]:
        self.invalid = False
        return agent.first_turn({"instruction": "Click the button labelled Save"}, self._shot())

    def _shot(self) -> Image.Image:
        return Image.new("RGB", (128, 128), "white")

    def _act(self, name: str, arguments: dict) -> list[dict]:
        return agent.tool_result(note=f"Refused: unknown tool {name!r}")

    def click(self, x: int, y: int) -> list[dict]:
        """Click the left mouse button at a pixel of the screen.

        Args:
            x: Horizontal pixel coordinate, from the left edge of the screen.
            y: Vertical pixel coordinate, from the top edge of the screen.
        """
        return agent.tool_result(self._shot())

    def _reject_completion(self) -> None:
        self.invalid = True
        Screen.rejected += 1

    def get_reward(self) -> float | None:
        return None if self.invalid else 1.0  # `invalid` stays set: the trainer reads it


def trainer_for(tiny, tmp_path, guarded: bool, suppress: bool):
    from trl import GRPOTrainer

    model, processor = pin.load(tiny)
    args = grpo_args(
        tmp_path / "trl",
        processor.tokenizer,
        num_generations=2,
        prompts_per_step=1,
        max_turns=2,
        max_completion_length=96,
    )
    args.max_steps = 1
    args.beta = 0.04  # the reference model's forward pass is where the run crashed
    args.generation_kwargs["use_cache"] = False
    if not suppress:
        del args.generation_kwargs["suppress_tokens"]
    want(model, processor.tokenizer)
    cls = type("Trainer", (GuardedGenerationMixin, GRPOTrainer), {}) if guarded else GRPOTrainer
    trainer = cls(
        model=model,
        processing_class=processor,
        args=args,
        train_dataset=empty_prompts(2),
        environment_factory=Screen,
    )
    if not suppress:  # TRL's own default suppresses <|image_pad|> only; lift it too
        trainer.generation_config.suppress_tokens = None
    return trainer


def test_the_unsuppressed_token_crashes_trl_as_it_crashed_the_default(tiny, tmp_path):
    """The cause, reproduced: the wanted placeholder sampled in a tool-calling turn."""
    trainer = trainer_for(tiny, tmp_path, guarded=False, suppress=False)
    with pytest.raises(TypeError, match="'NoneType' object is not an iterator"):
        trainer.train()


def test_training_goes_on_and_the_wanted_token_is_never_emitted(tiny, tmp_path):
    trainer = trainer_for(tiny, tmp_path, guarded=True, suppress=True)
    sampled = []
    single_turn = GuardedGenerationMixin._generate_single_turn

    def recording(self, *args, **kwargs):
        ids, logprobs = single_turn(self, *args, **kwargs)
        sampled.extend(ids)
        return ids, logprobs

    Screen.rejected = 0
    trainer._generate_single_turn = recording.__get__(trainer)
    trainer.train()
    forbidden = set(unsampleable_ids(trainer._tokenizer))
    assert len(sampled) >= 3  # both first turns, and at least one turn after a screenshot
    assert not any(set(turn) & forbidden for turn in sampled)
    assert Screen.rejected == 0
    assert trainer.state.global_step == 1


def test_a_server_that_ignores_the_suppression_gives_invalid_attempts_not_a_crash(tiny, tmp_path):
    trainer = trainer_for(tiny, tmp_path, guarded=True, suppress=False)
    batches = record_batches(trainer)
    Screen.rejected = 0
    trainer.train()
    assert Screen.rejected == 2  # both completions wrote WANTED on their second turn
    assert trainer.state.global_step == 1
    # invalid attempts are masked out of every term of the update, KL and token count included
    assert int(batches[0]["completion_mask"].sum()) == 0
    assert int(batches[0]["num_items_in_batch"]) == 0
