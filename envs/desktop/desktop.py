"""The embedded desktop: task set-up steps, computer_13 actions, screenshot, state and snapshot."""

from __future__ import annotations

import json

from PIL import Image

from envab.envs.desktop.actions import Action, parse_action
from envab.envs.desktop.model import (
    CHAR_W,
    ESCAPED,
    KINDS,
    MAX_TEXT,
    DesktopState,
    Dialog,
    Rect,
    Widget,
)
from envab.envs.desktop.render import THEMES, render
from envab.hashing import canonical_json, sha256_json

SNAPSHOT_MAGIC = b"envab-desktop/1\n"
MIN_SIDE, MAX_SIDE = 64, 1024
DEFAULT_VALUES = {"button": 0, "checkbox": False, "field": "", "list": None}


def screen_of(
    config: list,
    default: tuple[int, int] | None = None,
    smallest: tuple[int, int] = (MIN_SIDE, MIN_SIDE),
    largest: tuple[int, int] = (MAX_SIDE, MAX_SIDE),
) -> tuple[int, int]:
    """The (width, height) a task's set-up asks for (its `screen` step), so a host builds the
    matching desktop: whole pixels within `smallest` to `largest` (this desktop's by default), or
    ValueError. A set-up with no screen step gets `default` (the X desktop's, whose OSWorld tasks
    name none); with no default, it is refused (every task of this desktop names its screen)."""
    for step in config:
        if isinstance(step, dict) and step.get("type") == "screen":
            p = step.get("parameters")
            p = p if isinstance(p, dict) else {}
            size = p.get("width"), p.get("height")
            if not all(type(side) is int for side in size) or not (
                smallest[0] <= size[0] <= largest[0] and smallest[1] <= size[1] <= largest[1]
            ):
                raise ValueError(
                    f"screen {size[0]!r}x{size[1]!r} is not whole pixels within "
                    f"{smallest[0]}x{smallest[1]} to {largest[0]}x{largest[1]}"
                )
            return size
    if default is None:
        raise ValueError("task config has no 'screen' step naming its width and height")
    return default


class Desktop:
    """A synthetic one-window desktop. Deterministic: equal states render to equal pixels."""

    def __init__(self, width: int = 128, height: int = 128):
        for name, side in (("width", width), ("height", height)):
            if not isinstance(side, int) or not MIN_SIDE <= side <= MAX_SIDE:
                raise ValueError(f"desktop {name} must be an integer {MIN_SIDE}..{MAX_SIDE}")
        self._s = DesktopState(width=width, height=height)

    # --- set-up -----------------------------------------------------------------------------

    def setup(self, config: list[dict]) -> None:
        """Run a task's set-up steps in order on the prepared blank desktop."""
        if self._s.title is not None:
            raise ValueError("setup needs the prepared blank desktop; this one is already set up")
        if not isinstance(config, list):
            raise ValueError(f"task config must be a list of steps, got {type(config).__name__}")
        for n, step in enumerate(config):
            kind = step.get("type") if isinstance(step, dict) else None
            handler = _SETUP_STEPS.get(kind)
            if handler is None:
                raise ValueError(f"config step {n}: unknown type {kind!r}")
            params = step.get("parameters", {})
            try:
                handler(self._s, params)
            except (KeyError, TypeError) as e:
                raise ValueError(f"config step {n} ({kind}): missing or bad {e}") from None
            except ValueError as e:
                raise ValueError(f"config step {n} ({kind}): {e}") from None

    # --- actions ----------------------------------------------------------------------------

    def apply(self, action: dict) -> None:
        """Apply one computer_13 action; a malformed one raises ValueError and changes nothing."""
        a = parse_action(action, self._s.width, self._s.height)
        if self._s.status != "running":
            raise ValueError(f"the episode already ended with {self._s.status.upper()}")
        if a.kind == "CLICK":
            for _ in range(a.clicks):
                _click(self._s, a.x, a.y)
        elif a.kind == "TYPING":
            _type(self._s, a.text)
        elif a.kind == "PRESS":
            _press(self._s, a.key)
        elif a.kind == "SCROLL":
            _scroll(self._s, a)
        else:  # DONE / FAIL: recorded, no widget changes
            self._s.status = a.kind.lower()

    # --- reading it back --------------------------------------------------------------------

    def screenshot(self) -> Image.Image:
        return render(self._s)

    def state(self) -> dict:
        return self._s.to_json()

    def state_hash(self) -> str:
        return sha256_json(self.state())

    def snapshot(self) -> bytes:
        return SNAPSHOT_MAGIC + canonical_json(self.state())

    @classmethod
    def restore(cls, blob: bytes) -> Desktop:
        if not isinstance(blob, bytes | bytearray) or not blob.startswith(SNAPSHOT_MAGIC):
            raise ValueError("not a desktop snapshot (bad magic)")
        try:
            data = json.loads(blob[len(SNAPSHOT_MAGIC) :])
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"desktop snapshot is corrupt ({e})") from None
        desktop = cls.__new__(cls)
        desktop._s = DesktopState.from_json(data)
        return desktop


