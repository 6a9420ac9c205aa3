"""A computer_13 action as QMP `input-send-event` batches, plus the frame the guest agent needs.

Everything the action says (where, which keys, how far) goes through the virtual tablet and
keyboard. The frame only says how to group what the agent reads: the kind of action and how many
atoms (clicks, key presses, wheel notches) make it; see envs/qemu/guest/agent.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from envab.envs.desktop.actions import Action
from envab.envs.qemu.keymap import CHAR_TO_QCODE, PRESS_KEYS, SHIFT_QCODE

ABS_SPAN = 0x8000  # QEMU's absolute pointer axis runs 0..0x7fff across the whole display


@dataclass(frozen=True)
class Framed:
    batches: list[list[dict]]  # one input-send-event call each
    frame: dict  # {"kind", "n", "at"} for the agent's `act`


def to_abs(pixel: int, span_px: int) -> int:
    """The absolute axis value whose pixel, as the guest computes it (v * span // 0x8000), is
    `pixel`: the middle of the pixel's interval, so rounding cannot move it."""
    return ((2 * pixel + 1) * ABS_SPAN) // (2 * span_px)


def _key(qcode: str, down: bool) -> dict:
    return {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": qcode}}}


def _button(button: str, down: bool) -> dict:
    return {"type": "btn", "data": {"down": down, "button": button}}


def _move(x: int, y: int, fb: tuple[int, int]) -> list[dict]:
    return [
        {"type": "abs", "data": {"axis": "x", "value": to_abs(x, fb[0])}},
        {"type": "abs", "data": {"axis": "y", "value": to_abs(y, fb[1])}},
    ]


def _tap(qcode: str, shift: bool = False) -> list[dict]:
    keys = [_key(qcode, True), _key(qcode, False)]
    return [_key(SHIFT_QCODE, True), *keys, _key(SHIFT_QCODE, False)] if shift else keys


def frame(action: Action, fb: tuple[int, int]) -> Framed:
    """The input batches and the agent frame for one parsed action on a display of size `fb`."""
    if action.kind == "CLICK":
        press = [*_move(action.x, action.y, fb), _button("left", True), _button("left", False)]
        return Framed([press] * action.clicks, {"kind": "CLICK", "n": action.clicks})
    if action.kind == "TYPING":
        batches = [_tap(*CHAR_TO_QCODE[c]) for c in action.text]
        return Framed(batches, {"kind": "TYPING", "n": len(action.text)})
    if action.kind == "PRESS":
        return Framed([_tap(PRESS_KEYS[action.key][0])], {"kind": "PRESS", "n": 1})
    if action.kind == "SCROLL":
        button = "wheel-up" if action.dy > 0 else "wheel-down"  # dy > 0 scrolls up
        notch = [_button(button, True), _button(button, False)]
        at = action.x is not None
        batches = ([_move(action.x, action.y, fb)] if at else []) + [notch] * abs(action.dy)
        return Framed(batches, {"kind": "SCROLL", "n": abs(action.dy), "at": at})
    return Framed([], {"kind": action.kind, "n": 0})  # DONE / FAIL: nothing to type
