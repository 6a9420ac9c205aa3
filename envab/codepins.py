"""sha256 of the code that must not differ between arms.

The trainer, the reward and drop-rule code and the environment adapters, per file and in aggregate.
"""

from __future__ import annotations

from pathlib import Path

from envab.hashing import aggregate_digest, sha256_file


def pin_groups(groups: dict[str, list[str]], root: str | Path = ".") -> dict[str, dict]:
    """group -> {"files": {path: sha256}, "sha256": aggregate}.

    A pattern that matches nothing is an error: a renamed file must not drop out of the pins.
    """
    root = Path(root)
    pinned = {}
    for group, patterns in sorted(groups.items()):
        files: dict[str, str] = {}
        for pattern in patterns:
            matches = [
                p for p in root.glob(pattern) if p.is_file() and "__pycache__" not in p.parts
            ]
            if not matches:
                raise FileNotFoundError(f"code_pins.{group}: pattern {pattern!r} matches no file")
            for p in matches:
                files[p.relative_to(root).as_posix()] = sha256_file(p)
        files = dict(sorted(files.items()))
        pinned[group] = {"files": files, "sha256": aggregate_digest(files)}
    return pinned
