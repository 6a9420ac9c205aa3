"""The agent's side of the recipe, in ONE place: its tools, the prompt it sees, and how a tool
call becomes an OSWorld computer_13 action.

Training (trainer/environment.py for GRPO, trainer/sft.py for the warm start) and the held-out
evaluation (eval/) all import this module, so every stage renders the same prompt for a task and
the same message for a tool result. Changing the recipe (tool set, prompt wording, action mapping)
is an edit here and nowhere else; the code pins then make it a new frozen experiment.

- `ToolSet` (`tool_set(name)`): the tools, plain functions with Google-style docstrings, which is
  what `apply_chat_template(tools=...)` and TRL turn into JSON schemas. Their bodies never run:
  a stage calls `tools.action_for(name, arguments)` and steps its session instead.
- `task_prompt(task, screenshot)`: the conversation a task starts with (the environment's first
  screenshot, then the instruction), exactly as TRL builds it from a `dataset_row` whose empty
  first turn `reset()` fills with `first_turn(task, screenshot)`.
- `tool_message(name, screenshot)`: the message a tool result becomes, exactly as TRL appends it
  (`{"role": "tool", "name": ..., "content": <the tool's list of content blocks>}`).
- `first_screenshot(task)`: the task's first screen rendered in-process, for arms that promise
  deterministic screens (their reset must show exactly this) and for the Pillow desktop's tools.
"""

import hashlib
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from PIL import Image

from envab.envs.desktop import Desktop, screen_of
from envab.envs.protocol import check_action

# --- the tools -----------------------------------------------------------------------------------
# Names and docstrings are what the model reads (they are rendered into the system prompt); the
# tiny model's tokenizer was trained on the same names (trainer/tiny_model.py).


def click(x: int, y: int):
    """Click the left mouse button at a pixel of the screen.

    Args:
        x: Horizontal pixel coordinate, from the left edge of the screen.
        y: Vertical pixel coordinate, from the top edge of the screen.
    """


def double_click(x: int, y: int):
    """Double-click the left mouse button at a pixel of the screen.

    Args:
        x: Horizontal pixel coordinate, from the left edge of the screen.
        y: Vertical pixel coordinate, from the top edge of the screen.
    """


def type_text(text: str):
    """Type text with the keyboard into the focused element.

    Args:
        text: The text to type.
    """


def press(key: str):
    """Press and release one key.

    Args:
        key: The key name: enter, tab, backspace, escape, space, up or down.
    """


def hotkey(keys: list[str]):
    """Press a key combination: hold each key in order, then release them.

    Args:
        keys: The keys, modifiers first, e.g. ["ctrl", "s"].
    """


def wait(seconds: int):
    """Wait for the screen to change, e.g. while an application starts.

    Args:
        seconds: How long to wait, from 1 to 5.
    """


def scroll(x: int, y: int, dy: int):
    """Scroll the mouse wheel over a pixel of the screen.

    Args:
        x: Horizontal pixel coordinate, from the left edge of the screen.
        y: Vertical pixel coordinate, from the top edge of the screen.
        dy: Wheel clicks; positive scrolls down, negative scrolls up.
    """


def done():
    """Declare the task finished."""


def fail():
    """Declare the task impossible to finish."""


@dataclass(frozen=True)
class ToolSet:
    """The tools a run shows its policy, a value passed to every stage that renders a prompt or
    plays a call. Kept in name order: TRL lists an environment's tool methods by name
    (`inspect.getmembers`), so the evaluation and the warm start render them in the same order."""

    name: str
    tools: tuple[Callable, ...]

    def __post_init__(self):
        object.__setattr__(self, "tools", tuple(sorted(self.tools, key=lambda t: t.__name__)))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tool.__name__ for tool in self.tools)

    def action_for(self, name: str, arguments: Mapping | None) -> dict:
        """The computer_13 action of one tool call; ValueError (one line) for a wrong call."""
        tool = next((t for t in self.tools if t.__name__ == name), None)
        if tool is None:
            raise ValueError(f"unknown tool {name!r}; tools: {', '.join(self.names)}")
        # A sampled call's arguments can be any JSON value: an object with text keys, or refused.
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
            raise ValueError(f"{name}: arguments must be an object, got {arguments!r:.80}")
        arguments = dict(arguments)
        expected = tool.__annotations__
        if missing := sorted(set(expected) - set(arguments)):
            raise ValueError(f"{name}: missing argument(s) {', '.join(missing)}")
        if extra := sorted(set(arguments) - set(expected)):
            raise ValueError(f"{name}: unexpected argument(s) {', '.join(extra)}")
        for arg, typ in expected.items():
            value = arguments[arg]
            item = typing.get_args(typ)[0] if typing.get_origin(typ) is list else None
            base = list if item else typ
            if not isinstance(value, base) or isinstance(value, bool):  # True is an int in Python
                raise ValueError(f"{name}: {arg} must be {_type_name(typ)}, got {value!r}")
            if item and not all(isinstance(v, item) for v in value):
                raise ValueError(f"{name}: {arg} must be {_type_name(typ)}, got {value!r}")
        if name == "hotkey" and not 1 <= len(arguments["keys"]) <= MAX_HOTKEY_KEYS:
            raise ValueError(f"hotkey: keys must name 1 to {MAX_HOTKEY_KEYS} keys")
        if name == "wait" and not 1 <= arguments["seconds"] <= MAX_WAIT_S:
            raise ValueError(f"wait: seconds must be 1 to {MAX_WAIT_S}")
        return check_action(_ACTIONS[name](**arguments))


