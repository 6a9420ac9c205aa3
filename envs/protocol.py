"""The session protocol every environment backend speaks (embedded host, Drums, QEMU pool).

A backend creates one session per task; a session is one environment running one episode:

    with backend.create(task) as session:         # the task's set-up has run, gates checked
        obs = session.observation                 # first screenshot, generation 0
        while obs.valid and not obs.done:
            obs = session.step(policy(obs))       # one action -> next screenshot + generation
        verification = session.verify()           # score + verdict + failed gates + audit

`fork(n)` turns a prepared session into n children in exactly its state (for GRPO groups from
one reached state); a backend that cannot fork raises `ForkUnsupported`.

Three outcomes, never two: a valid episode carries a score (1.0 or 0.0); an episode where any
gate failed is *invalid*, carries no score at all (`score is None`), and names its verdict and the
gates that failed. An invalid episode is never scored 0.

Verdicts (the one place they are defined):

    valid                 every gate passed and the checker ran
    env_failure           the environment broke: worker died, set-up failed, host unreachable,
                          or the host's answer was malformed (gate host_answer)
    state_mismatch        contamination: the state after restore/fork is not the expected state
    stale_generation      an action was chosen from an old screenshot (generation mismatch), or
                          the screenshot shown was drawn before the last action (a stale display)
    timeout               a step or set-up took longer than its limit
    blank_screen          the screenshot was a single colour (a black or dead display)
    verifier_unavailable  the checker could not run (crashed, or the verifier was unreachable)
    invalid_completion    the policy's sampler emitted a token no turn may contain (a vision
                          placeholder): a generation server ignored the suppression
                          (trainer/generation.py); decided on the training host, not by a backend

Gates (what is checked, and the verdict its failure gives): see `GATE_VERDICT`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from PIL import Image


class Verdict(StrEnum):
    VALID = "valid"
    ENV_FAILURE = "env_failure"
    STATE_MISMATCH = "state_mismatch"
    STALE_GENERATION = "stale_generation"
    TIMEOUT = "timeout"
    BLANK_SCREEN = "blank_screen"
    VERIFIER_UNAVAILABLE = "verifier_unavailable"
    INVALID_COMPLETION = "invalid_completion"


class Gate(StrEnum):
    STATE_HASH = "state_hash"  # state after restore/fork == the expected (task's or parent's) hash
    SETUP = "setup"  # the task's set-up ran without error
    GENERATION = "generation"  # the action was chosen from the current screenshot
    WORKER_ALIVE = "worker_alive"  # the environment's process is alive and answering
    SESSION_KNOWN = "session_known"  # the host still holds the environment (no restart lost it)
    HOST_REACHABLE = "host_reachable"  # the client reached the host (client side only)
    # The host's answer is one the protocol has: every field of its JSON type and range, a PNG of a
    # sane size, within the size limit (client side only: envs/drums/answer.py).
    HOST_ANSWER = "host_answer"
    STEP_TIMEOUT = "step_timeout"  # the step (or set-up) finished within its limit
    SCREEN_NOT_BLANK = "screen_not_blank"  # the screenshot is not a single colour
    SCREEN_CURRENT = "screen_current"  # the screenshot was drawn after the last action
    VERIFIER_AVAILABLE = "verifier_available"  # the checker ran and gave 0 or 1
    COMPLETION_TOKENS = "completion_tokens"  # the sampled turns hold only tokens a turn may hold


GATE_VERDICT: dict[Gate, Verdict] = {
    Gate.STATE_HASH: Verdict.STATE_MISMATCH,
    Gate.SETUP: Verdict.ENV_FAILURE,
    Gate.GENERATION: Verdict.STALE_GENERATION,
    Gate.WORKER_ALIVE: Verdict.ENV_FAILURE,
    Gate.SESSION_KNOWN: Verdict.ENV_FAILURE,
    Gate.HOST_REACHABLE: Verdict.ENV_FAILURE,
    Gate.HOST_ANSWER: Verdict.ENV_FAILURE,
    Gate.STEP_TIMEOUT: Verdict.TIMEOUT,
    Gate.SCREEN_NOT_BLANK: Verdict.BLANK_SCREEN,
    Gate.SCREEN_CURRENT: Verdict.STALE_GENERATION,
    Gate.VERIFIER_AVAILABLE: Verdict.VERIFIER_UNAVAILABLE,
    Gate.COMPLETION_TOKENS: Verdict.INVALID_COMPLETION,
}

# computer_13 subset, with the parameters each action needs (pixel coordinates). Optional ones
# (SCROLL dx/x/y, CLICK button/num_clicks) pass through; the backend checks them in detail.
ACTION_PARAMETERS: dict[str, dict[str, type]] = {
    "CLICK": {"x": int, "y": int},
    "DOUBLE_CLICK": {"x": int, "y": int},
    "TYPING": {"text": str},
    "PRESS": {"key": str},
    "SCROLL": {"dy": int},
    "HOTKEY": {"keys": list},  # a key combination, e.g. ["ctrl", "s"] (the X desktop)
    "WAIT": {},
    "DONE": {},
    "FAIL": {},
}
TERMINAL_ACTIONS = frozenset({"DONE", "FAIL"})


class ForkUnsupported(NotImplementedError):
    """This backend cannot fork a running environment; create n sessions instead."""


class ActionRejected(ValueError):
    """The desktop refused the action (off screen, after DONE); nothing changed. The host answers
    HTTP 422 and the Drums client raises it again with the host's message."""


