"""The environment class TRL's GRPOTrainer drives (`environment_factory`), on one arm's backend.

TRL makes one instance per completion and calls, per GRPO step:

    reset(**row)      for every completion of the generation batch (G consecutive per prompt);
    <tool>(**args)    whenever the model emits a tool call (the public methods are the tools);
                      a turn's calls across the batch run at once (trainer/toolcalls.py);
    get_reward()      once per completion, after generation: the verifier's score, or None.

The tools are the run's tool set (`envab.trainer.agent.ToolSet`: same names, signatures and
docstrings, so the schema TRL renders is the one the evaluation renders); each maps its call to a
computer_13 action (`ToolSet.action_for`), steps the session and returns the new screenshot as an
image block.

Three outcomes, never two: an attempt whose environment failed a gate (at start, on a step, or in
the verifier) is *invalid*: `get_reward()` returns None, which TRL leaves out of the group's mean
and std and gives zero advantage; it is recorded with its verdict and failed gates and is never
scored 0. After a gate failure mid-episode the tools only answer that the episode is over.

The first screenshot is the environment's: `reset` returns it with the instruction, and TRL
appends both to the row's empty first user turn (`agent.dataset_row`), so the prompt the policy
sees is the arm's own screen, on every backend. Two gates are checked here on top of the
backend's, where the run asks for them: the session's state hash must be the task's
`evaluator.initial_state_sha256` (when the task names one), and on an arm that promises
deterministic screens the first screenshot must equal the in-process render
(`agent.rendered_first_screens`). Both failures are recorded as the `state_hash` gate (verdict
`state_mismatch`): the state the policy starts from is not the task's.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from envab.envs.protocol import Gate, Session, Verification
from envab.hashing import sha256_json
from envab.receipts import utc_now
from envab.trainer import agent
from envab.trainer.accounting import Attempt, Ledger
from envab.trainer.forkgroups import ForkGroups
from envab.trainer.guards import GuardError, HeldoutGuard
from envab.trainer.resume import moment
from envab.trainer.step_times import StepTimes
from envab.trainer.toolcalls import in_batch

log = logging.getLogger(__name__)

EPISODE_OVER = "The episode is over."
ENV_FAILED = "The episode is over: the environment failed."


class GenerationClock:
    """Generation seconds per attempt, measured from outside TRL.

    Within one generation batch TRL resets every environment, then generates all completions
    (running tool calls between turns), then asks every environment for its reward. Generation is
    batched, so no per-completion time exists: a batch's generation time is the span from its
    last reset to its first reward, less the seconds spent in environment calls inside that span,
    split equally over the batch's attempts. The split is a convention; the total is measured.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.resets = self.rewards = 0
        self.last_reset = 0.0
        self.env_seconds = 0.0
        self.share: float | None = None

    def reset_done(self) -> None:
        if self.rewards and self.rewards == self.resets:  # the previous batch is complete
            self.resets = self.rewards = 0
            self.env_seconds = 0.0
            self.share = None
        self.resets += 1
        self.last_reset = self.clock()

    def env_call(self, seconds: float) -> None:
        self.env_seconds += seconds

    def reward_share(self) -> float:
        if self.share is None:
            span = self.clock() - self.last_reset - self.env_seconds
            self.share = max(span, 0.0) / max(self.resets, 1)
        self.rewards += 1
        return self.share


@dataclass
class Run:
    """What every environment instance of one (arm, seed) run shares."""

    tasks: dict[str, dict]  # training tasks by id (held-out ones are never loaded)
    # task id -> screenshot_sha256 of the in-process render, on an arm that promises deterministic
    # screens; None: the environment's first screenshot is taken as it comes.
    first_screens: dict[str, str] | None
    guard: HeldoutGuard
    ledger: Ledger
    groups: ForkGroups
    tools: agent.ToolSet
    max_turns: int
    clock: GenerationClock = field(default_factory=GenerationClock)
    times: StepTimes = field(default_factory=StepTimes)  # where each step's wall-clock goes
    step: int = 0  # the GRPO step being generated (set by the trainer's callback)


@dataclass
class Episode:
    task: dict
    session: Session
    fork_parent: str | None
    env_seconds: float
    started_utc: str
    turns: int = 0
    actions: int = 0  # actions sent to the environment (a refused one included)
    refused: int = 0  # of them, those the environment refused (nothing changed)
    sent: list[dict] = field(default_factory=list)  # the actions sent (recorded, and digested)
    over: bool = False
    failed_gates: tuple[str, ...] = ()


