"""A task's desktop under construction: seeded widget placement, then OSWorld-style set-up steps.

Widgets are added by label (unique on their tab); `finish` shuffles their order, so neither the
widget ids nor the keyboard tab order tell which widget a task is about, and fixes the config.
"""

from __future__ import annotations

import random

from envab.envs.desktop.model import CHAR_H, DIALOG_ID, ROW_H, DesktopState, Dialog, Rect
from envab.envs.tasks import vocab
from envab.envs.tasks.layout import Grid, Packer

DIALOG_W, DIALOG_H = 100, 36
TITLE_TOP = 14  # a dialog never covers the window's title bar


class Scene:
    def __init__(self, rng: random.Random, width: int, height: int, tabs: list[str] | None = None):
        self.rng, self.width, self.height = rng, width, height
        self.tabs = tabs or ["Main"]
        self.title = rng.choice(vocab.TITLES)
        grid = Grid(width, height, tabbed=len(self.tabs) > 1)
        self.packers = {t: Packer(grid, rng) for t in self.tabs}
        self.widgets: dict[str, dict] = {}  # key "tab/label" -> widget step parameters
        self.dialog: dict | None = None
        self.theme: str | None = None  # the window's theme; None: the default (not written)
        self.ids: dict[str, str] = {}

    # --- building ---------------------------------------------------------------------------

    def add(self, kind: str, label: str, tab: str | None = None, **extra) -> str:
        tab = tab or self.tabs[0]
        key = f"{tab}/{label}"
        if key in self.widgets:
            raise ValueError(f"label {label!r} is used twice on tab {tab!r}")
        rect = self.packers[tab].place(kind, label)
        self.widgets[key] = {"kind": kind, "label": label, "tab": tab, "rect": rect, **extra}
        return key

    def fresh(self, pool: tuple[str, ...], n: int, tab: str | None = None) -> list[str]:
        """n labels from pool that no widget on the tab uses yet."""
        tab = tab or self.tabs[0]
        used = {w["label"] for w in self.widgets.values() if w["tab"] == tab}
        return self.rng.sample([x for x in pool if x not in used], n)

    def distract(self, n: int, tab: str | None = None) -> None:
        """n buttons and check boxes that no task asks about, so the page is never sparse."""
        for _ in range(n):
            if self.rng.random() < 0.5:
                (label,) = self.fresh(vocab.BUTTONS, 1, tab)
                self.add("button", label, tab)
            else:
                (label,) = self.fresh(vocab.COLOURS, 1, tab)
                self.add("checkbox", label, tab, value=self.rng.random() < 0.5)

    def open_dialog(self, message: str, buttons: list[str]) -> None:
        x = self.rng.randint(2, self.width - DIALOG_W - 4)
        y = self.rng.randint(TITLE_TOP, self.height - DIALOG_H - 4)
        self.dialog = {"message": message, "buttons": buttons, "rect": [x, y, DIALOG_W, DIALOG_H]}

    def finish(self) -> list[dict]:
        """The set-up steps; widget ids are given in a shuffled order."""
        keys = list(self.widgets)
        self.rng.shuffle(keys)
        self.ids = {key: f"w{i}" for i, key in enumerate(keys)}
        self.ids[DIALOG_ID] = DIALOG_ID
        steps = [
            {"type": "screen", "parameters": {"width": self.width, "height": self.height}},
            {"type": "window", "parameters": {"title": self.title, "tabs": self.tabs}},
        ]
        if self.theme is not None:
            steps[1]["parameters"]["theme"] = self.theme
        for key in keys:
            params = {"id": self.ids[key], **self.widgets[key]}
            steps.append({"type": "widget", "parameters": params})
        if self.dialog:
            steps.append({"type": "dialog", "parameters": self.dialog})
        return steps

    # --- where to act -----------------------------------------------------------------------

    def at(self, key: str) -> tuple[int, int]:
        """Where a click operates the widget (a field's box, not its label)."""
        w = self.widgets[key]
        x, y, width, height = w["rect"]
        if w["kind"] == "field":
            return x + width // 2, y + CHAR_H + 1 + (height - CHAR_H - 1) // 2
        return x + width // 2, y + height // 2

    def list_row(self, key: str, row: int) -> tuple[int, int]:
        """Centre of the row-th visible row of a list (row 0 is the first item row)."""
        x, y, width, _ = self.widgets[key]["rect"]
        return x + width // 2 - 2, y + 1 + (row + 1) * ROW_H + ROW_H // 2

    def tab_at(self, name: str) -> tuple[int, int]:
        state = DesktopState(self.width, self.height, tabs=self.tabs)
        return state.tab_rects()[self.tabs.index(name)].centre()

    def dialog_at(self, answer: str) -> tuple[int, int]:
        d = Dialog(self.dialog["message"], Rect.of(self.dialog["rect"]), self.dialog["buttons"])
        return d.button_rects()[d.buttons.index(answer)].centre()
