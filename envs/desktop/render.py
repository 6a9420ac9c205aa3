"""Pillow rendering of a desktop state (the blank-screen test lives in envs.protocol).

Text uses Pillow's built-in bitmap font (no FreeType, no anti-aliasing), so the same state gives
the same pixels on every machine with this Pillow.
"""

from __future__ import annotations

from PIL import Image, ImageDraw, ImageFont

from envab.envs.desktop.model import (
    CHAR_H,
    CHAR_W,
    ROW_H,
    TAB_H,
    TITLE_H,
    DesktopState,
    Rect,
    Widget,
)

FONT = ImageFont.load_default_imagefont()

DESK = (0, 96, 128)
DESK_MARK = (40, 136, 168)
WINDOW = (228, 228, 228)
# Window background per theme. A theme is a whole-window visual property, the strongest global
# cue a screen can carry (envs/tasks/templated.py tells its layout templates apart by it).
THEMES = {"light": WINDOW, "dark": (64, 72, 92), "sand": (214, 190, 140), "mint": (150, 205, 175)}
TITLE_BAR = (30, 50, 110)
TAB_BAR = (196, 196, 196)
TAB_IDLE = (168, 168, 168)
INK = (0, 0, 0)
PAPER = (255, 255, 255)
BUTTON = (205, 205, 205)
PRESSED = (150, 168, 210)
FOCUS = (0, 90, 255)
SELECTED = (30, 50, 110)
LIST_HEAD = (210, 210, 210)
DIALOG = (250, 238, 180)
SHADOW = (60, 60, 60)


def render(s: DesktopState) -> Image.Image:
    img = Image.new("RGB", (s.width, s.height), DESK)
    d = ImageDraw.Draw(img)
    if s.title is None:  # the prepared desktop: a mark, so it never reads as a blank screen
        d.text((s.width // 2 - 3 * CHAR_W, s.height // 2 - CHAR_H // 2), "envab", DESK_MARK, FONT)
        return img
    d.rectangle([0, 0, s.width - 1, s.height - 1], fill=THEMES[s.theme])
    d.rectangle([0, 0, s.width - 1, TITLE_H - 1], fill=TITLE_BAR)
    d.text((3, 1), s.title, PAPER, FONT)
    if len(s.tabs) > 1:
        _tabs(d, s)
    for w in s.shown():
        _WIDGETS[w.kind](d, w, w.id == s.focus)
    if s.dialog is not None and s.dialog.open:
        _dialog(d, s)
    return img


def _box(d: ImageDraw.ImageDraw, r: Rect, fill, outline=INK) -> None:
    d.rectangle([r.x, r.y, r.x + r.w - 1, r.y + r.h - 1], fill=fill, outline=outline)


def _centred(d: ImageDraw.ImageDraw, r: Rect, text: str, ink=INK) -> None:
    x = r.x + (r.w - len(text) * CHAR_W) // 2
    y = r.y + (r.h - CHAR_H) // 2
    d.text((x, y), text, ink, FONT)


def _tabs(d: ImageDraw.ImageDraw, s: DesktopState) -> None:
    d.rectangle([0, TITLE_H, s.width - 1, TITLE_H + TAB_H - 1], fill=TAB_BAR)
    for name, r in zip(s.tabs, s.tab_rects(), strict=True):
        active = name == s.tab
        _box(d, Rect(r.x, r.y, r.w, r.h + (1 if active else 0)), WINDOW if active else TAB_IDLE)
        if active:  # open bottom edge: the active tab joins the page
            d.line([r.x + 1, r.y + r.h, r.x + r.w - 2, r.y + r.h], fill=WINDOW)
        _centred(d, r, name)
    d.line([0, TITLE_H + TAB_H - 1, s.width - 1, TITLE_H + TAB_H - 1], fill=INK)
    active = s.tab_rects()[s.tabs.index(s.tab)]
    d.line(
        [active.x + 1, TITLE_H + TAB_H - 1, active.x + active.w - 2, TITLE_H + TAB_H - 1],
        fill=WINDOW,
    )


def _button(d: ImageDraw.ImageDraw, w: Widget, focused: bool) -> None:
    _box(d, w.rect, PRESSED if w.value else BUTTON, FOCUS if focused else INK)
    _centred(d, w.rect, w.label)


def _checkbox(d: ImageDraw.ImageDraw, w: Widget, focused: bool) -> None:
    r = w.rect
    box = Rect(r.x + 1, r.y + (r.h - 9) // 2, 9, 9)
    _box(d, box, PAPER, FOCUS if focused else INK)
    if w.value:
        d.rectangle([box.x + 2, box.y + 2, box.x + 6, box.y + 6], fill=INK)
    d.text((r.x + 13, r.y + (r.h - CHAR_H) // 2), w.label, INK, FONT)


def _field(d: ImageDraw.ImageDraw, w: Widget, focused: bool) -> None:
    r = w.rect
    d.text((r.x + 1, r.y), w.label, INK, FONT)
    box = Rect(r.x, r.y + CHAR_H + 1, r.w, r.h - CHAR_H - 1)
    _box(d, box, PAPER, FOCUS if focused else (90, 90, 90))
    room = (box.w - 4) // CHAR_W - (1 if focused else 0)
    text = w.value[-room:] if room > 0 else ""
    ty = box.y + (box.h - CHAR_H) // 2
    d.text((box.x + 2, ty), text, INK, FONT)
    if focused:  # caret after the text
        cx = box.x + 2 + len(text) * CHAR_W
        d.line([cx, box.y + 2, cx, box.y + box.h - 3], fill=FOCUS)


def _list(d: ImageDraw.ImageDraw, w: Widget, focused: bool) -> None:
    r = w.rect
    _box(d, r, PAPER, FOCUS if focused else INK)
    d.rectangle([r.x + 1, r.y + 1, r.x + r.w - 2, r.y + ROW_H], fill=LIST_HEAD)
    d.text((r.x + 3, r.y + 1), w.label, INK, FONT)
    rows = w.visible_rows()
    for i, item in enumerate(w.items[w.scroll : w.scroll + rows]):
        y = r.y + 1 + (i + 1) * ROW_H
        ink = INK
        if item == w.value:
            d.rectangle([r.x + 1, y, r.x + r.w - 5, y + ROW_H - 1], fill=SELECTED)
            ink = PAPER
        d.text((r.x + 3, y), item, ink, FONT)
    if len(w.items) > rows:  # a scroll thumb on the right edge shows there is more
        track = rows * ROW_H
        top = r.y + 1 + ROW_H + track * w.scroll // len(w.items)
        size = max(3, track * rows // len(w.items))
        d.rectangle([r.x + r.w - 4, top, r.x + r.w - 2, top + size - 1], fill=SHADOW)


def _dialog(d: ImageDraw.ImageDraw, s: DesktopState) -> None:
    dlg = s.dialog
    r = dlg.rect
    d.rectangle([r.x + 2, r.y + 2, r.x + r.w + 1, r.y + r.h + 1], fill=SHADOW)
    _box(d, r, DIALOG)
    d.text((r.x + 4, r.y + 3), dlg.message, INK, FONT)
    for label, b in zip(dlg.buttons, dlg.button_rects(), strict=True):
        _box(d, b, BUTTON)
        _centred(d, b, label)


_WIDGETS = {"button": _button, "checkbox": _checkbox, "field": _field, "list": _list}