def _type_name(typ) -> str:
    return getattr(typ, "__name__", str(typ)) if typing.get_origin(typ) is None else str(typ)


# Bounds on what a sampled call may ask of an environment: a wait holds the rollout, so it is
# short (the X desktop's server caps it at 5 s too); a hotkey is a chord, not a sequence.
MAX_WAIT_S = 5
MAX_HOTKEY_KEYS = 4


# "computer_13" covers every family; "click" (click and done) covers the single-click families
# (click_button, also in the templated layout) and renders a system prompt about a third as long,
# which makes each generation and training step on the tiny CPU model that much cheaper.
TOOL_SETS = {
    "computer_13": ToolSet(
        "computer_13",
        (click, double_click, type_text, press, hotkey, scroll, wait, done, fail),
    ),
    "click": ToolSet("click", (click, done)),
}
DEFAULT_TOOL_SET = "computer_13"


def tool_set(name: str) -> ToolSet:
    """The tool set config training.tools names; ValueError for an unknown name."""
    if name not in TOOL_SETS:
        raise ValueError(f"unknown tool set {name!r}; tool sets: {', '.join(TOOL_SETS)}")
    return TOOL_SETS[name]


def _to_action(kind: str, **parameters) -> dict:
    return {"action_type": kind, "parameters": parameters}


# Tool name -> its computer_13 action. Arguments were checked against the tool's signature first.
_ACTIONS = {
    "click": lambda x, y: _to_action("CLICK", x=x, y=y),
    "double_click": lambda x, y: _to_action("DOUBLE_CLICK", x=x, y=y),
    "type_text": lambda text: _to_action("TYPING", text=text),
    "press": lambda key: _to_action("PRESS", key=key),
    "hotkey": lambda keys: _to_action("HOTKEY", keys=list(keys)),
    "wait": lambda seconds: _to_action("WAIT", seconds=seconds),
    "scroll": lambda x, y, dy: _to_action("SCROLL", x=x, y=y, dx=0, dy=dy),
    "done": lambda: _to_action("DONE"),
    "fail": lambda: _to_action("FAIL"),
}
assert set(_ACTIONS) == set(TOOL_SETS["computer_13"].names), "one action mapping per tool"


# --- decoding -------------------------------------------------------------------------------------
# A turn is one tool call: right after its `</tool_call>` the turn ends (`<|im_end|>`), so the
# environment answers each action before the policy picks the next; without it the tiny policy's
# turns run on after the call ("</tool_call></tool_call>..." to max_completion_length) and neither
# end nor learn (docs/results/2026-11-29-embedded-default-v5-learns.md). A sequence bias, not a
# stop token: the turn still ends with the end-of-turn token, so the conversation TRL builds for
# the next turn is the one the chat template (and the evaluation) renders. transformers' generate
# takes it; vLLM has no sequence bias, so a GPU run under vLLM leaves it out (an
# instruction-tuned model ends its turns itself).
END_OF_CALL = "</tool_call>"
TURN_END_BIAS = 100.0  # logit units: the end-of-turn token is then all but certain


def turn_generation_kwargs(tokenizer) -> dict:
    """transformers generation settings that end a turn right after its first tool call."""
    end_of_call = tokenizer.convert_tokens_to_ids(END_OF_CALL)
    if not isinstance(end_of_call, int) or end_of_call == tokenizer.unk_token_id:
        raise ValueError(f"the tokenizer has no single {END_OF_CALL} token")
    return {"sequence_bias": [[[end_of_call, tokenizer.eos_token_id], TURN_END_BIAS]]}


# --- the prompt ----------------------------------------------------------------------------------


def plain_text(text: str) -> str:
    """Text that reaches the prompt from outside the policy's sampler (a task's instruction, a
    tool's note that echoes the policy's arguments), kept from becoming markup: the chat template
    tokenizes "<|video_pad|>" written in text as the video placeholder itself, which crashes the
    forward pass, and "<|im_start|>" as a new turn. Text without "<|" is unchanged."""
    return text.replace("<|", "< |")


def plain_reply(reply: Mapping) -> dict:
    """A parsed assistant turn as it goes back into a conversation that is rendered anew (the
    evaluation's), its text kept from becoming markup (`plain_text`). Training concatenates token
    ids and never re-reads the policy's text."""

    def plain(value):
        if isinstance(value, str):
            return plain_text(value)
        if isinstance(value, Mapping):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return plain(reply)


def instruction_text(task: Mapping) -> str:
    """The text of the first user turn (the screenshot goes before it)."""
    return plain_text(task["instruction"])


