"""The frozen files of a task set: their bytes stored by content, and the map from each URL to them.

Beside a frozen task set (`<results>/tasks/`) the freeze writes

    files/<sha256>   each file a task downloads, named by the sha256 of its bytes
    files.json       {"files": {url: {"sha256", "size"}}, "tasks": {task id: [url, ...]}}

(`envs/tasks/fetch.py` writes them; the tasks job's report carries the map, so the tasks'
receipt covers it). At run time the host reads a URL's bytes from here (`FrozenFiles.read`), and
a file whose bytes are not the digest its name and the map say is refused, never delivered: the
folder may have been copied between machines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from envab.errors import Refusal
from envab.hashing import sha256_file
from envab.io import atomic_write_json

MAP, STORE = "files.json", "files"  # their names in a tasks folder
SHA256 = re.compile(r"[0-9a-f]{64}")  # used with fullmatch: no trailing newline passes


class FilesMapError(Refusal, ValueError):
    """A files map (a freeze's files.json, a mirror's, a registered one) that cannot be read."""


class FileNotFrozen(RuntimeError):
    """A URL a task downloads that the store does not hold, or holds with other bytes (at run
    time: the environment's set-up gate fails, or the checker gets no file)."""


def check_map(obj, where: str) -> dict:
    """A files map (files.json's form), or FilesMapError naming `where` and what is wrong."""
    files = obj.get("files") if isinstance(obj, Mapping) else None
    if not isinstance(files, Mapping):
        raise FilesMapError(
            f"{where}: a files map is an object with 'files': {{url: {{sha256, size}}}}"
        )
    for url, entry in files.items():
        ok = (
            isinstance(entry, Mapping)
            and isinstance(entry.get("sha256"), str)
            and SHA256.fullmatch(entry["sha256"])
            and type(entry.get("size")) is int
            and entry["size"] >= 0
        )
        if not ok:
            raise FilesMapError(f"{where}: files[{url!r}] must be {{sha256: 64 hex, size: int}}")
    tasks = obj.get("tasks", {})
    if not isinstance(tasks, Mapping) or not all(
        isinstance(urls, list) and all(u in files for u in urls) for urls in tasks.values()
    ):
        raise FilesMapError(f"{where}: 'tasks' must map each task id to URLs of 'files'")
    return {"files": dict(files), "tasks": dict(tasks)}


def read_map(path: str | Path) -> dict:
    path = Path(path)
    try:
        obj = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise FilesMapError(f"{path}: cannot read the files map ({e})") from None
    return check_map(obj, str(path))


def write_map(path: str | Path, files: Mapping[str, Mapping], tasks: Mapping[str, Iterable[str]]):
    """files.json, sorted, so that the same files give the same bytes."""
    atomic_write_json(
        path,
        {
            "files": {url: {"sha256": e["sha256"], "size": e["size"]} for url, e in files.items()},
            "tasks": {tid: sorted(set(urls)) for tid, urls in tasks.items()},
        },
    )


def blob(store: str | Path, sha256: str) -> Path:
    if not SHA256.fullmatch(sha256):
        raise ValueError(f"{sha256!r} is not a sha256")
    return Path(store) / sha256


class FrozenFiles:
    """The files of one frozen task set, by URL (the host's side): `map_path` is its files.json,
    the bytes in the `files/` folder beside it."""

    def __init__(self, map_path: str | Path):
        self.map_path = Path(map_path)
        self.store = self.map_path.parent / STORE
        self.files = read_map(self.map_path)["files"]

    def entry(self, url: str) -> Mapping:
        if url not in self.files:
            raise FileNotFrozen(f"{url}: not among the frozen files ({self.map_path})")
        return self.files[url]

    def path(self, url: str) -> Path:
        """The stored file of `url`, its size and digest checked (FileNotFrozen otherwise)."""
        entry = self.entry(url)
        path = blob(self.store, entry["sha256"])
        if not path.is_file() or path.stat().st_size != entry["size"]:
            raise FileNotFrozen(f"{url}: {path} is missing or not {entry['size']} bytes")
        if sha256_file(path) != entry["sha256"]:
            raise FileNotFrozen(f"{url}: {path} does not hash to its name")
        return path

    def read(self, url: str) -> bytes:
        return self.path(url).read_bytes()
