"""The host tools this arm runs, and the Debian package that provides each."""

from __future__ import annotations

import shutil

from envab.errors import Refusal

PACKAGE_OF = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-img": "qemu-utils",
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
}


class ToolMissing(Refusal, RuntimeError):
    """A host tool is not installed; the message is one line naming the package."""


def require(tool: str) -> str:
    """The tool's path on PATH, or ToolMissing naming its Debian package."""
    path = shutil.which(tool)
    if path is None:
        raise ToolMissing(
            f"{tool} not found: install the Debian package {PACKAGE_OF.get(tool, tool)}"
        )
    return path
