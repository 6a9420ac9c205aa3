"""Which applications each X desktop image has, in OSWorld's `related_apps` terms.

Two images (envs/xdesktop/image.py): `base`, the small one CI builds (st, Mousepad, Gnumeric),
and `full`, built on request only, with the applications OSWorld's domains name. The runnability
report (envs/osworld/source.py) reads this to say which tasks an image can run (`app:<name>`);
the image build reads it to record what it installed. Kept apart from image.py so that the
freeze and the checker do not import the builder.
"""

from __future__ import annotations

IMAGES = ("base", "full")
DEFAULT_IMAGE = "base"

# OSWorld's `related_apps` names (as its task files spell them) -> the application each needs;
# None: the desktop itself ("os", a terminal). A name not listed here is an application no image
# is known to have, so a task naming it is not runnable (`app:<name>`), rather than assumed to be.
APP_OF = {
    **dict.fromkeys(("libreoffice_calc", "libreoffice calc", "calc", "libreoffice_writer",
                     "libreoffice writer", "writer", "libreoffice_impress",
                     "libreoffice impress", "impress"), "libreoffice"),
    **dict.fromkeys(("chrome", "google chrome", "browser", "chromium"), "chrome"),
    **dict.fromkeys(("vscode", "vs_code", "vs code"), "vscode"),
    **{name: name for name in ("gimp", "vlc", "thunderbird")},
    **dict.fromkeys(("os", "terminal", "st"), None),
    **{name: name for name in ("mousepad", "gnumeric")},
}  # fmt: skip

# What each image has. `full` has no VS Code: Debian packages neither VS Code nor an open build
# of it (no `code`, `codium` or `code-oss` in bookworm), and only Debian's archive is reachable
# where the image is built; OSWorld's vs_code tasks read VS Code's own settings and extensions,
# which another editor would not write, so they stay `app:vscode`.
APPS = {
    "base": frozenset({"mousepad", "gnumeric"}),
    "full": frozenset({"mousepad", "gnumeric", "libreoffice", "chrome", "gimp", "vlc",
                       "thunderbird"}),
}  # fmt: skip

# The images that carry an accessibility tree (AT-SPI's bus and bindings): the getters that read
# it are served there only; the base image answers its route 501.
TREE_IMAGES = frozenset({"full"})


def check_image(image: str) -> str:
    if image not in IMAGES:
        raise ValueError(f"image must be one of {IMAGES}, got {image!r}")
    return image


def apps_missing(task, image: str = DEFAULT_IMAGE) -> list[str]:
    """The applications `task` names (`related_apps`) that `image` does not have."""
    have = APPS[check_image(image)]
    apps = task.get("related_apps") or []
    needed = {APP_OF.get(a.strip().lower(), a.strip().lower()) for a in apps if isinstance(a, str)}
    return sorted(a for a in needed if a is not None and a not in have)
