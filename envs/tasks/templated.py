"""The templated layout: a docked toolbar whose side and theme are the screen's one visual cue.

The seeded layout (envs/tasks/layout.py) puts every widget at a random spot, so every task needs
*localisation* (which part of the screen shows the named label), which the tiny embedded model
does not learn in a CPU budget (bench/learnability.py). The templated layout asks for what it
does learn, a *global* screen property. Each family has `k` templates, one per column of the
grid (k = 2 on a 128 px screen): template i docks every button in column i and paints the window
in its own theme (light, dark, ...: envs/desktop/render.py). A label has the same row in every
template. A task is (family, template, target label, the other labels on screen), drawn from
the task's generator as before.

The instruction names the label ("Click Save."), never the template. So the text fixes the row
of the click and the screen fixes its column: a policy that ignores the screen is right 1 time
in k at best. The other templates' columns are not empty: decoy buttons with labels no
instruction names fill them at the toolbar's rows, so a click in the wrong column changes a
decoy and fails the task (an empty column would let "click the row in every column" succeed
without reading the screen), and the button pattern alone does not say which column is live.
What this asks of vision, honestly: telling k window themes apart, a property of every image
token, not reading labels or finding one object among others. The study behind this choice
is bench/learnability.py.

Templates are a function of (seed, family, k) only, so every task of a build shares them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from envab.envs.tasks.families import Spec, _spec, click, double_click
from envab.envs.tasks.layout import CELL_H, CELL_W, MARGIN, Grid, size_of
from envab.envs.tasks.scene import Scene
from envab.hashing import sha256_bytes

# The templated layout's generator version: it changes whenever a templated build's bytes do
# (2: decoy buttons fill the other columns).
VERSION = "2"
MAX_TEMPLATES = 4
# The theme of template i, ordered so that the first k are as different as they can be (light
# against dark is the strongest pair).
CUES = ("light", "dark", "sand", "mint")
# Labels a templated click_button task may show.
CLICK_LABELS = ("Save", "Open", "Send", "Print", "Copy", "Undo", "Apply", "Reset")
# Labels of the decoy buttons that fill the other templates' columns. No instruction names them,
# so they appear in pixels only; clicking one changes its value, which fails the task.
DECOY_LABELS = (
    "Cut",
    "Paste",
    "Find",
    "Help",
    "Close",
    "Edit",
    "View",
    "Zoom",
    "Sort",
    "Share",
    "Sync",
    "Load",
    "Next",
    "Back",
    "Stop",
)


@dataclass(frozen=True)
class Template:
    index: int
    cue: str
    slots: dict[str, tuple[int, int]]  # label -> (column, row) of the grid


def template_rng(seed: int, family: str, k: int) -> random.Random:
    return random.Random(int(sha256_bytes(f"{seed}/{family}/templates/{k}".encode())[:16], 16))


def make_templates(
    seed: int, family: str, k: int, labels: tuple[str, ...], width: int, height: int
) -> list[Template]:
    """k templates, one per column of the grid: template i docks every label in column i, at the
    label's row, which is the same in every template (drawn once per seed and family). So the
    instruction fixes the row and the screen fixes the column; a policy that ignores the screen
    is right 1 time in k at best."""
    grid = Grid(width, height, tabbed=False)
    most = min(MAX_TEMPLATES, grid.cols)
    if not 2 <= k <= most:
        raise ValueError(
            f"templated layout: templates must be 2..{most} on a {width}px wide "
            f"screen (one per column), got {k}"
        )
    if grid.rows < len(labels):
        raise ValueError(
            f"templated layout: {len(labels)} labels need {len(labels)} rows, "
            f"the screen has {grid.rows}"
        )
    rows = template_rng(seed, family, k).sample(range(grid.rows), len(labels))
    return [
        Template(i, CUES[i], {label: (i, row) for label, row in zip(labels, rows, strict=True)})
        for i in range(k)
    ]


def slot_rect(kind: str, label: str, slot: tuple[int, int], width: int, height: int) -> list[int]:
    """A widget centred in its slot's cell: its position depends on the slot only."""
    w, h, _ = size_of(kind, label)
    c, r = slot
    grid = Grid(width, height, tabbed=False)
    return [MARGIN + c * CELL_W + (CELL_W - 2 - w) // 2, grid.top + r * CELL_H, w, h]


def _place(sc: Scene, kind: str, label: str, rect: list[int], **extra) -> str:
    key = f"{sc.tabs[0]}/{label}"
    if key in sc.widgets:
        raise ValueError(f"label {label!r} is used twice")
    sc.widgets[key] = {"kind": kind, "label": label, "tab": sc.tabs[0], "rect": rect, **extra}
    return key


def click_button(
    r: random.Random, width: int, height: int, templates: list[Template]
) -> tuple[Spec, int]:
    template = r.choice(templates)
    sc = Scene(r, width, height)
    sc.theme = template.cue
    labels = r.sample(CLICK_LABELS, r.randint(3, 5))
    keys = [
        _place(sc, "button", x, slot_rect("button", x, template.slots[x], width, height))
        for x in labels
    ]
    target, other = keys[0], r.choice(keys[1:])
    near = {"other_button": [click(sc.at(other))], "double_click": [double_click(sc.at(target))]}
    others = [t for t in templates if t.index != template.index]
    decoys = iter(r.sample(DECOY_LABELS, len(labels) * len(others)))
    for t in others:
        for x in labels:
            _, row = template.slots[x]
            decoy = next(decoys)
            key = _place(
                sc, "button", decoy, slot_rect("button", decoy, (t.index, row), width, height)
            )
            if x == labels[0]:
                # Where another template puts the target: what a policy that ignores the screen
                # clicks, alone or after the target ("click the row in every column").
                near[f"template{t.index}_slot"] = [click(sc.at(key))]
                near[f"target_then_template{t.index}_slot"] = [
                    click(sc.at(target)),
                    click(sc.at(key)),
                ]
    spec = _spec(sc, f"Click {labels[0]}.", {target: 1}, [click(sc.at(target))], near)
    return spec, template.index


FAMILIES = {"click_button": (click_button, CLICK_LABELS)}


def make_spec(
    family: str, r: random.Random, width: int, height: int, seed: int, k: int
) -> tuple[Spec, int]:
    """(spec, template index) of one templated task."""
    if family not in FAMILIES:
        raise ValueError(
            f"family {family!r} has no templated layout (templated: {', '.join(FAMILIES)})"
        )
    fn, labels = FAMILIES[family]
    templates = make_templates(seed, family, k, labels, width, height)
    return fn(r, width, height, templates)
