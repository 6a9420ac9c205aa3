"""Task families: each turns a seeded random generator into one task and its solutions.

A family returns a `Spec`: the set-up, the checker and its options, which widgets the task may
change, the oracle action list and near misses (action lists that come close but must score 0).
Labels, positions, initial values and widget order all come from the generator, so the screen,
not the instruction alone, says where to act.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from envab.envs.desktop.model import DIALOG_ID
from envab.envs.tasks import vocab
from envab.envs.tasks.scene import Scene


@dataclass
class Spec:
    instruction: str
    config: list[dict]
    func: str
    options: dict
    may_change: list[str]
    oracle: list[dict]
    near_misses: dict[str, list[dict]] = field(default_factory=dict)


def click(xy: tuple[int, int]) -> dict:
    return {"action_type": "CLICK", "parameters": {"x": xy[0], "y": xy[1]}}


def double_click(xy: tuple[int, int]) -> dict:
    return {"action_type": "DOUBLE_CLICK", "parameters": {"x": xy[0], "y": xy[1]}}


def typing(text: str) -> dict:
    return {"action_type": "TYPING", "parameters": {"text": text}}


def press(key: str) -> dict:
    return {"action_type": "PRESS", "parameters": {"key": key}}


def scroll(xy: tuple[int, int], dy: int) -> dict:
    return {"action_type": "SCROLL", "parameters": {"x": xy[0], "y": xy[1], "dx": 0, "dy": dy}}


def _spec(
    sc: Scene,
    instruction: str,
    expect: dict,
    oracle: list[dict],
    near: dict,
    order: list[str] | None = None,
    final_tab: str | None = None,
) -> Spec:
    """Resolve the scene's widget keys into ids once the config (and its id order) is fixed.

    Every task also gets a scope probe: the oracle, then a click on a widget the task may not
    change (a button or check box, where one click always changes the value, on the tab the
    oracle ends on). Only the scope check can tell it from success.
    """
    final_tab = final_tab or sc.tabs[0]
    bystanders = [
        k
        for k, w in sc.widgets.items()
        if w["tab"] == final_tab and k not in expect and w["kind"] in ("button", "checkbox")
    ]
    near = {**near, "scope_probe": [*oracle, click(sc.at(sc.rng.choice(bystanders)))]}
    config = sc.finish()
    options = {"expect": {sc.ids[k]: v for k, v in expect.items()}}
    if order:
        options["order"] = [sc.ids[k] for k in order]
    return Spec(
        instruction=instruction,
        config=config,
        func="values_in_order" if order else "values_match",
        options=options,
        may_change=sorted(options["expect"]),
        oracle=oracle,
        near_misses=near,
    )


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def click_button(r: random.Random, width: int, height: int) -> Spec:
    sc = Scene(r, width, height)
    labels = sc.fresh(vocab.BUTTONS, r.randint(3, 5))
    keys = [sc.add("button", label) for label in labels]
    sc.distract(r.randint(0, 2))
    target, other = keys[0], r.choice(keys[1:])
    return _spec(
        sc,
        f"Click {labels[0]}.",
        {target: 1},
        [click(sc.at(target))],
        {"other_button": [click(sc.at(other))], "double_click": [double_click(sc.at(target))]},
    )


def check_group(r: random.Random, width: int, height: int) -> Spec:
    sc = Scene(r, width, height)
    labels = sc.fresh(vocab.COLOURS, r.randint(4, 5))
    want = set(r.sample(labels, r.randint(1, 3)))
    start = {label: r.random() < 0.4 for label in labels}
    if all(start[x] == (x in want) for x in labels):  # the task must ask for a change
        flip = r.choice(labels)
        start[flip] = not start[flip]
    keys = {x: sc.add("checkbox", x, value=start[x]) for x in labels}
    sc.distract(r.randint(1, 2))
    toggles = [click(sc.at(keys[x])) for x in labels if start[x] != (x in want)]
    stray = click(sc.at(keys[r.choice(labels)]))
    named = [x for x in labels if x in want]
    return _spec(
        sc,
        f"Check only {_and(named)}.",
        {keys[x]: x in want for x in labels},
        toggles,
        {"one_short": toggles[:-1], "one_extra": [*toggles, stray]},
    )


def type_field(r: random.Random, width: int, height: int) -> Spec:
    sc = Scene(r, width, height)
    labels = sc.fresh(vocab.FIELDS, r.randint(2, 3))
    word, other_word = r.sample(vocab.WORDS, 2)
    target = sc.add("field", labels[0])
    decoys = [sc.add("field", x, value=r.choice(("", other_word))) for x in labels[1:]]
    sc.distract(r.randint(1, 2))
    at, decoy = sc.at(target), sc.at(r.choice(decoys))
    return _spec(
        sc,
        f"Type {word} in {labels[0]}.",
        {target: word},
        [click(at), typing(word)],
        {
            "wrong_field": [click(decoy), typing(word)],
            "typo": [click(at), typing(word[:-1])],
            "extra_letter": [click(at), typing(word + "s")],
        },
    )


def _select(sc: Scene, key: str, items: list[str], item: str) -> list[dict]:
    """Scroll an item into view (as the last visible row) when needed, then click it."""
    idx, rows = items.index(item), 3
    if idx < rows:
        return [click(sc.list_row(key, idx))]
    top = idx - rows + 1
    return [scroll(sc.at(key), -top), click(sc.list_row(key, rows - 1))]


def choose_list(r: random.Random, width: int, height: int) -> Spec:
    sc = Scene(r, width, height)
    name = r.choice(sorted(vocab.LISTS))
    items = r.sample(vocab.LISTS[name], r.randint(5, len(vocab.LISTS[name])))
    target = r.randrange(len(items))
    start = r.choice([None, *[x for i, x in enumerate(items) if i != target]])
    key = sc.add("list", name, items=items, value=start)
    sc.distract(r.randint(1, 3))
    neighbour = items[target + 1] if target + 1 < len(items) else items[target - 1]
    near = {"neighbour": _select(sc, key, items, neighbour)}
    if target >= 3:  # clicking where the item will be, without scrolling, picks another one
        near["no_scroll"] = [click(sc.list_row(key, 2))]
    return _spec(
        sc,
        f"Select {items[target]} in {name}.",
        {key: items[target]},
        _select(sc, key, items, items[target]),
        near,
    )


def switch_tab(r: random.Random, width: int, height: int) -> Spec:
    tabs = r.sample(vocab.TABS, r.randint(2, 3))
    sc = Scene(r, width, height, tabs=tabs)
    goal_tab = r.choice(tabs[1:])
    kind = r.choice(("button", "checkbox"))
    (label,) = sc.fresh(vocab.BUTTONS if kind == "button" else vocab.COLOURS, 1)
    target = sc.add(kind, label, goal_tab, **({"value": False} if kind == "checkbox" else {}))
    decoy = sc.add(kind, label, tabs[0], **({"value": False} if kind == "checkbox" else {}))
    (other_label,) = sc.fresh(vocab.BUTTONS, 1, goal_tab)
    other = sc.add("button", other_label, goal_tab)
    for tab in tabs:
        sc.distract(r.randint(1, 2), tab)
    verb = "click" if kind == "button" else "check"
    go = click(sc.tab_at(goal_tab))
    return _spec(
        sc,
        f"Open the {goal_tab} tab and {verb} {label}.",
        {target: 1 if kind == "button" else True},
        [go, click(sc.at(target))],
        {
            "decoy_on_first_tab": [click(sc.at(decoy))],
            "wrong_widget": [go, click(sc.at(other))],
            "tab_only": [go],
        },
        final_tab=goal_tab,
    )


def dialog_then_act(r: random.Random, width: int, height: int) -> Spec:
    sc = Scene(r, width, height)
    kind = r.choice(("button", "checkbox"))
    (label,) = sc.fresh(vocab.BUTTONS if kind == "button" else vocab.COLOURS, 1)
    target = sc.add(kind, label, **({"value": False} if kind == "checkbox" else {}))
    sc.distract(r.randint(2, 4))
    buttons = list(r.choice(vocab.ANSWERS))
    r.shuffle(buttons)
    answer = r.choice(buttons)
    wrong = next(b for b in buttons if b != answer)
    sc.open_dialog(r.choice(vocab.DIALOGS), buttons)
    act = click(sc.at(target))
    verb = "click" if kind == "button" else "check"
    return _spec(
        sc,
        f"Click {answer} in the dialog, then {verb} {label}.",
        {DIALOG_ID: answer, target: 1 if kind == "button" else True},
        [click(sc.dialog_at(answer)), act],
        {
            "other_answer": [click(sc.dialog_at(wrong)), act],
            "escape": [press("escape"), act],
            "answer_only": [click(sc.dialog_at(answer))],
            "act_through_dialog": [act],
        },
    )


def form_two(r: random.Random, width: int, height: int) -> Spec:
    sc = Scene(r, width, height)
    labels = sc.fresh(vocab.FIELDS, r.randint(2, 3))
    w1, w2, w3 = r.sample(vocab.WORDS, 3)
    f1, f2 = sc.add("field", labels[0]), sc.add("field", labels[1])
    for x in labels[2:]:
        sc.add("field", x)
    sc.distract(r.randint(1, 2))
    a1, a2 = sc.at(f1), sc.at(f2)
    return _spec(
        sc,
        f"Type {w1} in {labels[0]} and {w2} in {labels[1]}.",
        {f1: w1, f2: w2},
        [click(a1), typing(w1), click(a2), typing(w2)],
        {
            "swapped": [click(a1), typing(w2), click(a2), typing(w1)],
            "first_only": [click(a1), typing(w1)],
            "second_wrong": [click(a1), typing(w1), click(a2), typing(w3)],
        },
    )


def sequence3(r: random.Random, width: int, height: int) -> Spec:
    sc = Scene(r, width, height)
    (colour,) = sc.fresh(vocab.COLOURS, 1)
    (name,) = sc.fresh(vocab.FIELDS, 1)
    (button,) = sc.fresh(vocab.BUTTONS, 1)
    word = r.choice(vocab.WORDS)
    field_key = sc.add("field", name)
    box, btn = sc.add("checkbox", colour, value=False), sc.add("button", button)
    sc.distract(r.randint(1, 2))
    steps = {
        box: ([click(sc.at(box))], f"check {colour}"),
        field_key: ([click(sc.at(field_key)), typing(word)], f"type {word} in {name}"),
    }
    first, second = r.sample([box, field_key], 2)
    order = [first, second, btn]
    press_it = [click(sc.at(btn))]
    said = f"{steps[first][1]}, {steps[second][1]}, then click {button}."
    return _spec(
        sc,
        said[0].upper() + said[1:],
        {box: True, field_key: word, btn: 1},
        steps[first][0] + steps[second][0] + press_it,
        {
            "skip_first": steps[second][0] + press_it,
            "skip_second": steps[first][0] + press_it,
            "skip_click": steps[first][0] + steps[second][0],
            "swap_first_two": steps[second][0] + steps[first][0] + press_it,
            "click_first": press_it + steps[first][0] + steps[second][0],
        },
        order=order,
    )


FAMILIES: dict[str, Callable[[random.Random, int, int], Spec]] = {
    "click_button": click_button,
    "check_group": check_group,
    "type_field": type_field,
    "choose_list": choose_list,
    "switch_tab": switch_tab,
    "dialog_then_act": dialog_then_act,
    "form_two": form_two,
    "sequence3": sequence3,
}
