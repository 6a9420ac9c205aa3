"""Exact accounting of what a training run consumed: every attempt, and the counters at checkpoints.

Every attempt (valid or not) is one line of trajectories.jsonl. A checkpoint is due each time the
count of *valid* trajectories passes a multiple of the frozen checkpoint interval; its record
(one line of checkpoints.jsonl) carries the counters that time-to-target reads:

- ``wall_clock_s``: training wall-clock since the first step (after a restart: with the work the
  dead process lost, without the downtime; trainer/resume.py);
- ``env_host_hours`` and ``env_cost_usd``: hosts held x wall-clock, at the arm's price (the
  environment host is held for the whole run, busy or idle, so a faster environment that
  shortens the run is what makes it cheaper);
- ``env_busy_s``: the seconds spent inside environment calls (create, fork, step, verify);
- ``inference_s`` and ``inference_cost_usd``: generation time, at the inference price;
- ``valid_trajectories`` and ``invalid_discarded``.

Invalid attempts carry no reward (never 0), count on their own line and never toward a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field

from envab.io import append_jsonl
from envab.receipts import utc_now


@dataclass(frozen=True)
class Attempt:
    """One trajectory attempt, as the environment saw it."""

    task_id: str
    env_id: str | None
    fork_parent: str | None
    verdict: str
    failed_gates: tuple[str, ...]
    score: float | None
    turns: int  # tool calls the policy made
    actions: int  # of them, those sent to the environment (a refused action included)
    refused: int  # of those, the ones the environment refused (off screen, after DONE)
    env_seconds: float
    generation_seconds: float
    started_utc: str
    ended_utc: str
    trusted: bool | None = None  # the verifier's audit: None when it sent none (protocol.py)
    audit_flags: tuple[str, ...] = ()
    sandbox: dict | None = None  # where the environment ran, as the host's audit says (gVisor)
    partial_score: float | None = None  # an OSWorld evaluator's fraction behind a 0 or 1 score
    # sha256 of the canonical JSON of the actions sent to the environment, in order (a refused
    # one included): in a deterministic environment one task played with the same actions gets
    # the same reward, which analysis/reward_consistency.py checks without bit-determinism.
    actions_sha256: str | None = None
    # the actions themselves, as sent: what a cross-arm replay plays again on every arm
    # (eval/replay.py), the check of "same environment" that needs no bit-determinism
    sent: tuple[dict, ...] = ()

    @property
    def valid(self) -> bool:
        return self.verdict == "valid"

    @property
    def reward(self) -> float | None:
        return self.score if self.valid else None


@dataclass(frozen=True)
class Prices:
    host_usd_per_hour: float
    inference_usd_per_hour: float


def drums_record_line(line: Mapping) -> dict:
    """A trajectory as drums-verifiers' DRUMS_RECORD writes a scored trace: environment, parent,
    verdict, failed gates, score, reward handed out, audit flags, trusted, drop reason, timings.
    Append-only: a trace that a restart later loses (trainer/resume.py) keeps its line here;
    trajectories.jsonl is what the run counts."""
    valid = line["verdict"] == "valid"
    gates = ",".join(line["failed_gates"])
    return {
        "env": line["env_id"],
        "parent": line["fork_parent"],
        "task": line["task_id"],
        "arm": line["arm"],
        "seed": line["seed"],
        "step": line["step"],
        "valid": valid,
        "verdict": line["verdict"],
        "failed_gates": line["failed_gates"],
        "score": line["score"],
        "reward": line["reward"],
        "dropped": None if valid else f"drums_invalid:{line['verdict']}:{gates}",
        "audit_flags": line["audit_flags"],
        "trusted": line["trusted"],
        "turns": line["turns"],
        "actions": line["actions"],
        "timings": {"env_s": line["env_seconds"], "generation_s": line["generation_seconds"]},
    }


@dataclass
class Ledger:
    """Counters of one (arm, seed) run, and the two append-only record files."""

    trajectories_path: str
    checkpoints_path: str
    arm: str
    seed: int
    checkpoint_interval: int
    prices: Prices
    hosts: int = 1
    clock: callable = time.monotonic
    valid: int = 0
    invalid: int = 0
    env_busy_s: float = 0.0
    inference_s: float = 0.0
    checkpoints: int = 0
    # Valid attempts and their summed score since the last checkpoint: the training-task success
    # of the policy as it was sampled, the number GRPO itself is moving.
    window_valid: int = 0
    window_score: float = 0.0
    started: float | None = field(default=None, repr=False)
    started_utc: str | None = None
    # Wall-clock a restarted run carries over from the process before it (trainer/resume.py).
    carried_s: float = 0.0
    # Wall-clock with the clock paused (`paused`), not counted in wall_clock_s.
    paused_s: float = 0.0
    # Called with the wall-clock after every attempt: the run's heartbeat.
    on_record: Callable[[float], None] | None = field(default=None, repr=False)
    # DRUMS_RECORD=path.jsonl: one more line per scored trace, in drums-verifiers' format.
    drums_record: str | None = field(default_factory=lambda: os.environ.get("DRUMS_RECORD") or None)
    # A run on several processes (trainer/ranks.py): each process's attempts wait here until the
    # step's end, when rank 0 records every rank's, in rank order. None: each is recorded at once.
    pending: list | None = field(default=None, repr=False)

    def start(self) -> None:
        """Mark the first training step; wall-clock and host-hours count from here (a restarted
        run's, from where its last process left off)."""
        if self.started is None:
            self.started = self.clock() - self.carried_s
            self.started_utc = self.started_utc or utc_now()

    STATE = (
        "valid",
        "invalid",
        "env_busy_s",
        "inference_s",
        "checkpoints",
        "window_valid",
        "window_score",
        "started_utc",
        "paused_s",
    )

    def state(self) -> dict:
        """The counters a restart continues from, with the wall-clock now."""
        return {**{k: getattr(self, k) for k in self.STATE}, "wall_clock_s": self.wall_clock_s()}

    def restore(self, state: dict, wall_clock_s: float) -> None:
        """Continue from a resume point's counters; the clock restarts at the next step from
        `wall_clock_s`."""
        for k in self.STATE:
            setattr(self, k, state.get(k, 0.0) if k == "paused_s" else state[k])
        self.started, self.carried_s = None, wall_clock_s

    def wall_clock_s(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The clock stands still inside: the work done there (a stop-at-target judgment, an
        evaluation) is not training's, and is counted in `paused_s` instead."""
        began = self.clock()
        try:
            yield
        finally:
            spent = self.clock() - began
            self.paused_s += spent
            if self.started is not None:
                self.started += spent

    def record(self, attempt: Attempt, step: int, rank: int | None = None) -> dict | None:
        """Count the attempt and write its line (with the rank of the process that played it,
        on a run of several); on a process whose attempts rank 0 records, keep it for that."""
        if self.pending is not None and rank is None:
            self.pending.append((attempt, step))
            return None
        self.start()
        if attempt.valid:
            self.valid += 1
            self.window_valid += 1
            self.window_score += attempt.score
        else:
            self.invalid += 1
        self.env_busy_s += attempt.env_seconds
        self.inference_s += attempt.generation_seconds
        line = {
            "arm": self.arm,
            "seed": self.seed,
            "step": step,
            **asdict(attempt),
            "failed_gates": list(attempt.failed_gates),
            "audit_flags": list(attempt.audit_flags),
            "reward": attempt.reward,
            **({"rank": rank} if rank is not None else {}),
        }
        append_jsonl(self.trajectories_path, line)
        if self.drums_record:
            append_jsonl(self.drums_record, drums_record_line(line))
        if self.on_record:
            self.on_record(self.wall_clock_s())
        return line

    def take_pending(self) -> list:
        """The attempts kept since the last call, as (attempt, step) pairs."""
        taken, self.pending = self.pending or [], []
        return taken

    def checkpoint_due(self) -> bool:
        return self.valid >= (self.checkpoints + 1) * self.checkpoint_interval

    def counters(self) -> dict:
        wall = self.wall_clock_s()
        host_hours = self.hosts * wall / 3600
        return {
            "valid_trajectories": self.valid,
            "invalid_discarded": self.invalid,
            "wall_clock_s": wall,
            "env_host_hours": host_hours,
            "env_cost_usd": host_hours * self.prices.host_usd_per_hour,
            "env_busy_s": self.env_busy_s,
            "inference_s": self.inference_s,
            "inference_cost_usd": self.inference_s / 3600 * self.prices.inference_usd_per_hour,
        }

    def record_checkpoint(self, name: str, step: int, files: dict[str, str]) -> dict:
        """Append the checkpoint record; `files` maps relative path -> sha256. Step 0 records the
        model training starts from (before the clock starts: every counter is 0), so each learning
        curve begins at the warm start and "before" and "after" come from the same evaluation."""
        if step:
            self.checkpoints += 1
        elif self.started is not None or self.checkpoints:
            raise ValueError("the start checkpoint comes before the first step")
        line = {
            "checkpoint": name,
            "index": self.checkpoints,
            "due_at_valid": self.checkpoints * self.checkpoint_interval,
            "step": step,
            "arm": self.arm,
            "seed": self.seed,
            "utc": utc_now(),
            **self.counters(),
            "train_window_valid": self.window_valid,
            "train_success": self.window_score / self.window_valid if self.window_valid else None,
            "files": files,
        }
        self.window_valid, self.window_score = 0, 0.0
        append_jsonl(self.checkpoints_path, line)
        return line

    def stop_reason(self, max_wall_clock_s: float, max_valid_trajectories: int) -> str | None:
        """Why the budget says stop now, or None: whichever limit comes first."""
        if self.valid >= max_valid_trajectories:
            return "max_valid_trajectories"
        if self.wall_clock_s() >= max_wall_clock_s:
            return "max_wall_clock_s"
        return None
