"""One US keyboard table for both ends of the virtual keyboard.

The host turns a character into a QEMU key code (QMP `input-send-event`, "qcode") plus shift;
the guest agent turns the Linux key it reads from evdev back into the same character. Keeping
both directions in one table is what makes TYPING round-trip exactly. Plain data and no imports:
the guest image carries a copy of this file.
"""

# (character, qcode, Linux KEY_* name, shift held)
ROWS = [
    *[(c, c, f"KEY_{c.upper()}", False) for c in "abcdefghijklmnopqrstuvwxyz"],
    *[(c.upper(), c, f"KEY_{c.upper()}", True) for c in "abcdefghijklmnopqrstuvwxyz"],
    *[(d, d, f"KEY_{d}", False) for d in "0123456789"],
    *[(s, d, f"KEY_{d}", True) for s, d in zip(")!@#$%^&*(", "0123456789", strict=True)],
    (" ", "spc", "KEY_SPACE", False),
    ("-", "minus", "KEY_MINUS", False),
    ("_", "minus", "KEY_MINUS", True),
    ("=", "equal", "KEY_EQUAL", False),
    ("+", "equal", "KEY_EQUAL", True),
    ("[", "bracket_left", "KEY_LEFTBRACE", False),
    ("{", "bracket_left", "KEY_LEFTBRACE", True),
    ("]", "bracket_right", "KEY_RIGHTBRACE", False),
    ("}", "bracket_right", "KEY_RIGHTBRACE", True),
    ("\\", "backslash", "KEY_BACKSLASH", False),
    ("|", "backslash", "KEY_BACKSLASH", True),
    (";", "semicolon", "KEY_SEMICOLON", False),
    (":", "semicolon", "KEY_SEMICOLON", True),
    ("'", "apostrophe", "KEY_APOSTROPHE", False),
    ('"', "apostrophe", "KEY_APOSTROPHE", True),
    ("`", "grave_accent", "KEY_GRAVE", False),
    ("~", "grave_accent", "KEY_GRAVE", True),
    (",", "comma", "KEY_COMMA", False),
    ("<", "comma", "KEY_COMMA", True),
    (".", "dot", "KEY_DOT", False),
    (">", "dot", "KEY_DOT", True),
    ("/", "slash", "KEY_SLASH", False),
    ("?", "slash", "KEY_SLASH", True),
]

# character -> (qcode, shift)
CHAR_TO_QCODE: dict[str, tuple[str, bool]] = {c: (q, s) for c, q, _, s in ROWS}
# (Linux key name, shift) -> character
LINUX_TO_CHAR: dict[tuple[str, bool], str] = {(k, s): c for c, _, k, s in ROWS}

# computer_13 PRESS key -> (qcode, Linux key name)
PRESS_KEYS: dict[str, tuple[str, str]] = {
    "enter": ("ret", "KEY_ENTER"),
    "tab": ("tab", "KEY_TAB"),
    "backspace": ("backspace", "KEY_BACKSPACE"),
    "escape": ("esc", "KEY_ESC"),
    "space": ("spc", "KEY_SPACE"),
    "up": ("up", "KEY_UP"),
    "down": ("down", "KEY_DOWN"),
}
LINUX_TO_PRESS: dict[str, str] = {k: name for name, (_, k) in PRESS_KEYS.items()}

SHIFT_QCODE = "shift"
SHIFT_KEYS = ("KEY_LEFTSHIFT", "KEY_RIGHTSHIFT")
