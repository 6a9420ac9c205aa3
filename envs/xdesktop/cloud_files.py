"""OSWorld's `cloud_file` getter, served from the task set's frozen files (the checker's side).

desktop-env's `get_cloud_file` fetches each URL into the checker's cache under its `dest` name,
unless a file of that name is there already. This places each file there first, its bytes asked
of the host through the checker's relay (`envs/tasks/staging.py`, which answers from the store the
freeze wrote), then calls desktop-env's getter unchanged: it finds every file and fetches
nothing. The checker has no network but loopback, so a file not served this way is not had.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Mapping
from urllib.parse import urlencode

from envab.envs.tasks.downloads import Download, downloads
from envab.envs.tasks.staging import CLOUD_FILE_ROUTE

TIMEOUT_S = 120.0


def get_cloud_file(desktop_env_getter, env, config: Mapping):
    """desktop-env's `get_cloud_file(env, config)` (`desktop_env_getter`, as evaluate.load
    loads it), each file from the host's store."""
    for d in _files(config):
        query = urlencode({"url": d.url})
        with urllib.request.urlopen(f"{env.http_server}{CLOUD_FILE_ROUTE}?{query}",
                                    timeout=TIMEOUT_S) as reply:  # fmt: skip
            data = reply.read()
        with open(os.path.join(env.cache_dir, d.dest), "wb") as f:  # dest: a bare name
            f.write(data)
    return desktop_env_getter(env, config)


def _files(config: Mapping) -> list[Download]:
    """The getter's (url, dest) pairs, read as the freeze read them (Malformed otherwise)."""
    return downloads({"evaluator": {"func": "m", "expected": dict(config)}})
