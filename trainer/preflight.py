"""Pre-flight checks, before a run's first GRPO step: what would otherwise fail silently for hours.

The first failure every open VLM-RL stack reports is a policy that never sees its screenshots in
multi-turn rollouts (a chat template that drops tool-message images, an engine that loses them);
the second, turns silently cut because the completion budget cannot hold them. Each check runs on
the trainer as built (TRL's own tokenisation of a tool result, its own response parser), with a
synthetic screenshot of the task's screen size, and touches no environment and draws no random
number, so a run's batches are what they would have been without it:

- `tool_images_reach_model`: a tool result's screenshot reaches the model as the visual tokens
  the image processor makes of it (TRL's `_get_tool_suffix_ids`, the tokens appended after each
  tool call);
- `screenshot_changes_logits`: the policy's next-token logits after a first turn differ between
  the screenshot and a black one of the same size (a vision tower that is not wired in reads no
  image);
- `tool_call_round_trips`: a tool call rendered by the chat template parses back, with TRL's
  parser, to the same name and arguments;
- `completion_budget_fits`: `max_turns` turns of the shortest call and its tool result fit
  `max_completion_length` as TRL 1.16 counts it (tool results count against the completion
  budget; a turn that would overrun it is dropped, and the episode ends there).

The results are recorded in run.json (`preflight`); any failure refuses the run in one line.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Mapping

import torch
from PIL import Image, ImageDraw
from trl.chat_template_utils import parse_response

from envab.envs.desktop import screen_of as pillow_screen_of
from envab.envs.xdesktop.evaluate import screen_of as xdesktop_screen_of
from envab.errors import Refusal
from envab.trainer import agent

PROBE_CALL = ("click", {"x": 12, "y": 34})  # the shortest call every tool set has


class PreflightFailed(Refusal, RuntimeError):
    """A pre-flight check failed: the run would not train what it says."""


def screen_size(task: Mapping) -> tuple[int, int]:
    """The size the task's screenshots will have: its Pillow screen, else the X desktop's."""
    config = task.get("config") or []
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return tuple(pillow_screen_of(config))
    return xdesktop_screen_of(config)


def probe_screenshot(size: tuple[int, int]) -> Image.Image:
    """A screenshot with something on it: a window-like box and a line of marks."""
    image = Image.new("RGB", size, (236, 236, 236))
    draw = ImageDraw.Draw(image)
    w, h = size
    draw.rectangle((w // 8, h // 8, 7 * w // 8, 7 * h // 8), fill=(40, 90, 160), outline=(0, 0, 0))
    for i in range(0, w, max(4, w // 16)):
        draw.line((i, h // 2, i + w // 32, h // 2 + h // 16), fill=(250, 200, 20), width=2)
    return image


def visual_tokens(processor, image: Image.Image) -> int:
    """The visual tokens the processor makes of one image (grid cells over the merge size)."""
    grid = processor.image_processor(images=[image], return_tensors="pt")["image_grid_thw"]
    merge = processor.image_processor.merge_size
    return int(grid.prod().item()) // (merge * merge)


def tool_images_reach_model(trainer, processor, image: Image.Image) -> dict:
    expected = visual_tokens(processor, image)
    try:
        suffix = trainer._get_tool_suffix_ids([agent.tool_message(PROBE_CALL[0], image)])
    except (ValueError, KeyError, TypeError) as e:  # the processor finds images and no place
        return {
            "check": "tool_images_reach_model",
            "ok": False,
            "visual_tokens": None,
            "expected": expected,
            "tool_result_tokens": None,
            "detail": f"a tool result with a screenshot does not tokenise ({e}): the chat "
            "template or processor drops tool-message images",
        }
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    got = suffix.count(pad)
    return {
        "check": "tool_images_reach_model",
        "ok": got == expected,
        "visual_tokens": got,
        "expected": expected,
        "tool_result_tokens": len(suffix),
        "detail": None
        if got == expected
        else f"a tool result's screenshot reaches the model as {got} visual tokens, not {expected}"
        " (the chat template or processor drops tool-message images)",
    }


def screenshot_changes_logits(model, processor, task: Mapping, image: Image.Image) -> dict:
    def last_logits(screenshot: Image.Image) -> torch.Tensor:
        inputs = processor.apply_chat_template(
            agent.task_prompt(task, screenshot),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        ).to(model.device)
        return model(**inputs).logits[0, -1].float()

    was_training = model.training
    model.eval()  # no dropout: the forward passes draw no random number
    try:
        with torch.no_grad():
            difference = (last_logits(image) - last_logits(Image.new("RGB", image.size))).abs()
    finally:
        model.train(was_training)
    changed = float(difference.max().item())
    return {
        "check": "screenshot_changes_logits",
        "ok": changed > 0.0,
        "max_logit_change": changed,
        "detail": None
        if changed > 0.0
        else "the next-token logits are the same with the screenshot and a black one: the "
        "policy does not read its screenshots",
    }


def tool_call_round_trips(trainer, processor, tools) -> dict:
    name, arguments = PROBE_CALL
    user = [{"role": "user", "content": [{"type": "text", "text": "probe"}]}]
    prompt = processor.apply_chat_template(user, add_generation_prompt=True, tokenize=True)
    full = processor.apply_chat_template(
        [*user, agent.assistant_call(name, arguments)], tokenize=True
    )
    prompt, full = _unbatched(prompt), _unbatched(full)
    parsed = parse_response(trainer._tokenizer, full[len(prompt) :], prefix=prompt, tools=tools)
    calls = [
        (c.get("function", {}).get("name"), c.get("function", {}).get("arguments"))
        for c in parsed.get("tool_calls") or []
    ]
    ok = calls == [(name, arguments)]
    return {
        "check": "tool_call_round_trips",
        "ok": ok,
        "call_tokens": len(full) - len(prompt),
        "detail": None
        if ok
        else f"the call {name}({arguments}) as the template renders it parses back as {calls}",
    }


def completion_budget_fits(
    call_tokens: int, tool_result_tokens: int, max_turns: int, max_completion_length: int
) -> dict:
    needed = max_turns * (call_tokens + tool_result_tokens) + 1  # and one token to end on
    ok = needed <= max_completion_length
    return {
        "check": "completion_budget_fits",
        "ok": ok,
        "needed": needed,
        "max_completion_length": max_completion_length,
        "detail": None
        if ok
        else f"{max_turns} turns of a {call_tokens}-token call and a {tool_result_tokens}-token "
        f"tool result (its screenshot included) need {needed} tokens, over max_completion_length "
        f"{max_completion_length}: TRL drops the turns past it. Raise max_completion_length, "
        "lower max_turns or the screenshots' pixels",
    }


def tool_result_tokens(processor, image: Image.Image) -> int:
    """The tokens TRL 1.16 appends for one tool result with `image`, from the processor alone
    (TRL's own `_get_tool_suffix_ids`, on what it reads of a trainer): for the freeze, before
    any model is loaded."""
    from trl import GRPOTrainer

    trainer = types.SimpleNamespace(
        _is_vlm=True,
        processing_class=processor,
        chat_template=None,
        chat_template_kwargs={},
        _tokenizer=processor.tokenizer,
    )
    message = agent.tool_message(PROBE_CALL[0], image)
    return len(GRPOTrainer._get_tool_suffix_ids(trainer, [message]))


def call_tokens(processor) -> int:
    """The tokens of the shortest tool call as the chat template renders an assistant turn."""
    user = [{"role": "user", "content": [{"type": "text", "text": "probe"}]}]
    prompt = processor.apply_chat_template(user, add_generation_prompt=True, tokenize=True)
    full = processor.apply_chat_template([*user, agent.assistant_call(*PROBE_CALL)], tokenize=True)
    return len(_unbatched(full)) - len(_unbatched(prompt))


def budget_at_freeze(
    processor, tasks: list[Mapping], max_turns: int, max_completion_length: int
) -> dict:
    """`completion_budget_fits` on the largest screen among `tasks`, counted from the processor
    alone (the pinned model's, with the run's pixel bounds), so a pre-registration whose turns
    cannot fit is refused at freeze rather than at its first step."""
    sizes = {screen_size(t) for t in tasks}
    largest = max(sizes, key=lambda size: size[0] * size[1])
    result = tool_result_tokens(processor, probe_screenshot(largest))
    check = completion_budget_fits(call_tokens(processor), result, max_turns, max_completion_length)
    return {**check, "screen": list(largest), "tool_result_tokens": result}


def _unbatched(ids):
    return ids[0] if ids and isinstance(ids[0], list) else ids


def run(trainer, processor, task: Mapping, max_turns: int, max_completion_length: int) -> list:
    """Every check on `task`'s screen size; PreflightFailed naming the first that failed."""
    image = probe_screenshot(screen_size(task))
    tools = next(iter(getattr(trainer, "_env_tools", {}).values()), None) or trainer.tools
    checks: list[dict] = []

    def passed(check: dict) -> dict:
        check["screen"] = list(image.size)
        checks.append(check)
        if not check["ok"]:
            raise PreflightFailed(f"pre-flight {check['check']}: {check['detail']}")
        return check

    images = passed(tool_images_reach_model(trainer, processor, image))
    passed(screenshot_changes_logits(trainer.model, processor, task, image))
    call = passed(tool_call_round_trips(trainer, processor, tools))
    passed(
        completion_budget_fits(
            call["call_tokens"], images["tool_result_tokens"], max_turns, max_completion_length
        )
    )
    return checks
