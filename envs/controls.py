"""Control arms: an arm's backend changed in one known way, so the analysis can be checked against
an answer known in advance (the pre-registration's `controls`; analysis/controls.py judges them).

- ``reset_delay_s`` (throughput handicap): every `create` (a task's environment set up: a restore,
  a fork group's parent) waits this long first. Nothing a policy sees or is rewarded with
  changes, so training must not diverge and the analysis must recover the added time.
- ``flip_rewards`` (silent corruption): that fraction of valid verifications has its score flipped
  (1 <-> 0) with the verdict left valid, so every gate passes; drawn from ``seed`` in the order
  episodes are verified. The checks must say the arms differ.

An arm with neither (the A/A control) is its base arm under another name.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import replace

from envab.envs.protocol import Backend, Observation, Session, Verification


class ControlBackend(Backend):
    def __init__(self, inner: Backend, control: Mapping, sleep=time.sleep):
        self.inner = inner
        self.can_fork = inner.can_fork
        self.reset_delay_s = float(control.get("reset_delay_s", 0.0))
        self.flip_rewards = float(control.get("flip_rewards", 0.0))
        self._draws = random.Random(f"env-ab-control:{control.get('seed', 0)}")
        self._sleep = sleep
        self.delays = 0  # creates that waited
        self.flips = 0  # verifications whose score was flipped

    def create(self, task: Mapping, **kwargs) -> Session:
        if self.reset_delay_s:
            self._sleep(self.reset_delay_s)
            self.delays += 1
        return ControlSession(self.inner.create(task, **kwargs), self)

    def corrupt(self, verification: Verification) -> Verification:
        """The verification as the corrupted arm reports it: the verdict kept, the score maybe
        flipped. One draw per valid verification, so the flipped episodes are the same on a
        rerun of the same run."""
        if not self.flip_rewards or not verification.valid:
            return verification
        if self._draws.random() >= self.flip_rewards:
            return verification
        self.flips += 1
        return replace(verification, score=1.0 - verification.score)

    def resume_state(self) -> dict:
        """Where the draws stand, for a run's resume point (trainer/resume.py)."""
        version, internal, gauss = self._draws.getstate()
        return {
            "draws": [version, list(internal), gauss],
            "delays": self.delays,
            "flips": self.flips,
        }

    def restore_state(self, state: Mapping) -> None:
        version, internal, gauss = state["draws"]
        self._draws.setstate((version, tuple(internal), gauss))
        self.delays, self.flips = state["delays"], state["flips"]

    def close(self) -> None:
        self.inner.close()


class ControlSession(Session):
    def __init__(self, inner: Session, backend: ControlBackend):
        self.inner = inner
        self.backend = backend
        self.env_id = inner.env_id

    @property
    def observation(self) -> Observation:
        return self.inner.observation

    def step(self, action: Mapping, *, generation: int | None = None) -> Observation:
        return self.inner.step(action, generation=generation)

    def observe(self) -> Observation:
        return self.inner.observe()

    def fork(self, n: int, **faults) -> list[Session]:
        return [ControlSession(child, self.backend) for child in self.inner.fork(n, **faults)]

    def verify(self) -> Verification:
        return self.backend.corrupt(self.inner.verify())

    def close(self) -> None:
        self.inner.close()