def check_action(action: Any) -> dict:
    """Return `action` as {"action_type", "parameters"} or raise ValueError naming what is wrong."""
    if not isinstance(action, Mapping):
        raise ValueError(f"action must be an object, got {type(action).__name__}")
    kind = action.get("action_type")
    if kind not in ACTION_PARAMETERS:
        raise ValueError(f"action_type {kind!r} is not one of {sorted(ACTION_PARAMETERS)}")
    params = action.get("parameters")
    params = {} if params is None else params
    if not isinstance(params, Mapping):
        raise ValueError(f"{kind}: parameters must be an object")
    for name, typ in ACTION_PARAMETERS[kind].items():
        value = params.get(name)
        # bool is an int in Python; a coordinate of True is a mistake.
        if not isinstance(value, typ) or isinstance(value, bool):
            raise ValueError(f"{kind}: parameter {name!r} must be {typ.__name__}, got {value!r}")
    return {"action_type": kind, "parameters": dict(params)}


def verdict_for(failed_gates: tuple[str, ...] | list[str]) -> Verdict:
    """The verdict of an episode from the gates that failed (the first failure decides). A gate
    this side has never heard of (a newer host's) is an environment failure: the episode stays
    invalid and the caller keeps the gate's own name in `failed_gates`."""
    if not failed_gates:
        return Verdict.VALID
    try:
        return GATE_VERDICT[Gate(failed_gates[0])]
    except ValueError:
        return Verdict.ENV_FAILURE


def mistyped(d: Mapping) -> list[str]:
    """The fields of a verifier's answer that are not of their protocol types, by name: `valid`
    a boolean, `verdict` a string, `score` a number or null (a boolean is not a number here),
    `failed_gates` a list of strings, `audit` an object."""
    if not isinstance(d, Mapping):
        return ["answer"]
    score = d.get("score")
    gates = d.get("failed_gates", [])
    checks = {
        "valid": isinstance(d.get("valid"), bool),
        "verdict": isinstance(d.get("verdict"), str),
        "score": score is None or (isinstance(score, int | float) and not isinstance(score, bool)),
        "failed_gates": gates is None
        or (isinstance(gates, list | tuple) and all(isinstance(g, str) for g in gates)),
        "audit": d.get("audit") is None or isinstance(d.get("audit"), Mapping),
    }
    return [name for name, ok in checks.items() if not ok]


def reported(valid, verdict, failed_gates) -> tuple[bool, str, tuple[str, ...]]:
    """(valid, verdict, failed_gates) as another process reported them, read safely: a verdict we
    do not know becomes the one its gates give (environment failure without any), an answer that
    contradicts itself (valid with a failed gate or an invalid verdict, invalid with the verdict
    valid) is invalid, and the gates keep their own names. Nothing unknown reaches the counters."""
    gates = tuple(str(g) for g in failed_gates or ())
    verdict = str(verdict)
    if verdict not in set(Verdict):
        verdict = str(verdict_for(gates) if gates else Verdict.ENV_FAILURE)
    valid = bool(valid) and verdict == Verdict.VALID and not gates
    if not valid and verdict == Verdict.VALID:
        verdict = str(Verdict.ENV_FAILURE)
    return valid, verdict, gates


