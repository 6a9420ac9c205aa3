"""An in-process backend over the embedded desktop: the session protocol without a host.

For the task validator and for tests; it checks the same gates a host checks at creation and on
every step (set-up ran, state hash equals the task's, screen not blank, checker ran), but it has
no worker process, no timeouts and no fork.
"""

from __future__ import annotations

from collections.abc import Mapping

from envab.envs.desktop import Desktop, screen_of
from envab.envs.protocol import (
    TERMINAL_ACTIONS,
    Backend,
    Gate,
    Observation,
    Session,
    Verification,
    check_action,
    checked,
    is_blank,
    verdict_for,
)
from envab.envs.tasks.checkers import check


class LocalSession(Session):
    def __init__(self, task: Mapping, env_id: str):
        self.env_id, self.task = env_id, task
        self.desktop: Desktop | None = None
        self.failed_gates: list[str] = []
        try:
            self.desktop = Desktop(*screen_of(task["config"]))
            self.desktop.setup(task["config"])
        except (ValueError, KeyError, TypeError):
            self._fail(Gate.SETUP, 0)
            return
        expected = task["evaluator"].get("initial_state_sha256")
        if expected is not None and self.desktop.state_hash() != expected:
            self._fail(Gate.STATE_HASH, 0)
            return
        self._observe(0, done=False)

    def _fail(self, gate: Gate, generation: int) -> Observation:
        self.failed_gates.append(str(gate))
        verdict = verdict_for(self.failed_gates)
        self.observation = Observation(
            generation, None, False, verdict, tuple(self.failed_gates), done=True
        )
        return self.observation

    def _observe(self, generation: int, done: bool) -> Observation:
        shot = self.desktop.screenshot()
        if is_blank(shot):
            return self._fail(Gate.SCREEN_NOT_BLANK, generation)
        self.observation = Observation(
            generation, shot, done=done, state_sha256=self.desktop.state_hash()
        )
        return self.observation

    def step(self, action: Mapping, *, generation: int | None = None) -> Observation:
        """Apply one action; a refused action raises ValueError and changes nothing."""
        if self.failed_gates:
            return self.observation
        self._open()
        if generation is not None and generation != self.generation:
            return self._fail(Gate.GENERATION, self.generation)
        action = check_action(action)
        self.desktop.apply(action)
        return self._observe(self.generation + 1, action["action_type"] in TERMINAL_ACTIONS)

    def observe(self) -> Observation:
        if self.failed_gates:
            return self.observation
        self._open()
        return self._observe(self.generation, self.observation.done)

    def verify(self) -> Verification:
        audit = {"env_id": self.env_id, "task": self.task["id"], "backend": "local"}
        if self.failed_gates:
            return Verification.invalid(self.failed_gates, **audit)
        self._open()
        return checked(check, self.task["evaluator"], self.desktop.state(), audit)

    def _open(self) -> None:
        if self.desktop is None:
            raise RuntimeError(f"session {self.env_id} is closed")

    def close(self) -> None:
        self.desktop = None


class LocalBackend(Backend):
    """Sessions on in-process desktops; `create(task)` runs the task's set-up and gates it."""

    def __init__(self):
        self._count = 0

    def create(self, task: Mapping) -> LocalSession:
        self._count += 1
        return LocalSession(task, f"local-{self._count}")
