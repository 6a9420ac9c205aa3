"""Fault-injection switches for one environment, as every arm reads them (tests, reliability runs).

The embedded host arms them in its worker processes (envs/host), the QEMU pool on its VMs
(envs/qemu/pool.py); a real Drums host is never asked. Step faults count the actions the
environment accepted, from 1 (a fork child counts on from its parent; a refused action, off
screen or after DONE, is not counted). Each fault fails exactly one gate, the same on every arm:

    kill_at_step          the environment's process dies (SIGKILL)        worker_alive
    stall_at_step         the environment hangs past the step's deadline   step_timeout
    blank_at_step         the step's screenshot is a single colour         screen_not_blank
    stale_at_step         the screenshot is the one from before the step   screen_current
    unknown_gate_at_step  the backend reports a gate no client knows       display_compositor
    restart_host_at_step  the host process dies mid-step and comes back    host_reachable (that
                          environment), session_known (the others it held); embedded host only
    corrupt_restore       the environment starts from a dirty state        state_hash
    verifier_unavailable  the checker cannot be reached                    verifier_available
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from envab.errors import Refusal

UNKNOWN_GATE = "display_compositor"  # the gate `unknown_gate_at_step` reports: no client knows it


class FaultError(Refusal, ValueError):
    """A fault switch that does not exist or has the wrong kind of value."""


@dataclass(frozen=True)
class Faults:
    kill_at_step: int | None = None
    stall_at_step: int | None = None
    blank_at_step: int | None = None
    stale_at_step: int | None = None
    unknown_gate_at_step: int | None = None
    restart_host_at_step: int | None = None
    corrupt_restore: bool = False
    verifier_unavailable: bool = False

    @classmethod
    def parse(cls, d: Mapping | None) -> Faults:
        if not d:
            return cls()
        if not isinstance(d, Mapping):
            raise FaultError("faults must be an object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise FaultError(f"unknown faults {unknown}; known: {sorted(known)}")
        for name, value in d.items():
            if name.endswith("_at_step"):
                if not (value is None or (type(value) is int and value >= 1)):
                    raise FaultError(f"fault {name} must be a step number from 1, got {value!r}")
            elif not isinstance(value, bool):
                raise FaultError(f"fault {name} must be true or false, got {value!r}")
        return cls(**d)

    def any(self) -> bool:
        return self != Faults()

    def at(self, name: str, step: int) -> bool:
        """Whether step fault `name` (without `_at_step`) fires on the environment's `step`."""
        return getattr(self, f"{name}_at_step") == step

    def for_worker(self) -> dict:
        """The switches a host's worker process acts on itself."""
        return {
            "kill_at_step": self.kill_at_step,
            "stall_at_step": self.stall_at_step,
            "blank_at_step": self.blank_at_step,
            "stale_at_step": self.stale_at_step,
            "corrupt_restore": self.corrupt_restore,
        }
