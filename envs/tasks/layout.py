"""Seeded placement of widgets on a grid of cells, so positions vary from task to task.

The window's content area is cut into cells about one button wide and one row high; each widget
takes a block of cells, chosen at random among the free ones, and a random offset inside it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from envab.envs.desktop.model import CHAR_H, CHAR_W, ROW_H, TAB_H, TITLE_H

CELL_W, CELL_H = 62, 14
MARGIN = 2


@dataclass(frozen=True)
class Grid:
    width: int
    height: int
    tabbed: bool

    @property
    def top(self) -> int:
        return TITLE_H + (TAB_H if self.tabbed else 0) + 1

    @property
    def cols(self) -> int:
        return max(1, (self.width - 2 * MARGIN) // CELL_W)

    @property
    def rows(self) -> int:
        return (self.height - self.top - MARGIN) // CELL_H


def size_of(kind: str, label: str) -> tuple[int, int, int]:
    """(width px, height px, rows of cells) a widget of this kind and label needs."""
    if kind == "button":
        return len(label) * CHAR_W + 10, 13, 1
    if kind == "checkbox":
        return len(label) * CHAR_W + 15, 13, 1
    if kind == "field":
        return CELL_W - 4, CHAR_H + 1 + 14, 2
    if kind == "list":
        return CELL_W - 4, 2 + ROW_H * 4, 4  # a label row and three item rows
    raise ValueError(f"no size for widget kind {kind!r}")


class Packer:
    """Places widgets one after another in free cells of one tab's page."""

    def __init__(self, grid: Grid, rng: random.Random):
        self.grid, self.rng = grid, rng
        self.free = {(c, r) for c in range(grid.cols) for r in range(grid.rows)}

    def place(self, kind: str, label: str) -> list[int]:
        w, h, rows = size_of(kind, label)
        if w > CELL_W - 2:
            raise ValueError(f"label {label!r} is too wide for a {kind}")
        spots = sorted(
            (c, r) for c, r in self.free if all((c, r + k) in self.free for k in range(rows))
        )
        if not spots:
            raise ValueError(f"no room left for a {kind} on a {self.grid.width}x{self.grid.height}")
        c, r = self.rng.choice(spots)
        self.free -= {(c, r + k) for k in range(rows)}
        x = MARGIN + c * CELL_W + self.rng.randint(0, CELL_W - 2 - w)
        y = self.grid.top + r * CELL_H
        return [x, y, w, h]
