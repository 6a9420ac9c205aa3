"""The embedded desktop: set-up, actions, rendering, snapshot/restore, blank screens."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from envab.envs.desktop import Desktop, screen_of
from envab.envs.protocol import is_blank


def widget(wid, kind, label, rect, tab="Main", **extra):
    return {
        "type": "widget",
        "parameters": {"id": wid, "kind": kind, "label": label, "rect": rect, "tab": tab, **extra},
    }


def config(dialog=False, tabs=("Main",)):
    first = tabs[0]
    steps = [
        {"type": "screen", "parameters": {"width": 128, "height": 128}},
        {"type": "window", "parameters": {"title": "Test", "tabs": list(tabs)}},
        widget("save", "button", "Save", [4, 30, 40, 13], tab=first),
        widget("red", "checkbox", "Red", [66, 30, 40, 13], value=False, tab=first),
        widget("blue", "checkbox", "Blue", [66, 44, 46, 13], value=True, tab=first),
        widget("name", "field", "Name", [4, 46, 58, 26], tab=first),
        widget(
            "fruit",
            "list",
            "Fruit",
            [66, 60, 58, 50],
            items=["Apple", "Pear", "Plum", "Fig", "Kiwi", "Lime"],
            tab=first,
        ),
    ]
    if len(tabs) > 1:
        steps.append(widget("send", "button", "Send", [4, 30, 40, 13], tab=tabs[1]))
    if dialog:
        steps.append(
            {
                "type": "dialog",
                "parameters": {
                    "message": "Quit now?",
                    "rect": [10, 70, 100, 36],
                    "buttons": ["OK", "Cancel"],
                },
            }
        )
    return steps


def desktop(**kw) -> Desktop:
    d = Desktop()
    d.setup(config(**kw))
    return d


def click(x, y):
    return {"action_type": "CLICK", "parameters": {"x": x, "y": y}}


def values(d: Desktop) -> dict:
    return {w["id"]: w["value"] for w in d.state()["widgets"]}


def png(d: Desktop) -> bytes:
    buf = io.BytesIO()
    d.screenshot().save(buf, "PNG")
    return buf.getvalue()


def test_screenshot_is_rgb_of_the_screen_size_and_deterministic_per_state():
    a, b = desktop(), desktop()
    shot = a.screenshot()
    assert shot.mode == "RGB" and shot.size == (128, 128)
    assert png(a) == png(b)
    a.apply(click(70, 36))  # tick Red: the pixels must change with the state
    assert png(a) != png(b)
    b.apply(click(70, 36))
    assert png(a) == png(b) and a.state_hash() == b.state_hash()


def test_click_on_a_checkbox_changes_that_checkbox_only():
    d = desktop()
    before = values(d)
    d.apply(click(80, 36))
    after = values(d)
    assert after["red"] is True
    assert {k: v for k, v in after.items() if k != "red"} == {
        k: v for k, v in before.items() if k != "red"
    }
    state = d.state()
    assert state["focus"] == "red" and state["clock"] == 1
    d.apply({"action_type": "DOUBLE_CLICK", "parameters": {"x": 80, "y": 36}})
    assert values(d)["red"] is True  # toggled twice


def test_typing_goes_to_the_focused_field_only():
    d = desktop()
    d.apply({"action_type": "TYPING", "parameters": {"text": "cat"}})
    assert values(d)["name"] == ""  # nothing focused: nothing typed
    d.apply(click(30, 64))
    d.apply({"action_type": "TYPING", "parameters": {"text": "cats"}})
    d.apply({"action_type": "PRESS", "parameters": {"key": "backspace"}})
    assert values(d)["name"] == "cat"


def test_buttons_count_presses_and_keyboard_focus_cycles():
    d = desktop()
    d.apply(click(10, 35))
    d.apply({"action_type": "PRESS", "parameters": {"key": "enter"}})
    d.apply({"action_type": "PRESS", "parameters": {"key": "Return"}})  # pyautogui's name
    assert values(d)["save"] == 3
    d.apply({"action_type": "PRESS", "parameters": {"key": "tab"}})
    assert d.state()["focus"] == "red"
    d.apply({"action_type": "PRESS", "parameters": {"key": "space"}})
    assert values(d)["red"] is True


def test_list_needs_scrolling_to_reach_hidden_items():
    d = desktop()
    row3 = 60 + 1 + 3 * 12 + 6  # third item row of the list (rows start below its label)
    d.apply(click(80, row3))
    assert values(d)["fruit"] == "Plum"
    d.apply({"action_type": "SCROLL", "parameters": {"x": 80, "y": 80, "dx": 0, "dy": -2}})
    d.apply(click(80, row3))
    assert values(d)["fruit"] == "Kiwi"
    d.apply({"action_type": "SCROLL", "parameters": {"x": 80, "y": 80, "dx": 0, "dy": -9}})
    assert d.state()["widgets"][4]["scroll"] == 3  # clamped at the last page


def test_modal_dialog_takes_every_click_until_answered():
    d = desktop(dialog=True)
    d.apply(click(80, 36))  # Red lies outside the dialog but the dialog is modal
    assert values(d)["red"] is False
    ok = d.state()["dialog"]
    assert ok["open"] and ok["value"] is None
    d.apply(click(30, 95))  # the OK button on the dialog's bottom row
    assert d.state()["dialog"] == {**ok, "open": False, "value": "OK", "changed_at": 1}
    d.apply(click(80, 36))
    assert values(d)["red"] is True


def test_tabs_hide_the_widgets_of_other_tabs():
    d = desktop(tabs=("Home", "Mail"))
    assert d.state()["tab"] == "Home"
    d.apply(click(10, 36))  # Save on Home, at the same spot as Send on Mail
    assert values(d)["save"] == 1 and values(d)["send"] == 0
    mail_tab = (2 + 4 * 6 + 8 + 2 + 10, 19)
    d.apply(click(*mail_tab))
    assert d.state()["tab"] == "Mail"
    d.apply(click(10, 36))
    assert values(d)["save"] == 1 and values(d)["send"] == 1


def test_snapshot_restore_gives_the_same_state_and_pixels_and_stays_playable():
    d = desktop(dialog=True)
    for action in (
        click(30, 95),
        click(30, 64),
        {"action_type": "TYPING", "parameters": {"text": "owl"}},
        {"action_type": "SCROLL", "parameters": {"x": 80, "y": 80, "dy": -1}},
    ):
        d.apply(action)
    r = Desktop.restore(d.snapshot())
    assert r.state_hash() == d.state_hash() and r.state() == d.state()
    assert png(r) == png(d)
    for x in (d, r):
        x.apply(click(80, 36))
    assert r.state_hash() == d.state_hash()


def test_restore_refuses_a_corrupt_snapshot():
    blob = desktop().snapshot()
    with pytest.raises(ValueError, match="magic"):
        Desktop.restore(b"garbage" + blob)
    with pytest.raises(ValueError, match="corrupt"):
        Desktop.restore(blob[:-5])


@pytest.mark.parametrize(
    "action, message",
    [
        ({"action_type": "CLICK", "parameters": {"x": 200, "y": 5}}, "outside the 128x128"),
        ({"action_type": "CLICK", "parameters": {"x": True, "y": 5}}, "integer parameter 'x'"),
        ({"action_type": "CLICK", "parameters": {"x": 5}}, "integer parameter 'y'"),
        ({"action_type": "PRESS", "parameters": {"key": "f13"}}, "PRESS key must be one of"),
        ({"action_type": "TYPING", "parameters": {"text": "a\nb"}}, "untypable"),
        ({"action_type": "DRAG_TO", "parameters": {"x": 1, "y": 1}}, "unsupported action_type"),
        ("CLICK 1 2", "must be a dict"),
    ],
)
def test_a_bad_action_raises_one_line_and_changes_nothing(action, message):
    d = desktop()
    before = d.state_hash()
    with pytest.raises(ValueError, match=message) as err:
        d.apply(action)
    assert "\n" not in str(err.value)
    assert d.state_hash() == before


def test_done_is_recorded_without_touching_widgets_and_ends_the_episode():
    d = desktop()
    before = values(d)
    d.apply({"action_type": "DONE", "parameters": {}})
    assert d.state()["status"] == "done" and values(d) == before
    with pytest.raises(ValueError, match="already ended with DONE"):
        d.apply(click(80, 36))


def test_setup_refuses_bad_config_naming_the_step():
    with pytest.raises(ValueError, match="step 0 .*wants a 128x128 screen, this desktop is 160x"):
        Desktop(160, 128).setup(config())
    overlapping = [*config(), widget("x", "button", "Undo", [10, 32, 40, 13])]
    with pytest.raises(ValueError, match=r"step 7 \(widget\).*overlaps widget 'save'"):
        Desktop().setup(overlapping)
    with pytest.raises(ValueError, match="step 1: unknown type 'launch'"):
        Desktop().setup([config()[0], {"type": "launch", "parameters": {}}])
    d = desktop()
    with pytest.raises(ValueError, match="already set up"):
        d.setup(config())
    assert screen_of(config()) == (128, 128)


@pytest.mark.parametrize(
    ("width", "height"), [(2000, 128), (32, 128), (True, 128), ("128", 128), (None, 128)]
)
def test_one_screen_rule_for_both_desktops_with_each_ones_bounds(width, height):
    """The Pillow desktop's screen and the X desktop's are one rule (envs/desktop: screen_of)
    with each desktop's bounds and default: whole pixels within bounds, a missing step refused
    here and the X desktop's default there."""
    from envab.envs.xdesktop.evaluate import DEFAULT_SCREEN
    from envab.envs.xdesktop.evaluate import screen_of as xdesktop_screen_of

    step = [{"type": "screen", "parameters": {"width": width, "height": height}}]
    with pytest.raises(ValueError, match="is not whole pixels within 64x64 to 1024x1024"):
        screen_of(step)
    with pytest.raises(ValueError, match="no 'screen' step"):
        screen_of([])
    assert xdesktop_screen_of([]) == DEFAULT_SCREEN
    wide = [{"type": "screen", "parameters": {"width": 2000, "height": 1000}}]
    assert xdesktop_screen_of(wide) == (2000, 1000)  # the X desktop's bounds are wider


def test_screens_are_never_blank_but_a_blanked_one_is_detected():
    assert not is_blank(Desktop().screenshot())  # the prepared desktop shows a mark
    shot = desktop(dialog=True).screenshot()
    assert not is_blank(shot)
    shot.paste((0, 0, 0), (0, 0, 128, 128))
    assert is_blank(shot)
    assert is_blank(Image.new("RGB", (128, 128), (255, 255, 255)))
