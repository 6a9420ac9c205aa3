"""OSWorld computer_13 action dicts, checked once at the edge and turned into typed actions.

Supported: CLICK, DOUBLE_CLICK, TYPING, PRESS, SCROLL, DONE, FAIL. Coordinates are pixels.
SCROLL follows pyautogui's sign: dy > 0 scrolls up (towards the first row), dy < 0 down.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

KEYS = ("enter", "tab", "backspace", "escape", "space", "up", "down")
KEY_ALIASES = {"return": "enter", "esc": "escape", " ": "space"}  # pyautogui spellings
TYPABLE = set(string.ascii_letters + string.digits + string.punctuation + " ")
MAX_TYPING = 64


@dataclass(frozen=True)
class Action:
    kind: str  # CLICK | TYPING | PRESS | SCROLL | DONE | FAIL
    x: int | None = None
    y: int | None = None
    clicks: int = 1
    text: str = ""
    key: str = ""
    dy: int = 0


def _int(params: dict, name: str, kind: str) -> int:
    v = params.get(name)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{kind} needs an integer parameter {name!r}, got {v!r}")
    return v


def _point(params: dict, kind: str, width: int, height: int) -> tuple[int, int]:
    x, y = _int(params, "x", kind), _int(params, "y", kind)
    if not (0 <= x < width and 0 <= y < height):
        raise ValueError(f"{kind} at ({x}, {y}) lies outside the {width}x{height} screen")
    return x, y


def parse_action(action: dict, width: int, height: int) -> Action:
    """One computer_13 dict -> Action; anything malformed raises ValueError with one line."""
    if not isinstance(action, dict):
        raise ValueError(f"an action must be a dict, got {type(action).__name__}")
    kind = action.get("action_type")
    params = action.get("parameters", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"{kind} parameters must be a dict, got {type(params).__name__}")
    if kind in ("CLICK", "DOUBLE_CLICK"):
        x, y = _point(params, kind, width, height)
        button = params.get("button", "left")
        if button != "left":
            raise ValueError(f"{kind} supports the left button only, got {button!r}")
        clicks = 2 if kind == "DOUBLE_CLICK" else params.get("num_clicks", 1)
        if clicks not in (1, 2, 3) or isinstance(clicks, bool):
            raise ValueError(f"CLICK num_clicks must be 1, 2 or 3, got {clicks!r}")
        return Action("CLICK", x=x, y=y, clicks=clicks)
    if kind == "TYPING":
        text = params.get("text")
        if not isinstance(text, str) or not text:
            raise ValueError(f"TYPING needs a non-empty string 'text', got {text!r}")
        if len(text) > MAX_TYPING:
            raise ValueError(f"TYPING text is {len(text)} characters, at most {MAX_TYPING}")
        bad = sorted(set(text) - TYPABLE)
        if bad:
            raise ValueError(f"TYPING text holds untypable characters {''.join(bad)!r}")
        return Action("TYPING", text=text)
    if kind == "PRESS":
        key = params.get("key")
        if isinstance(key, str):
            key = KEY_ALIASES.get(key.lower(), key.lower())
        if key not in KEYS:
            raise ValueError(f"PRESS key must be one of {', '.join(KEYS)}, got {key!r}")
        return Action("PRESS", key=key)
    if kind == "SCROLL":
        dy = _int(params, "dy", kind)
        if "dx" in params:
            _int(params, "dx", kind)  # computer_13 has it; nothing here scrolls sideways
        if "x" in params or "y" in params:
            x, y = _point(params, kind, width, height)
            return Action("SCROLL", x=x, y=y, dy=dy)
        return Action("SCROLL", dy=dy)
    if kind in ("DONE", "FAIL"):
        return Action(kind)
    raise ValueError(
        f"unsupported action_type {kind!r} (CLICK, DOUBLE_CLICK, TYPING, PRESS, SCROLL, DONE, FAIL)"
    )