def checked(checker, evaluator: Mapping, state: Mapping, audit: dict) -> Verification:
    """The one rule every backend applies to a checker's answer on state read back from an
    environment: 1.0 or 0.0 is a valid score; a checker that raises, or answers anything else,
    makes the episode invalid (verifier_unavailable) with no score, never a 0.
    `audit["checker_failure"]` ("crash" | "bad_score", or the `failure` an exception names, as
    the X desktop's checker process does: envs/xdesktop/checker.py) and `audit["checker_error"]`
    say which.

    A checker that declares `partial_credit` (OSWorld's evaluators: a fuzzy metric's ratio, the
    mean of an `and` list) may answer any fraction in [0, 1]. The contract's reward is 0 or 1, so
    the episode succeeds only on full credit: the score is 1.0 when the fraction is exactly 1 and
    0.0 otherwise (a valid failure, not an invalid episode), and the fraction itself is kept as
    `audit["partial_score"]` so no information is lost and either arm's partial states can be
    compared later. The rule is the same on every backend and arm, and part of the hashed code."""
    try:
        score = checker(evaluator, state)
    except Exception as e:  # the checker could not run
        failure = getattr(e, "failure", None)
        audit["checker_failure"] = failure if isinstance(failure, str) else "crash"
        audit["checker_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        return Verification.invalid([Gate.VERIFIER_AVAILABLE], **audit)
    if getattr(checker, "partial_credit", False) and _fraction(score):
        audit["partial_score"] = float(score)
        score = 1.0 if score == 1.0 else 0.0
    if score not in (0.0, 1.0):
        audit["checker_failure"] = "bad_score"
        audit["checker_error"] = f"checker returned {score!r}"
        return Verification.invalid([Gate.VERIFIER_AVAILABLE], **audit)
    return Verification(float(score), True, Verdict.VALID, (), dict(audit))


def _fraction(score) -> bool:
    """A real number in [0, 1] (not a bool, not NaN, not a string)."""
    return isinstance(score, int | float) and not isinstance(score, bool) and 0.0 <= score <= 1.0


def is_blank(image: Image.Image) -> bool:
    """A screenshot of a single colour: a black, white or otherwise dead display."""
    extrema = image.getextrema()
    if isinstance(extrema[0], int):  # single-band image
        extrema = (extrema,)
    return all(lo == hi for lo, hi in extrema)


@dataclass(frozen=True)
class Observation:
    """What the agent sees after create/fork/step: a screenshot and its generation number.

    `valid` is False once a gate failed; the screenshot is then None and the episode is over.
    """

    generation: int
    screenshot: Image.Image | None
    valid: bool = True
    verdict: str = Verdict.VALID
    failed_gates: tuple[str, ...] = ()
    done: bool = False  # the last action was DONE or FAIL
    state_sha256: str | None = None

    def __post_init__(self):
        if self.valid != (self.verdict == Verdict.VALID):
            raise ValueError(f"observation valid={self.valid} contradicts verdict {self.verdict}")


@dataclass(frozen=True)
class Verification(Mapping):
    """The verifier's answer: score + verdict + failed gates + audit.

    Also a read-only mapping (`v["score"]`, `dict(v)`), so duck-typed callers that expect the
    JSON object of the Drums protocol work unchanged; `to_dict()` gives a JSON-ready copy.
    """

    score: float | None
    valid: bool
    verdict: str
    failed_gates: tuple[str, ...] = ()
    audit: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.valid != (self.verdict == Verdict.VALID):
            raise ValueError(f"verification valid={self.valid} contradicts verdict {self.verdict}")
        if not self.valid and self.score is not None:
            raise ValueError(f"an invalid episode ({self.verdict}) carries no score")
        if self.valid and self.score not in (0.0, 1.0):
            raise ValueError(f"a valid episode's score is 0.0 or 1.0, got {self.score!r}")

    @classmethod
    def invalid(cls, failed_gates: list[str] | tuple[str, ...], **audit) -> Verification:
        gates = tuple(str(g) for g in failed_gates)
        return cls(None, False, str(verdict_for(gates)), gates, dict(audit))

    @classmethod
    def from_dict(cls, d: Mapping) -> Verification:
        """Another process's answer (a host's JSON). One that names a verdict or gate we do not
        know, or contradicts itself, is an invalid episode whose audit keeps what was said. So is
        one whose fields are not of their JSON types (`"valid": "false"` is not false, and is
        not true either: Python's truth of a string would make it valid): the gate host_answer,
        whatever validator stood before this one."""
        if wrong := mistyped(d):
            return cls.invalid([Gate.HOST_ANSWER], host_answer_types=wrong)
        audit = dict(d.get("audit") or {})
        valid, verdict, gates = reported(d["valid"], d["verdict"], d.get("failed_gates"))
        if (valid, verdict) != (bool(d["valid"]), d["verdict"]):
            audit["host_answer"] = {"verdict": d["verdict"], "valid": d["valid"]}
        score = d.get("score")
        return cls(
            score=float(score) if valid and score is not None else None,
            valid=valid,
            verdict=verdict,
            failed_gates=gates,
            audit=audit,
        )

    @property
    def reward(self) -> float | None:
        """What the trainer may use: the score of a valid episode, None for an invalid one."""
        return self.score if self.valid else None

    @property
    def audit_flags(self) -> tuple[str, ...]:
        """What the verifier's audit says went wrong (drums-verifiers names nondeterministic,
        redundant_disagree, scope_violation, checker_crash, checker_timeout, scope_unchecked);
        read from `audit_flags`, or `flags` as the embedded host writes them."""
        flags = self.audit.get("audit_flags", self.audit.get("flags")) or ()
        return tuple(str(f) for f in flags) if isinstance(flags, list | tuple) else ()

    @property
    def trusted(self) -> bool | None:
        """True only for a valid, scored episode whose audit says so and names no flag; None when
        the verifier sent no audit verdict (an older drumsd, a VM pool): never True by default.
        The audit never changes the score or validity; using it is the trainer's choice."""
        said = self.audit.get("trusted")
        if said is None:
            return None
        return bool(said) and self.valid and self.score is not None and not self.audit_flags

    def to_dict(self) -> dict:
        d = asdict(self)
        d["failed_gates"] = list(self.failed_gates)
        return d

    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("score", "valid", "verdict", "failed_gates", "audit"))

    def __len__(self) -> int:
        return 5


