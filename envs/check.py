"""One conformance check for every backend, as Gymnasium's `check_env` is for environments.

    from envab.envs.check import check_backend
    with open_arm(arm, allow_faults=True) as backend:
        passed = check_backend(backend, task, oracle)      # the names of the checks it passed

What every backend of the session protocol (envs/protocol.py) must do, whatever runs behind it
(a forked process, a gVisor sandbox, a QEMU VM, the Pillow desktop or the X desktop):

- create: a session with an id, a valid first observation (generation 0) whose screenshot comes
  from the environment and is not blank, and a state digest;
- step: the oracle's actions are accepted, each gives the next generation and a fresh screenshot;
- refuse: an action off the screen is refused with a ValueError (ActionRejected) and changes
  nothing (same generation);
- fork or refuse: `can_fork` backends give n children in the parent's exact state (same screen,
  same state digest), which then go their own ways; the others raise ForkUnsupported;
- verify: the oracle scores 1.0 and a fresh session's no-op 0.0, both valid;
- close: twice is harmless;
- faults -> gates (a backend opened with fault switches): each fault makes its episode invalid
  with exactly the gate envs/faults.py names, never a crash and never a score.

A failed check raises `NonConformance` naming it; the caller's test shows which backend failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from envab.envs.protocol import (
    Backend,
    ForkUnsupported,
    Gate,
    Session,
    Verification,
    is_blank,
)

# fault switch -> the one gate it must fail (envs/faults.py), and when it fires: at create, on
# the first accepted step, or at verify.
FAULT_GATES: dict[str, tuple[dict, str, str]] = {
    "corrupt_restore": ({"corrupt_restore": True}, str(Gate.STATE_HASH), "create"),
    "kill_at_step": ({"kill_at_step": 1}, str(Gate.WORKER_ALIVE), "step"),
    "blank_at_step": ({"blank_at_step": 1}, str(Gate.SCREEN_NOT_BLANK), "step"),
    "stale_at_step": ({"stale_at_step": 1}, str(Gate.SCREEN_CURRENT), "step"),
    "verifier_unavailable": (
        {"verifier_unavailable": True},
        str(Gate.VERIFIER_AVAILABLE),
        "verify",
    ),
}
OFF_SCREEN = {"action_type": "CLICK", "parameters": {"x": 100_000, "y": 100_000}}


class NonConformance(AssertionError):
    """The backend broke the session protocol; the message names the check and what was seen."""


def _expect(ok: bool, check: str, seen) -> None:
    if not ok:
        raise NonConformance(f"{check}: {seen}")


def _observed(session: Session, check: str, generation: int) -> None:
    obs = session.observation
    _expect(obs.valid, check, f"invalid observation ({obs.verdict}, {list(obs.failed_gates)})")
    _expect(obs.generation == generation, check, f"generation {obs.generation}, not {generation}")
    _expect(obs.screenshot is not None, check, "no screenshot")
    _expect(not is_blank(obs.screenshot), check, "a blank screenshot")


def _play(session: Session, actions: Sequence[Mapping], check: str) -> None:
    for action in actions:
        before = session.generation
        obs = session.step(action, generation=before)
        _expect(obs.valid, check, f"{action['action_type']}: invalid ({list(obs.failed_gates)})")
        _expect(obs.generation == before + 1, check, f"generation {before} -> {obs.generation}")


def _scored(verification: Verification, score: float, check: str) -> None:
    _expect(
        verification.valid and verification.score == score,
        check,
        f"{verification.verdict} {list(verification.failed_gates)} score {verification.score}",
    )


def check_create(backend: Backend, task: Mapping) -> None:
    with backend.create(task) as session:
        _expect(isinstance(session.env_id, str) and session.env_id, "create", "no env_id")
        _observed(session, "create", 0)


def check_step_and_verify(backend: Backend, task: Mapping, oracle: Sequence[Mapping]) -> None:
    with backend.create(task) as session:
        _play(session, oracle, "step")
        _scored(session.verify(), 1.0, "verify oracle")
    with backend.create(task) as session:
        _scored(session.verify(), 0.0, "verify no-op")


def check_refuse(backend: Backend, task: Mapping) -> None:
    with backend.create(task) as session:
        before = session.observation
        try:
            session.step(OFF_SCREEN, generation=before.generation)
        except ValueError:
            pass
        else:
            raise NonConformance("refuse: an action off the screen was accepted")
        obs = session.observation
        _expect(
            obs.valid and obs.generation == before.generation, "refuse", "it changed the session"
        )


def check_fork(backend: Backend, task: Mapping, oracle: Sequence[Mapping]) -> None:
    with backend.create(task) as parent:
        if not backend.can_fork:
            try:
                parent.fork(2)
            except ForkUnsupported:
                return
            raise NonConformance("fork: can_fork is False but fork(2) gave children")
        _play(parent, oracle[:1], "fork (parent)")
        shot, state = parent.observation.screenshot, parent.observation.state_sha256
        children = parent.fork(2)
        try:
            _expect(len(children) == 2, "fork", f"{len(children)} children for 2")
            for child in children:
                obs = child.observation
                _expect(obs.valid, "fork", f"an invalid child ({list(obs.failed_gates)})")
                _expect(
                    obs.screenshot.tobytes() == shot.tobytes(), "fork", "not the parent's screen"
                )
                same = state is None or obs.state_sha256 == state
                _expect(same, "fork", "not the parent's state digest")
            _play(children[0], oracle[1:], "fork (child)")
            _scored(children[0].verify(), 1.0, "fork (child's verify)")
        finally:
            for child in children:
                child.close()


def check_close(backend: Backend, task: Mapping) -> None:
    session = backend.create(task)
    session.close()
    session.close()


def check_fault(backend: Backend, task: Mapping, oracle: Sequence[Mapping], name: str) -> str:
    """One fault to its gate; returns what was checked (a corrupt start is checked on a fork
    child where the task names no initial state: a create has nothing to compare it with)."""
    faults, gate, when = FAULT_GATES[name]
    if name == "corrupt_restore" and not task["evaluator"].get("initial_state_sha256"):
        if not backend.can_fork:
            return f"fault {name}: not checkable (the task names no initial state, no fork)"
        with backend.create(task) as parent:
            (child,) = parent.fork(1, faults=[faults])
            with child:
                obs = child.observation
                _expect(not obs.valid, name, "a dirty fork child was valid")
                _expect(obs.failed_gates[:1] == (gate,), name, f"gates {list(obs.failed_gates)}")
        return f"fault {name} (on a fork child)"
    _check_fault_at(backend, task, oracle, name, faults, gate, when)
    return f"fault {name}"


def _check_fault_at(backend, task, oracle, name: str, faults: dict, gate: str, when: str) -> None:
    with backend.create(task, faults=faults) as session:
        obs = session.observation
        if when == "step":
            _expect(obs.valid, name, f"invalid before the faulty step ({list(obs.failed_gates)})")
            obs = session.step(oracle[0], generation=obs.generation)
        if when in ("create", "step"):
            _expect(not obs.valid, name, "the fault left the observation valid")
            _expect(obs.failed_gates[:1] == (gate,), name, f"gates {list(obs.failed_gates)}")
            _expect(obs.screenshot is None, name, "an invalid observation with a screenshot")
            return
        _play(session, oracle, name)
        verification = session.verify()
        _expect(not verification.valid, name, "the fault left the verification valid")
        _expect(verification.score is None, name, f"scored {verification.score}")
        _expect(gate in verification.failed_gates, name, f"gates {verification.failed_gates}")


def check_backend(
    backend: Backend,
    task: Mapping,
    oracle: Sequence[Mapping],
    *,
    faults: Sequence[str] = (),
) -> list[str]:
    """Every check on `backend` with `task` and its oracle's actions (at least one); `faults`:
    the fault switches to try (the backend must have been opened with them allowed). Returns the
    names of the checks passed; raises NonConformance at the first that fails."""
    if not oracle:
        raise ValueError("check_backend needs a task whose oracle takes at least one action")
    passed = []
    for name, check in (
        ("create", lambda: check_create(backend, task)),
        ("step and verify", lambda: check_step_and_verify(backend, task, oracle)),
        ("refuse", lambda: check_refuse(backend, task)),
        ("fork", lambda: check_fork(backend, task, oracle)),
        ("close", lambda: check_close(backend, task)),
    ):
        check()
        passed.append(name)
    for name in faults:
        passed.append(check_fault(backend, task, oracle, name))
    return passed
