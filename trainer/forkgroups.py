"""GRPO groups on the environment side: one prepared parent forked into G children, or G restores.

Why TRL cannot carry this: `GRPOTrainer` calls `reset(**row)` once per completion, each on its
own environment instance, one after another, and never tells an instance which other completions
share its prompt. The G completions of one prompt are simply G consecutive rows of the generation
batch (TRL's `RepeatSampler` repeats each prompt G times in a row). A fork needs all G at once
(one parent, `fork(G)`), so this layer, shared by every environment instance of a run, counts
resets: each run of G consecutive resets is one group, and all of them must name the same task
(checked; anything else means TRL's sampling changed under us).

On an arm whose backend can fork, the first reset of a group creates the parent (the task's
set-up runs once), forks it into G children and closes it; each reset of the group takes the next
child. On an arm that cannot fork, the first reset of a group creates (restores and sets up) all
G of its sessions, `parallel` at a time (as a fork host restores its children side by side), and
each reset takes the next; `parallel=1` creates each session at its own reset instead.
Either way the backend checks the session's state against the task's
`evaluator.initial_state_sha256` where the task names one, and the same drop rule applies
(trainer/environment.py).

A `prefix` (computer_13 actions, the same for every task and arm) is played before the group
starts, then the desktop is let settle (drums-verifiers' fork_n with a prefix and a settle): on
the parent before it forks, or on each session of a group that cannot fork, so every attempt
starts from the state the prefix reached, on every arm. An action the environment refuses is a
configuration error and stops the run; a gate failing during the prefix makes the group's
attempts invalid with that gate. Step faults count the prefix's actions too, on both kinds of arm
(a fork child counts on from its parent), so a plan names the steps after it.

Fault injection (tests and reliability runs): `faults` maps an attempt's ordinal (0-based count
of resets in the run) to the fault switches (envs/faults.py) for the environment that serves it:
its `create` on a restore arm, its child in the group's `fork` on a fork arm. `group_faults` maps
a group's ordinal to switches for the group's parent on a fork arm (a parent that fails a gate is
quarantined: every child it would have had is invalid with its gate), and for every `create` of
the group on a restore arm. Either way the same attempts fail the same gates on both arms.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from envab.envs.protocol import Backend, Session, settle


@dataclass
class Start:
    """The session one attempt runs in, and what starting it cost."""

    session: Session
    fork_parent: str | None
    env_seconds: float  # this attempt's share of creating (and forking) its session


class ForkGroups:
    def __init__(
        self,
        backend: Backend,
        group_size: int,
        faults: Mapping[int, Mapping] | None = None,
        clock: Callable[[], float] = time.monotonic,
        group_faults: Mapping[int, Mapping] | None = None,
        prefix: Sequence[Mapping] = (),
        settle_s: float = 0.0,
        parallel: int = 1,
    ):
        self.backend = backend
        self.parallel = max(1, min(parallel, group_size))
        self.group_size = group_size
        self.fork = bool(backend.can_fork)
        self.faults = dict(faults or {})
        self.group_faults = dict(group_faults or {})
        self.prefix = [dict(a) for a in prefix]
        self.settle_s = settle_s
        self.clock = clock
        self.resets = 0  # attempts started in this run
        self._task_id: str | None = None  # the open group's task
        self._children: list[Session] = []
        self._parent: str | None = None
        self._share = 0.0

    def start(self, task: Mapping) -> Start:
        ordinal, self.resets = self.resets, self.resets + 1
        member = ordinal % self.group_size
        if member == 0:
            self._task_id = task["id"]
        elif task["id"] != self._task_id:
            raise RuntimeError(
                f"GRPO group broken: completion {member} of a group of {self.group_size} is task "
                f"{task['id']!r}, the group's first was {self._task_id!r}"
            )
        if not self.fork and self.parallel == 1:
            t0 = self.clock()
            group = self.group_faults.get(ordinal // self.group_size)
            session = self._create(task, self.faults.get(ordinal), group)
            return Start(session, None, self.clock() - t0)
        if member == 0:
            ordinals = range(ordinal, ordinal + self.group_size)
            if self.fork:
                self._open_group(task, ordinals)
            else:
                self._create_group(task, ordinals)
        return Start(self._children.pop(0), self._parent, self._share)

    def _create_group(self, task: Mapping, ordinals) -> None:
        """A group's sessions on an arm that cannot fork, `parallel` created at once, each with
        its own attempt's faults; handed out in the attempts' order."""
        for child in self._children:
            child.close()
        self._children = []
        t0 = self.clock()
        group = self.group_faults.get(ordinals[0] // self.group_size)
        with ThreadPoolExecutor(self.parallel, thread_name_prefix="envab-create") as pool:
            futures = [pool.submit(self._create, task, self.faults.get(n), group) for n in ordinals]
        failed = [f.exception() for f in futures if f.exception() is not None]
        sessions = [f.result() for f in futures if f.exception() is None]
        if failed:  # a configuration error (a refused prefix) or a backend out of machines
            for session in sessions:
                session.close()
            raise failed[0]
        self._children, self._parent = sessions, None
        self._share = (self.clock() - t0) / self.group_size

    def _open_group(self, task: Mapping, ordinals) -> None:
        for child in self._children:  # a group left unfinished (cannot happen under TRL)
            child.close()
        t0 = self.clock()
        parent = self._create(task, None, self.group_faults.get(ordinals[0] // self.group_size))
        faults = [dict(self.faults.get(n, {})) for n in ordinals]
        try:
            if any(faults):
                self._children = parent.fork(self.group_size, faults=faults)
            else:
                self._children = parent.fork(self.group_size)
        finally:
            parent.close()
        self._parent = parent.env_id
        self._share = (self.clock() - t0) / self.group_size

    def _create(self, task: Mapping, own: Mapping | None, group: Mapping | None) -> Session:
        faults = {**(group or {}), **(own or {})}
        session = self.backend.create(task, **({"faults": faults} if faults else {}))
        self._prepare(session)
        return session

    def _prepare(self, session: Session) -> None:
        """Play the prefix and let the desktop settle (nothing when neither is set)."""
        if not (self.prefix or self.settle_s):
            return
        for n, action in enumerate(self.prefix):
            if not session.valid:
                return
            try:
                session.step(action)
            except ValueError as e:
                raise RuntimeError(
                    f"training.grpo.prefix[{n}] {action} was refused by the environment: {e}"
                ) from None
        if session.valid:
            settle(session, self.settle_s)

    def close(self) -> None:
        for child in self._children:
            child.close()
        self._children = []