# --- set-up steps --------------------------------------------------------------------------


def _text(value, what: str) -> str:
    if not isinstance(value, str) or not value or not value.isprintable():
        raise ValueError(f"{what} must be a non-empty printable string, got {value!r}")
    return value


def _inside(s: DesktopState, r: Rect, what: str, top: int = 0) -> None:
    if r.x < 0 or r.y < top or r.x + r.w > s.width or r.y + r.h > s.height:
        raise ValueError(f"{what} rect {r.as_list()} leaves the area below y={top} of the screen")


def _step_screen(s: DesktopState, p: dict) -> None:
    if (p["width"], p["height"]) != (s.width, s.height):
        raise ValueError(
            f"task wants a {p['width']}x{p['height']} screen, this desktop is {s.width}x{s.height}"
        )


def _step_window(s: DesktopState, p: dict) -> None:
    if s.title is not None:
        raise ValueError("a window is already open")
    tabs = p["tabs"]
    if not isinstance(tabs, list) or not tabs or len(set(tabs)) != len(tabs):
        raise ValueError(f"tabs must be a non-empty list of distinct names, got {tabs!r}")
    s.title = _text(p["title"], "window title")
    s.tabs = [_text(t, "tab name") for t in tabs]
    s.tab = tabs[0]
    theme = p.get("theme", "light")
    if theme not in THEMES:
        raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {theme!r}")
    s.theme = theme
    if len(tabs) > 1 and s.tab_rects()[-1].x + s.tab_rects()[-1].w > s.width:
        raise ValueError("tab headers do not fit the screen width")