class ArmEnvironment:
    """One completion's environment; `environment_class(tools)` adds the tools as methods."""

    def __init__(self, run: Run):
        self.run = run
        self.episode: Episode | None = None
        self.invalid = False  # the last attempt's: no reward, masked out of the update

    def reset(self, task_id: str, **row) -> list[dict]:
        """Start the row's task; returns the first user turn (the environment's first screenshot,
        then the instruction) for TRL to append to the row's empty prompt."""
        self.run.guard(task_id)  # a held-out id fails the run here
        task = self.run.tasks.get(task_id)
        if task is None:
            raise GuardError(f"task {task_id!r} is not in the training split")
        self._close_session()
        moment("env_reset")
        with self.run.times.span("environment"):
            start = self.run.groups.start(task)
        episode = Episode(task, start.session, start.fork_parent, start.env_seconds, utc_now())
        obs = start.session.observation
        # After a prefix the state is the prefix's; the backend checked the initial one.
        expected_state = (
            None if self.run.groups.prefix else task["evaluator"].get("initial_state_sha256")
        )
        screens = self.run.first_screens
        if not obs.valid:
            episode.failed_gates = tuple(obs.failed_gates)
        elif (expected_state is not None and obs.state_sha256 != expected_state) or (
            screens is not None and agent.screenshot_sha256(obs.screenshot) != screens[task_id]
        ):
            episode.failed_gates = (str(Gate.STATE_HASH),)
        episode.over = bool(episode.failed_gates)
        self.episode = episode
        self.run.clock.reset_done()
        return agent.first_turn(task, None if episode.over else obs.screenshot)

    def _act(self, name: str, arguments: dict) -> list[dict]:
        """One tool call: map it to an action, step the session, return the new screenshot."""
        ep = self.episode
        if ep is None or ep.over:
            return agent.tool_result(note=ENV_FAILED if ep and ep.failed_gates else EPISODE_OVER)
        ep.turns += 1
        ep.over = ep.turns >= self.run.max_turns
        try:
            action = self.run.tools.action_for(name, arguments)
        except ValueError as e:  # the policy's mistake, not the environment's: nothing happens
            return agent.tool_result(note=f"Refused: {e}")
        t0 = time.monotonic()
        ep.actions += 1
        ep.sent.append(dict(action))
        moment("env_step")
        # Inside a turn's batch (trainer/toolcalls.py) the trainer's thread times the batch as a
        # whole; this thread times only its attempt.
        timed = not in_batch()
        try:
            with self.run.times.span("environment") if timed else contextlib.nullcontext():
                obs = ep.session.step(action, generation=ep.session.generation)
        except ValueError as e:  # e.g. off screen; the desktop did not change
            # Every backend refuses with a ValueError (the Drums client's ActionRejected is one,
            # carrying the host's first line), so the policy reads the same note on every arm.
            ep.refused += 1
            return agent.tool_result(note=f"Refused: {next(iter(str(e).splitlines()), '')}")
        finally:
            seconds = time.monotonic() - t0
            ep.env_seconds += seconds
            if timed:
                self.run.clock.env_call(seconds)
        if not obs.valid:
            ep.failed_gates, ep.over = tuple(obs.failed_gates), True
            return agent.tool_result(note=ENV_FAILED)
        ep.over = ep.over or obs.done
        return agent.tool_result(obs.screenshot)

    def _reject_completion(self) -> None:
        """The policy's completion held a token no turn may contain (trainer/generation.py): the
        attempt is invalid, whatever the environment said. Private: TRL offers every public
        method to the policy as a tool."""
        gate = str(Gate.COMPLETION_TOKENS)
        if self.episode is not None and gate not in self.episode.failed_gates:
            self.episode.failed_gates += (gate,)
            self.episode.over = True

    def get_reward(self) -> float | None:
        """Verify, record the attempt, and return its reward: the score, or None if invalid."""
        ep = self.episode
        generation_seconds = self.run.clock.reward_share()
        t0 = time.monotonic()
        with self.run.times.span("environment"):
            if ep.failed_gates:
                verification = Verification.invalid(ep.failed_gates)
            else:
                verification = ep.session.verify()
            self._close_session()
        ep.env_seconds += time.monotonic() - t0
        attempt = Attempt(
            task_id=ep.task["id"],
            env_id=ep.session.env_id,
            fork_parent=ep.fork_parent,
            verdict=verification.verdict,
            failed_gates=tuple(verification.failed_gates),
            score=verification.score,
            turns=ep.turns,
            actions=ep.actions,
            refused=ep.refused,
            env_seconds=ep.env_seconds,
            generation_seconds=generation_seconds,
            started_utc=ep.started_utc,
            ended_utc=utc_now(),
            trusted=verification.trusted,
            audit_flags=verification.audit_flags,
            sandbox=verification.audit.get("sandbox"),
            partial_score=verification.audit.get("partial_score"),
            actions_sha256=sha256_json(ep.sent),
            sent=tuple(ep.sent),
        )
        self.run.ledger.record(attempt, self.run.step)
        self.invalid = attempt.reward is None  # read by the trainer: masked out of the update
        return attempt.reward

    def _close_session(self) -> None:
        if self.episode is not None:
            self.episode.session.close()


def _tool_method(tool: Callable) -> Callable:
    """A method that performs `tool` and presents exactly its schema: TRL reads the name,
    signature, type hints and docstring of each public method to render the tool list.

    The method takes any keyword arguments and presents the tool's signature: TRL calls a tool
    with the arguments the model wrote, so a method with the tool's own signature would answer a
    wrong call with TRL's `{"error": ...}` (a TypeError) instead of the "Refused: ..." note every
    backend and the evaluation give, and the policy would read different text on different paths.
    """
    name = tool.__name__

    def method(self, **arguments):
        return self._act(name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = tool.__doc__
    method.__annotations__ = dict(tool.__annotations__)
    receiver = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = inspect.signature(tool).replace(
        parameters=[receiver, *inspect.signature(tool).parameters.values()]
    )
    return method


def environment_class(tools: agent.ToolSet) -> type[ArmEnvironment]:
    """ArmEnvironment with one public method per tool of `tools`: all TRL sees as tools."""
    methods = {tool.__name__: _tool_method(tool) for tool in tools.tools}
    return type("ArmEnvironment", (ArmEnvironment,), methods)


def environment_factory(run: Run) -> Callable[[], ArmEnvironment]:
    """What GRPOTrainer(environment_factory=...) calls once per concurrent completion."""
    cls = environment_class(run.tools)
    return lambda: cls(run)
