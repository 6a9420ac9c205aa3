"""The desktop's state as typed data: one window of tabbed widgets and an optional modal dialog.

Everything the screen shows is in this state (layout included), so the state alone fixes the
rendering, the snapshot and the hash. Widget `value`s are what tasks change and checkers read;
`focus`, `tab` and list `scroll` are view state that any action may change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STATE_VERSION = 1
KINDS = ("button", "checkbox", "field", "list")
DIALOG_ID = "dialog"
ESCAPED = "escape"  # the dialog's value when it was dismissed with the Escape key
MAX_TEXT = 32  # characters a text field holds

# Geometry shared by layout (the task factory) and rendering, in pixels.
CHAR_W, CHAR_H = 6, 11  # Pillow's built-in bitmap font is monospaced 6x11
TITLE_H = 13
TAB_H = 13
ROW_H = 12  # one list row


@dataclass(frozen=True)
class Rect:
    x: int
    y: int
    w: int
    h: int

    def contains(self, x: int, y: int) -> bool:
        return self.x <= x < self.x + self.w and self.y <= y < self.y + self.h

    def overlaps(self, other: Rect) -> bool:
        return not (
            self.x + self.w <= other.x
            or other.x + other.w <= self.x
            or self.y + self.h <= other.y
            or other.y + other.h <= self.y
        )

    def centre(self) -> tuple[int, int]:
        return self.x + self.w // 2, self.y + self.h // 2

    def as_list(self) -> list[int]:
        return [self.x, self.y, self.w, self.h]

    @classmethod
    def of(cls, xywh) -> Rect:
        if not (isinstance(xywh, list | tuple) and len(xywh) == 4):
            raise ValueError(f"rect must be [x, y, w, h], got {xywh!r}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in xywh):
            raise ValueError(f"rect must hold integers, got {xywh!r}")
        if xywh[2] <= 0 or xywh[3] <= 0:
            raise ValueError(f"rect must have positive size, got {xywh!r}")
        return cls(*xywh)


@dataclass
class Widget:
    """button: value = times pressed; checkbox: checked; field: text; list: selected item."""

    id: str
    kind: str
    tab: str
    label: str
    rect: Rect
    value: int | bool | str | None
    items: list[str] = field(default_factory=list)  # list rows (lists only)
    scroll: int = 0  # first visible list row (lists only)
    changed_at: int | None = None  # desktop clock at the last change of value

    def visible_rows(self) -> int:
        """List rows shown below the list's label row."""
        return max(1, (self.rect.h - 2) // ROW_H - 1)

    def row_at(self, y: int) -> int | None:
        """The item index a click at pixel row y lands on, if any."""
        row = (y - self.rect.y - 1) // ROW_H - 1
        if not 0 <= row < self.visible_rows() or self.scroll + row >= len(self.items):
            return None
        return self.scroll + row

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "tab": self.tab,
            "label": self.label,
            "rect": self.rect.as_list(),
            "value": self.value,
            "items": list(self.items),
            "scroll": self.scroll,
            "changed_at": self.changed_at,
        }

    @classmethod
    def from_json(cls, d: dict) -> Widget:
        return cls(
            id=d["id"],
            kind=d["kind"],
            tab=d["tab"],
            label=d["label"],
            rect=Rect.of(d["rect"]),
            value=d["value"],
            items=list(d["items"]),
            scroll=d["scroll"],
            changed_at=d["changed_at"],
        )


@dataclass
class Dialog:
    """A modal dialog: while open it takes every click and key; its value is the button used."""

    message: str
    rect: Rect
    buttons: list[str]
    open: bool = True
    value: str | None = None
    changed_at: int | None = None

    def button_rects(self) -> list[Rect]:
        """Buttons sit on the dialog's bottom row, spread evenly, in the order given."""
        n = len(self.buttons)
        bw = max(len(b) for b in self.buttons) * CHAR_W + 8
        gap = (self.rect.w - n * bw) // (n + 1)
        y = self.rect.y + self.rect.h - CHAR_H - 6
        return [Rect(self.rect.x + gap + i * (bw + gap), y, bw, CHAR_H + 3) for i in range(n)]

    def to_json(self) -> dict:
        return {
            "message": self.message,
            "rect": self.rect.as_list(),
            "buttons": list(self.buttons),
            "open": self.open,
            "value": self.value,
            "changed_at": self.changed_at,
        }

    @classmethod
    def from_json(cls, d: dict) -> Dialog:
        return cls(
            message=d["message"],
            rect=Rect.of(d["rect"]),
            buttons=list(d["buttons"]),
            open=d["open"],
            value=d["value"],
            changed_at=d["changed_at"],
        )


@dataclass
class DesktopState:
    width: int
    height: int
    title: str | None = None  # None: the prepared blank desktop, no window yet
    tabs: list[str] = field(default_factory=list)
    tab: str | None = None
    widgets: list[Widget] = field(default_factory=list)
    dialog: Dialog | None = None
    focus: str | None = None
    clock: int = 0  # counts value changes, so checkers can ask in which order things happened
    status: str = "running"  # "done" or "fail" once the agent says so
    theme: str = "light"  # the window's background colour (envs/desktop/render.py THEMES)

    def to_json(self) -> dict:
        d = {
            "version": STATE_VERSION,
            "screen": [self.width, self.height],
            "title": self.title,
            "tabs": list(self.tabs),
            "tab": self.tab,
            "widgets": [w.to_json() for w in self.widgets],
            "dialog": self.dialog.to_json() if self.dialog else None,
            "focus": self.focus,
            "clock": self.clock,
            "status": self.status,
        }
        if self.theme != "light":  # omitted when default: states of before themes keep their hash
            d["theme"] = self.theme
        return d

    @classmethod
    def from_json(cls, d: dict) -> DesktopState:
        if not isinstance(d, dict) or d.get("version") != STATE_VERSION:
            raise ValueError(f"not a desktop state of version {STATE_VERSION}")
        try:
            width, height = d["screen"]
            return cls(
                width=width,
                height=height,
                title=d["title"],
                tabs=list(d["tabs"]),
                tab=d["tab"],
                widgets=[Widget.from_json(w) for w in d["widgets"]],
                dialog=Dialog.from_json(d["dialog"]) if d["dialog"] else None,
                focus=d["focus"],
                clock=d["clock"],
                status=d["status"],
                theme=d.get("theme", "light"),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"desktop state is missing or mangles {e}") from None

    def content_top(self) -> int:
        """First pixel row below the title bar (and the tab bar, when there are tabs)."""
        return TITLE_H + (TAB_H if len(self.tabs) > 1 else 0)

    def tab_rects(self) -> list[Rect]:
        """Tab headers, left to right, each as wide as its name."""
        rects, x = [], 2
        for name in self.tabs:
            w = len(name) * CHAR_W + 8
            rects.append(Rect(x, TITLE_H + 1, w, TAB_H - 1))
            x += w + 2
        return rects

    def shown(self) -> list[Widget]:
        """Widgets on the active tab, in their tab order."""
        return [w for w in self.widgets if w.tab == self.tab]

    def widget(self, wid: str) -> Widget:
        for w in self.widgets:
            if w.id == wid:
                return w
        raise KeyError(wid)


def values(state: dict) -> dict[str, object]:
    """id -> value of every widget (and the dialog) in a state read back as JSON."""
    out = {w["id"]: w["value"] for w in state["widgets"]}
    if state.get("dialog") is not None:
        out[DIALOG_ID] = state["dialog"]["value"]
    return out
