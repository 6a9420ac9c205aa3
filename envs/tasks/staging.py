"""The host's side of a task's frozen files: the environment and the checker get them from the
store the freeze wrote (`envs/tasks/filestore.py`), never from the network.

- A set-up (or `postconfig`) `download` step: before the environment runs the steps, the host
  sends each file they name as `stage` messages over the environment's channel, in parts that
  fit a frame (`stage_messages`); the in-environment server checks the digest and its `download`
  step copies the file to its path (envs/xdesktop/server.py).
- A `cloud_file` expectation: the checker asks for `CLOUD_FILE_ROUTE?url=<url>` through its relay,
  and the host answers from the store (`cloud_file_reply`) instead of passing it to the
  environment; the getter (envs/xdesktop/cloud_files.py) places the bytes in its cache, where
  desktop-env's own `get_cloud_file` finds them and fetches nothing. Only the files the task's
  own evaluator names (`cloud_urls`): a checker cannot read another task's expected files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from urllib.parse import parse_qs, urlsplit

from envab.envs.tasks.filestore import FileNotFrozen, FrozenFiles

PART = 8 * 2**20  # bytes a stage message carries: base64 of it is well within a frame
CLOUD_FILE_ROUTE = "/cloud_file"
# the largest file a reply to the checker carries: its frame holds it as base64 (a third more)
# within the channel's 64 MiB
MAX_CLOUD_FILE = 40 * 2**20


def step_urls(steps: list | None) -> list[str]:
    """The URLs of the `download` steps among `steps`, in order, each once."""
    urls: list[str] = []
    for step in steps or []:
        if not isinstance(step, Mapping) or step.get("type") != "download":
            continue
        files = (step.get("parameters") or {}).get("files")
        for f in files if isinstance(files, list) else []:
            url = f.get("url") if isinstance(f, Mapping) else None
            if not isinstance(url, str):
                raise FileNotFrozen(f"a download step names {url!r}, not a URL")
            if url not in urls:
                urls.append(url)
    return urls


def stage_messages(steps: list | None, files: FrozenFiles | None) -> Iterator[tuple]:
    """("stage", url, sha256, offset, part, size) messages that deliver every file the
    `download` steps among `steps` name, read from the store and checked against its digest
    first. FileNotFrozen when a file is not in the store (or this host has none)."""
    urls = step_urls(steps)
    if urls and files is None:
        raise FileNotFrozen(f"{urls[0]}: this host has no frozen files (start it with --files)")
    for url in urls:
        data, entry = files.read(url), files.entry(url)
        for offset in range(0, max(len(data), 1), PART):
            yield ("stage", url, entry["sha256"], offset, data[offset : offset + PART], len(data))


def is_cloud_file(path: str) -> bool:
    return urlsplit(path).path == CLOUD_FILE_ROUTE


def cloud_urls(evaluator: Mapping) -> frozenset[str]:
    """The URLs the `cloud_file` getters of `evaluator` name (its result and expected, each
    one getter or a list; a getter's `path` one URL or, `multi`, a list)."""
    found = set()
    for key in ("result", "expected"):
        value = evaluator.get(key)
        for getter in value if isinstance(value, list) else [value]:
            if isinstance(getter, Mapping) and getter.get("type") == "cloud_file":
                paths = getter.get("path")
                found |= {p for p in (paths if isinstance(paths, list) else [paths])
                          if isinstance(p, str)}  # fmt: skip
    return frozenset(found)


def cloud_file_reply(path: str, files: FrozenFiles | None, allowed: frozenset[str]) -> dict:
    """The answer to a checker's `CLOUD_FILE_ROUTE?url=...`: the file's bytes from the store
    when `allowed` (the task's own `cloud_urls`) names it, or an error status naming why not
    (the getter then fails, and the attempt is invalid)."""
    urls = parse_qs(urlsplit(path).query).get("url", [])
    if len(urls) != 1:
        return _error(400, "ask for one url")
    if urls[0] not in allowed:
        return _error(403, f"{urls[0]} is no cloud file of this task's evaluator")
    try:
        if files is None:
            raise FileNotFrozen("this host has no frozen files (start it with --files)")
        if files.entry(urls[0])["size"] > MAX_CLOUD_FILE:
            return _error(413, f"{urls[0]} is over {MAX_CLOUD_FILE} bytes")
        data = files.read(urls[0])
    except FileNotFrozen as e:
        return _error(404, str(e))
    return {"status": 200, "content_type": "application/octet-stream", "body": data}


def _error(status: int, text: str) -> dict:
    return {"status": status, "content_type": "text/plain", "body": text.encode()}
