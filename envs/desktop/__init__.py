"""The embedded desktop: a small Pillow-rendered screen with one window of widgets.

`Desktop(width, height)` is the prepared blank desktop; `setup(config)` runs a task's steps
(`screen`, `window`, `widget`, `dialog`, `focus`); `apply(action)` takes one OSWorld computer_13
action (CLICK, DOUBLE_CLICK, TYPING, PRESS, SCROLL, DONE, FAIL) in pixel coordinates and raises
ValueError with one line for a bad one; `screenshot()`, `state()`, `state_hash()`,
`snapshot()` / `Desktop.restore(blob)` read it back. `screen_of(config)` names the screen size a
task needs, so a host builds the matching desktop before the set-up.
"""

from envab.envs.desktop.desktop import Desktop, screen_of

__all__ = ["Desktop", "screen_of"]
