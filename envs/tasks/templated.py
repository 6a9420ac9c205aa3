"""The templated layout: a few layout templates per family, told apart by one global visual cue.

The seeded layout (envs/tasks/layout.py) puts every widget at a random spot, so every task needs
*localisation* (which part of the screen shows the named label), which the tiny embedded model
does not learn in a CPU budget (bench/learnability.py). The templated layout asks for what it
does learn, a *global* screen property: each family has `k` templates (k <= 4); a template fixes
the slot of every label the family uses, and shows a cue band across the bottom of the window (a
full-width widget whose kind, and so colour, differs per template: a pressed button, a list with
a selected row, a text field, or nothing). A task is (family, template, target label, the other
labels on screen, ...), drawn from the task's generator as before.

The instruction names the label ("Click Save."), never the template. Every label sits at a
different slot in every template, so without the screenshot a policy can only guess the template
(success 1/k at best); with it, the answer is a function of (cue, label), which the tiny model
learns. What this asks of vision, honestly: recognising one of k band colours across a quarter of
the screen, not reading labels or finding objects.

Templates are a function of (seed, family, k) only, so every task of a build shares them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from envab.hashing import sha256_bytes
from envs.tasks import vocab
from envs.tasks.families import Spec, _spec, click, double_click
from envs.tasks.layout import CELL_H, CELL_W, MARGIN, Grid, size_of
from envs.tasks.scene import Scene

MAX_TEMPLATES = 4
BAND_ROWS = 2  # grid rows (of CELL_H px) the cue band takes at the bottom of the window
# The cue of template i: a full-width widget across the band ("plain" shows none). Ordered so
# that the first k are as different as they can be: the list (white with a dark selected row)
# against the bare window grey is the strongest pair (mean band colours ~158 apart in RGB); the
# pressed button's blue-grey is next; the empty field's white box is nearly the window grey.
CUES = ("list", "plain", "pressed", "field")
# Labels a templated click_button task may show; the cue widgets' labels are not among them.
CLICK_LABELS = ("Save", "Open", "Send", "Print", "Copy", "Undo", "Apply", "Reset")
BAND_BUTTON, BAND_FIELD, BAND_LIST = "Stop", "Note", "Day"


@dataclass(frozen=True)
class Template:
    index: int
    cue: str
    slots: dict[str, tuple[int, int]]  # label -> (column, row) of the grid


def template_rng(seed: int, family: str, k: int) -> random.Random:
    return random.Random(int(sha256_bytes(f"{seed}/{family}/templates/{k}".encode())[:16], 16))


def slots_of(width: int, height: int) -> list[tuple[int, int]]:
    grid = Grid(width, height, tabbed=False)
    rows = grid.rows - BAND_ROWS
    if rows < 1:
        raise ValueError("no room for widgets above the cue band")
    return [(c, r) for r in range(rows) for c in range(grid.cols)]


def make_templates(seed: int, family: str, k: int, labels: tuple[str, ...], width: int,
                   height: int) -> list[Template]:
    """k templates; each puts every label at its own slot, and no label shares a slot across
    templates (so a blind guess of the template is right 1 time in k, no more)."""
    if not 2 <= k <= MAX_TEMPLATES:
        raise ValueError(f"templated layout: templates must be 2..{MAX_TEMPLATES}, got {k}")
    slots = slots_of(width, height)
    if len(slots) < len(labels):
        raise ValueError(f"templated layout: {len(labels)} labels need {len(labels)} slots, "
                         f"the screen has {len(slots)}")
    rng = template_rng(seed, family, k)
    out: list[Template] = []
    for i in range(k):
        for _ in range(10_000):
            chosen = rng.sample(slots, len(labels))
            if all(t.slots[label] != s for t in out for label, s in zip(labels, chosen,
                                                                         strict=True)):
                break
        else:
            raise ValueError("templated layout: could not give every label distinct slots")
        out.append(Template(i, CUES[i], dict(zip(labels, chosen, strict=True))))
    return out


def slot_rect(kind: str, label: str, slot: tuple[int, int], width: int, height: int) -> list[int]:
    """A widget centred in its slot's cell: its position depends on the slot only."""
    w, h, _ = size_of(kind, label)
    c, r = slot
    grid = Grid(width, height, tabbed=False)
    return [MARGIN + c * CELL_W + (CELL_W - 2 - w) // 2, grid.top + r * CELL_H, w, h]


def add_cue(sc: Scene, template: Template) -> str | None:
    """The template's band across the bottom of the window; its key, or None for `plain`."""
    grid = Grid(sc.width, sc.height, tabbed=False)
    y = grid.top + (grid.rows - BAND_ROWS) * CELL_H + 1
    rect = [MARGIN, y, sc.width - 2 * MARGIN, sc.height - MARGIN - y]
    if template.cue == "pressed":
        return _place(sc, "button", BAND_BUTTON, rect, value=1)
    if template.cue == "list":
        items = list(vocab.LISTS[BAND_LIST])
        return _place(sc, "list", BAND_LIST, rect, items=items, value=items[0])
    if template.cue == "field":
        return _place(sc, "field", BAND_FIELD, rect, value="")
    return None


def _place(sc: Scene, kind: str, label: str, rect: list[int], **extra) -> str:
    key = f"{sc.tabs[0]}/{label}"
    if key in sc.widgets:
        raise ValueError(f"label {label!r} is used twice")
    sc.widgets[key] = {"kind": kind, "label": label, "tab": sc.tabs[0], "rect": rect, **extra}
    return key


def click_button(r: random.Random, width: int, height: int,
                 templates: list[Template]) -> tuple[Spec, int]:
    template = r.choice(templates)
    sc = Scene(r, width, height)
    labels = r.sample(CLICK_LABELS, r.randint(3, 5))
    keys = [
        _place(sc, "button", x, slot_rect("button", x, template.slots[x], width, height))
        for x in labels
    ]
    add_cue(sc, template)
    target, other = keys[0], r.choice(keys[1:])
    near = {"other_button": [click(sc.at(other))],
            "double_click": [double_click(sc.at(target))]}
    # Where each other template puts the target: what a policy that ignores the screen may click.
    for t in templates:
        if t.index != template.index:
            x, y, w, h = slot_rect("button", labels[0], t.slots[labels[0]], width, height)
            near[f"template{t.index}_slot"] = [click((x + w // 2, y + h // 2))]
    spec = _spec(sc, f"Click {labels[0]}.", {target: 1}, [click(sc.at(target))], near)
    return spec, template.index


FAMILIES = {"click_button": (click_button, CLICK_LABELS)}


def make_spec(family: str, r: random.Random, width: int, height: int, seed: int,
              k: int) -> tuple[Spec, int]:
    """(spec, template index) of one templated task."""
    if family not in FAMILIES:
        raise ValueError(
            f"family {family!r} has no templated layout (templated: {', '.join(FAMILIES)})"
        )
    fn, labels = FAMILIES[family]
    templates = make_templates(seed, family, k, labels, width, height)
    return fn(r, width, height, templates)