def _step_widget(s: DesktopState, p: dict) -> None:
    if s.title is None:
        raise ValueError("a widget needs a window step before it")
    kind, wid = p["kind"], _text(p["id"], "widget id")
    if kind not in KINDS:
        raise ValueError(f"widget kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if any(w.id == wid for w in s.widgets) or wid == "dialog":
        raise ValueError(f"widget id {wid!r} is used twice")
    tab = p.get("tab", s.tabs[0])
    if tab not in s.tabs:
        raise ValueError(f"widget {wid!r} is on tab {tab!r}, which the window does not have")
    w = Widget(
        id=wid,
        kind=kind,
        tab=tab,
        label=_text(p["label"], "widget label"),
        rect=Rect.of(p["rect"]),
        value=p.get("value", DEFAULT_VALUES[kind]),
        items=[_text(i, "list item") for i in p.get("items", [])],
    )
    _inside(s, w.rect, f"widget {wid!r}", top=s.content_top())
    label_w = len(w.label) * CHAR_W + (14 if kind == "checkbox" else 4)
    if kind != "list" and label_w > w.rect.w:
        raise ValueError(f"widget {wid!r} label {w.label!r} is wider than its rect")
    _check_value(w)
    for other in s.widgets:
        if other.tab == tab and other.rect.overlaps(w.rect):
            raise ValueError(f"widget {wid!r} overlaps widget {other.id!r}")
    s.widgets.append(w)


def _check_value(w: Widget) -> None:
    ok = {
        "button": isinstance(w.value, int) and not isinstance(w.value, bool) and w.value >= 0,
        "checkbox": isinstance(w.value, bool),
        "field": isinstance(w.value, str) and len(w.value) <= MAX_TEXT,
        "list": w.value is None or w.value in w.items,
    }[w.kind]
    if not ok:
        raise ValueError(f"widget {w.id!r} ({w.kind}) cannot hold the value {w.value!r}")
    if w.kind == "list" and (not w.items or len(set(w.items)) != len(w.items)):
        raise ValueError(f"list {w.id!r} needs distinct items")


def _step_dialog(s: DesktopState, p: dict) -> None:
    if s.title is None:
        raise ValueError("a dialog needs a window step before it")
    if s.dialog is not None:
        raise ValueError("a dialog is already open")
    buttons = p["buttons"]
    if not isinstance(buttons, list) or not buttons or len(set(buttons)) != len(buttons):
        raise ValueError(f"dialog buttons must be distinct names, got {buttons!r}")
    d = Dialog(
        message=_text(p["message"], "dialog message"),
        rect=Rect.of(p["rect"]),
        buttons=[_text(b, "dialog button") for b in buttons],
    )
    _inside(s, d.rect, "dialog")
    last = d.button_rects()[-1]
    if len(d.message) * CHAR_W + 8 > d.rect.w or last.x + last.w > d.rect.x + d.rect.w:
        raise ValueError("dialog message or buttons do not fit its rect")
    s.dialog = d


def _step_focus(s: DesktopState, p: dict) -> None:
    wid = p["id"]
    if wid not in [w.id for w in s.shown()]:
        raise ValueError(f"cannot focus {wid!r}: no such widget on the active tab")
    s.focus = wid


_SETUP_STEPS = {
    "screen": _step_screen,
    "window": _step_window,
    "widget": _step_widget,
    "dialog": _step_dialog,
    "focus": _step_focus,
}


# --- actions -------------------------------------------------------------------------------


def _change(s: DesktopState, target: Widget | Dialog, value) -> None:
    """Set a value; the clock ticks only when the value really changes."""
    if target.value != value:
        s.clock += 1
        target.value = value
        target.changed_at = s.clock


def _close_dialog(s: DesktopState, value: str) -> None:
    _change(s, s.dialog, value)
    s.dialog.open = False


def _click(s: DesktopState, x: int, y: int) -> None:
    if s.title is None:
        return
    if s.dialog is not None and s.dialog.open:  # modal: only its buttons answer
        for label, r in zip(s.dialog.buttons, s.dialog.button_rects(), strict=True):
            if r.contains(x, y):
                _close_dialog(s, label)
        return
    if len(s.tabs) > 1:
        for name, r in zip(s.tabs, s.tab_rects(), strict=True):
            if r.contains(x, y):
                if name != s.tab:
                    s.tab, s.focus = name, None
                return
    hit = next((w for w in s.shown() if w.rect.contains(x, y)), None)
    s.focus = hit.id if hit else None
    if hit is None:
        return
    if hit.kind == "button":
        _change(s, hit, hit.value + 1)
    elif hit.kind == "checkbox":
        _change(s, hit, not hit.value)
    elif hit.kind == "list":
        row = hit.row_at(y)
        if row is not None:
            _change(s, hit, hit.items[row])


def _focused(s: DesktopState) -> Widget | None:
    return next((w for w in s.shown() if w.id == s.focus), None)


def _type(s: DesktopState, text: str) -> None:
    w = _focused(s)
    if (s.dialog is None or not s.dialog.open) and w is not None and w.kind == "field":
        _change(s, w, (w.value + text)[:MAX_TEXT])  # like a maxlength input: the rest is dropped


def _press(s: DesktopState, key: str) -> None:
    if s.title is None:
        return
    if s.dialog is not None and s.dialog.open:
        if key == "enter":
            _close_dialog(s, s.dialog.buttons[0])  # the first button is the default
        elif key == "escape":
            _close_dialog(s, ESCAPED)
        return
    shown, w = s.shown(), _focused(s)
    if key == "tab":
        if shown:
            i = shown.index(w) + 1 if w is not None else 0
            s.focus = shown[i % len(shown)].id
    elif key == "escape":
        s.focus = None
    elif w is None:
        return
    elif key in ("enter", "space") and w.kind == "button":
        _change(s, w, w.value + 1)
    elif key == "space" and w.kind == "checkbox":
        _change(s, w, not w.value)
    elif key == "backspace" and w.kind == "field":
        _change(s, w, w.value[:-1])
    elif key in ("up", "down") and w.kind == "list":
        i = w.items.index(w.value) if w.value is not None else -1
        i = max(0, i - 1) if key == "up" else min(len(w.items) - 1, i + 1)
        _change(s, w, w.items[i])
        _scroll_to(w, i)


def _scroll_to(w: Widget, row: int) -> None:
    if row < w.scroll:
        w.scroll = row
    elif row >= w.scroll + w.visible_rows():
        w.scroll = row - w.visible_rows() + 1


def _scroll(s: DesktopState, a: Action) -> None:
    if s.dialog is not None and s.dialog.open:
        return
    if a.x is not None:
        w = next((w for w in s.shown() if w.rect.contains(a.x, a.y)), None)
    else:
        w = _focused(s)
    if w is not None and w.kind == "list":
        top = max(0, len(w.items) - w.visible_rows())
        w.scroll = min(top, max(0, w.scroll - a.dy))