class Session(ABC):
    """One environment running one episode of one task."""

    env_id: str
    observation: Observation  # the latest observation (after create, fork or step)

    @property
    def generation(self) -> int:
        return self.observation.generation

    @property
    def valid(self) -> bool:
        return self.observation.valid

    @abstractmethod
    def step(self, action: Mapping, *, generation: int | None = None) -> Observation:
        """Apply one action chosen from screenshot `generation` (default: the latest one)."""

    def observe(self) -> Observation:
        """The screen as it is now, without acting: the same generation, a fresh screenshot
        (for letting a desktop settle). Gates apply as on a step."""
        raise NotImplementedError(f"{type(self).__name__} cannot look without acting")

    def fork(self, n: int) -> list[Session]:
        """n children in exactly this session's state; the parent stays usable."""
        raise ForkUnsupported(f"{type(self).__name__} cannot fork; create {n} sessions instead")

    @abstractmethod
    def verify(self) -> Verification:
        """Run the task's checker on the current state (outside the desktop)."""

    @abstractmethod
    def close(self) -> None:
        """Release the environment; closing twice is harmless."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def settle(session: Session, settle_s: float, poll_s: float = 0.1) -> Observation:
    """Let the desktop settle (drums-verifiers' settle before a fork): look until two screenshots
    `poll_s` apart are the same, for at most `settle_s`; the last observation."""
    obs = session.observation
    deadline = time.monotonic() + settle_s
    while obs.valid:
        time.sleep(poll_s)
        now = session.observe()
        same = (
            now.valid
            and now.screenshot is not None
            and obs.screenshot is not None
            and (now.screenshot.tobytes() == obs.screenshot.tobytes())
        )
        obs = now
        if same or time.monotonic() >= deadline:
            break
    return obs


class Backend(ABC):
    """Creates sessions; one per arm (restore host, fork host, Drums, QEMU pool)."""

    #: True when `Session.fork` works on this backend's sessions.
    can_fork: bool = False

    @abstractmethod
    def create(self, task: Mapping) -> Session:
        """A session for `task` with its set-up done and its first observation taken."""

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what the backend holds (connections); sessions should be closed first."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
