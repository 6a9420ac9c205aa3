"""The embedded desktop: a small Pillow-rendered screen with one window of widgets."""

from envs.desktop.desktop import Desktop, screen_of
from envs.desktop.render import is_blank

__all__ = ["Desktop", "is_blank", "screen_of"]