def dataset_row(task: Mapping) -> dict:
    """One GRPO dataset row: an empty first user turn that the environment's `reset` fills with
    `first_turn(task, screenshot)` (TRL appends what reset returns to the last user message),
    so the first screenshot is the arm's own; `task_id` reaches `reset`."""
    return {"prompt": [{"role": "user", "content": []}], "task_id": task["id"]}


def first_turn(task: Mapping, screenshot: Image.Image | None) -> list[dict]:
    """The first user turn's content: the environment's first screenshot, then the instruction.
    An environment that failed before showing one gets a black screen of the task's size in its
    place: TRL hands the processor one image list for the whole batch, which cannot mix prompts
    with and without images, and the attempt is invalid (no reward, no advantage) anyway."""
    if screenshot is None:
        screenshot = Image.new("RGB", placeholder_size(task))
    return [
        {"type": "image", "image": screenshot},
        {"type": "text", "text": instruction_text(task)},
    ]


def placeholder_size(task: Mapping) -> tuple[int, int]:
    """The task's screen size where its set-up names one (the Pillow desktop's), else 128 x 128."""
    try:
        return tuple(screen_of(task["config"]))
    except (ValueError, KeyError, TypeError):
        return (128, 128)


def task_prompt(task: Mapping, screenshot: Image.Image) -> list[dict]:
    """The conversation a task starts with: first screenshot, then the instruction."""
    return [{"role": "user", "content": first_turn(task, screenshot)}]


def tool_result(screenshot: Image.Image | None = None, note: str | None = None) -> list[dict]:
    """What a tool returns: the new screenshot, and/or a short note (a refused call, the end)."""
    blocks = []
    if screenshot is not None:
        blocks.append({"type": "image", "image": screenshot})
    if note is not None:
        blocks.append({"type": "text", "text": plain_text(note)})
    if not blocks:
        raise ValueError("a tool result needs a screenshot or a note")
    return blocks


def tool_message(name: str, screenshot: Image.Image | None = None, note: str | None = None) -> dict:
    """The message a tool result becomes in the conversation, exactly as TRL appends it."""
    return {"role": "tool", "name": name, "content": tool_result(screenshot, note)}


def assistant_call(name: str, arguments: Mapping) -> dict:
    """The assistant turn that calls one tool (for demonstrations; TRL parses the model's own)."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": dict(arguments)}}
        ],
    }


def call_for(action: Mapping, tools: ToolSet) -> tuple[str, dict]:
    """The tool call of `tools` that performs a computer_13 action (the inverse of
    `ToolSet.action_for`), for turning oracle solutions into demonstrations."""
    action = check_action(action)
    p = action["parameters"]
    kind = action["action_type"]
    if kind in ("CLICK", "DOUBLE_CLICK"):
        call = ("click" if kind == "CLICK" else "double_click", {"x": p["x"], "y": p["y"]})
    elif kind == "TYPING":
        call = ("type_text", {"text": p["text"]})
    elif kind == "PRESS":
        call = ("press", {"key": p["key"]})
    elif kind == "HOTKEY":
        call = ("hotkey", {"keys": p["keys"]})
    elif kind == "WAIT":
        call = ("wait", {"seconds": p.get("seconds")})
    elif kind == "SCROLL":
        call = ("scroll", {"x": p.get("x"), "y": p.get("y"), "dy": p["dy"]})
    else:
        call = (kind.lower(), {})
    if tools.action_for(*call) != action:  # e.g. a CLICK with a button or a SCROLL with dx
        raise ValueError(f"{kind}: no tool call reproduces this action exactly")
    return call


# --- the first screen ----------------------------------------------------------------------------


def first_screenshot(task: Mapping, prefix: Sequence[Mapping] = ()) -> Image.Image:
    """The task's first screen, rendered in-process from its set-up and the prefix actions
    played before a group (no environment needed)."""
    desktop = Desktop(*screen_of(task["config"]))
    desktop.setup(task["config"])
    for action in prefix:
        desktop.apply(check_action(action))
    return desktop.screenshot().convert("RGB")


def screenshot_sha256(image: Image.Image) -> str:
    """Digest of the pixels (not of an encoding), so a PNG round trip keeps it."""
    rgb = image.convert("RGB")
    header = f"{rgb.width}x{rgb.height}:".encode()
    return hashlib.sha256(header + rgb.tobytes()).hexdigest()


def training_rows(tasks: Mapping[str, Mapping]) -> list[dict]:
    """GRPO dataset rows for `tasks` (id -> task), in id order."""
    return [dataset_row(tasks[task_id]) for task_id in sorted(tasks)]


def rendered_first_screens(
    tasks: Mapping[str, Mapping], prefix: Sequence[Mapping] = ()
) -> dict[str, str]:
    """Each task's first screen rendered in-process (after the prefix), as a digest: what an arm
    that promises deterministic screens (`deterministic_screens`) must show at reset."""
    return {tid: screenshot_sha256(first_screenshot(t, prefix)) for tid, t in tasks.items()}
