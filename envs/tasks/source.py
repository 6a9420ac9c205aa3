"""A task as a task source gave it, and the refusal of a source that cannot be frozen: shared by
the loader (envs/osworld/source.py) and the freeze of the files its tasks download
(envs/tasks/fetch.py), which the loader's command runs."""

from __future__ import annotations

from dataclasses import dataclass

from envab.errors import Refusal


class TaskSourceError(Refusal, ValueError):
    """A task source that cannot be frozen; the message names the file or line and the reason."""


@dataclass(frozen=True)
class SourcedTask:
    task: dict  # the task's JSON, with the fields in ADDED when it came from a directory
    raw: bytes  # the original bytes (a file, or a tasks.jsonl line)
    origin: str  # the file (relative to the source) or "tasks.jsonl:<line>"
    # why no verifier here may score it, on any world: (reason, detail), e.g. a metric that
    # runs code on the host ("unsafe:metric:<name>") or one desktop-env lacks ("unknown:...")
    unscorable: tuple[tuple[str, str], ...] = ()
