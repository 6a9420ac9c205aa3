"""What an OSWorld task downloads: the URL of every file its set-up, its evaluator's `postconfig`
and its `cloud_file` expectations fetch, read from the task's JSON (pure; nothing is fetched).

OSWorld's forms (desktop-env 1.0.2): a set-up or postconfig step
`{"type": "download", "parameters": {"files": [{"url": ..., "path": ...}, ...]}}`, which its
host fetches and uploads to `path` in the machine (`SetupController._download_setup`); and a
getter `{"type": "cloud_file", "path": url, "dest": name}` (with `"multi": true`, `path` and
`dest` are lists of the same length), which fetches each URL into the checker's cache under
`dest` (`get_cloud_file`). A task file is untrusted, so only http and https URLs are accepted:
`problem` names anything else before a byte is fetched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from envab.envs.tasks.evaluators import bare_file_name
from envab.errors import Refusal

SCHEMES = ("http", "https")
MAX_URL = 2048  # a longer "URL" in a task file is not one a file host serves


@dataclass(frozen=True)
class Download:
    url: str
    where: str  # the field that names it: "config[0]", "evaluator.expected[1]", ...
    # the file's name where it lands: a path in the environment (set-up), or the getter's
    # `dest` in the checker's cache (cloud_file)
    dest: str


class Malformed(Refusal, ValueError):
    """A download step or cloud_file getter that is not in OSWorld's form; names the field."""


def downloads(task: Mapping) -> list[Download]:
    """Every file `task` downloads, in the order its fields name them (Malformed on a step or
    getter that does not have OSWorld's form)."""
    ev = task.get("evaluator") or {}
    found = []
    for where, steps in (("config", task.get("config")), ("evaluator.postconfig",
                                                            ev.get("postconfig"))):  # fmt: skip
        for i, step in enumerate(steps or []):
            if isinstance(step, Mapping) and step.get("type") == "download":
                found += _step(step.get("parameters") or {}, f"{where}[{i}]")
    func = ev.get("func")
    for key in ("result", "expected"):
        value = ev.get(key)
        many = isinstance(func, list) and isinstance(value, list)
        for i, getter in enumerate(value if many else [value]):
            if isinstance(getter, Mapping) and getter.get("type") == "cloud_file":
                found += _cloud_file(getter, f"evaluator.{key}" + (f"[{i}]" if many else ""))
    return found


def _step(params: Mapping, where: str) -> list[Download]:
    files = params.get("files")
    if not isinstance(files, list) or not files:
        raise Malformed(f"{where}: a download step's parameters.files must be a non-empty list")
    out = []
    for j, f in enumerate(files):
        if not (isinstance(f, Mapping) and _text(f.get("url")) and _text(f.get("path"))):
            raise Malformed(f"{where}.parameters.files[{j}] must be {{url, path}}, both strings")
        out.append(Download(f["url"], f"{where}.parameters.files[{j}]", f["path"]))
    return out


def _cloud_file(getter: Mapping, where: str) -> list[Download]:
    paths, dests = getter.get("path"), getter.get("dest")
    if getter.get("multi", False):
        ok = (
            isinstance(paths, list)
            and isinstance(dests, list)
            and len(paths) == len(dests) > 0
            and all(_text(p) for p in paths)
        )
        if not ok:
            raise Malformed(f"{where}: a multi cloud_file's path and dest are lists of one length")
    else:
        if not _text(paths):
            raise Malformed(f"{where}: a cloud_file's path must be a URL")
        paths, dests = [paths], [dests]
    for dest in dests:
        if not bare_file_name(dest):  # it lands in the checker's cache folder, by this name
            raise Malformed(f"{where}: cloud_file dest {dest!r} is not a bare file name")
    return [
        Download(url, f"{where}.path" + (f"[{k}]" if len(paths) > 1 else ""), dest)
        for k, (url, dest) in enumerate(zip(paths, dests, strict=True))
    ]


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def problem(url: str) -> str | None:
    """Why `url` may not be fetched (None: it may): http or https with a host, nothing else (a
    task file naming file:// or ftp:// would read the freezing machine or another service)."""
    if len(url) > MAX_URL or any(c.isspace() or ord(c) < 32 for c in url):
        return f"{url[:80]!r} is not a URL"
    try:
        parts = urlsplit(url)
    except ValueError as e:
        return f"{url[:80]!r} is not a URL ({e})"
    if parts.scheme.lower() not in SCHEMES:
        return f"{url[:80]!r}: only {' and '.join(SCHEMES)} URLs are fetched, not {parts.scheme!r}"
    if not parts.hostname:
        return f"{url[:80]!r} names no host"
    return None
