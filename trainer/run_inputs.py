"""What one GRPO run is made of (trainer/grpo.py): its settings from the pins (`GrpoSettings`),
the files the rule names for it (`Outputs`), everything checked before anything is loaded or
started (`RunInputs`), and the host faults a test or a reliability run hands it (`FaultPlan`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from envab.hashing import sha256_file
from envab.preregistration import Preregistration
from envab.receipts import Receipts
from envab.run_pins import RunPins
from envab.trainer import agent
from envab.trainer.compute import Compute
from envab.trainer.guards import GuardError, HeldoutGuard

FAULT_PLAN_ENV = "ENVAB_FAULT_PLAN"  # tests and reliability runs: a JSON file of host faults
START_CHECKPOINT = "valid-000000"  # the model before the first update


@dataclass(frozen=True)
class GrpoSettings:
    """training.grpo from the run's pins (defaults filled by the config schema)."""

    learning_rate: float
    num_generations: int
    prompts_per_step: int
    max_turns: int
    max_completion_length: int
    temperature: float
    beta: float
    prefix: tuple = ()  # computer_13 actions played before each group (trainer/forkgroups.py)
    settle_s: float = 0.0
    parallel_creates: int = 1  # a group's sessions created at once where the arm cannot fork
    # A turn's tool calls run at once across the batch, at most this many (None: all of them;
    # trainer/toolcalls.py). Pins frozen before the setting existed ran TRL's loop: one at a time.
    parallel_steps: int | None = 1
    turn_end: str = "bias"  # how a turn ends (trainer/generation.py)

    @property
    def batch_size(self) -> int:  # completions per GRPO step
        return self.num_generations * self.prompts_per_step


@dataclass(frozen=True)
class Outputs:
    """What the run writes; each path is given by the rule."""

    trajectories: Path
    checkpoint_records: Path
    checkpoints: Path  # one folder per saved checkpoint
    run: Path
    steps: Path  # a digest per generation batch (trainer/step_digests.py)


@dataclass(frozen=True)
class RunInputs:
    """Everything a run is made of, checked before anything is loaded or started."""

    prereg: Preregistration
    receipts: Receipts
    pins: RunPins
    arm: str
    seed: int
    settings: GrpoSettings
    tools: agent.ToolSet
    tasks: dict[str, dict]  # training tasks by id
    guard: HeldoutGuard
    faults: FaultPlan
    compute: Compute  # where and how the model runs (training.compute, training.vision)


@dataclass(frozen=True)
class FaultPlan:
    """Fault switches by attempt ordinal and by group ordinal (trainer/forkgroups.py)."""

    attempts: dict[int, dict]
    groups: dict[int, dict]
    sha256: str | None

    def __bool__(self) -> bool:
        return bool(self.attempts or self.groups)


def read_fault_plan() -> FaultPlan:
    """The plan in the file named by ENVAB_FAULT_PLAN: {"attempts": {ordinal: faults},
    "groups": {ordinal: faults}} (either may be left out), and the file's digest."""
    path = os.environ.get(FAULT_PLAN_ENV)
    if not path:
        return FaultPlan({}, {}, None)
    try:
        plan = json.loads(Path(path).read_text())
        attempts = {int(k): dict(v) for k, v in plan.get("attempts", {}).items()}
        groups = {int(k): dict(v) for k, v in plan.get("groups", {}).items()}
        if set(plan) - {"attempts", "groups"}:
            raise ValueError(f"unknown keys {sorted(set(plan) - {'attempts', 'groups'})}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise GuardError(
            f'{FAULT_PLAN_ENV}={path}: expected {{"attempts": {{ordinal: faults}}, '
            f'"groups": {{ordinal: faults}}}} ({e})'
        ) from None
    return FaultPlan(attempts, groups, sha256_file(path))
