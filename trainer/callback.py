"""The Accounting callback: TRL's training loop (trainer/resume.py's GRPOTrainer) told by the
run's ledger (trainer/accounting.py) when to checkpoint, when to judge and when to stop.

It starts the clock at the first step, saves the starting model as checkpoint valid-000000,
saves a checkpoint every N valid trajectories (after the update that consumed them, with TRL's
state of that step and a resume point once both are whole), has the stop-at-target judge
(trainer/stop_judge.py) decide with the clock paused, stops at whichever budget limit comes
first, and reports: a line per checkpoint on the console, every step's numbers on the run's
wandb run. On several training processes rank 0 decides for all (trainer/ranks.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from safetensors import SafetensorError
from tqdm import tqdm
from transformers import TrainerCallback

from envab.hashing import file_manifest
from envab.preregistration import Budget
from envab.progress import Console, duration
from envab.receipts import utc_now
from envab.trainer.accounting import Ledger
from envab.trainer.environment import Run
from envab.trainer.guards import GuardError
from envab.trainer.ranks import Ranks
from envab.trainer.resume import Journal, Restart, ResumePoint, moment
from envab.trainer.run_inputs import START_CHECKPOINT, Outputs
from envab.trainer.stop_judge import StopJudge

log = logging.getLogger(__name__)


class Accounting(TrainerCallback):
    """Starts the clock at the first step, checkpoints every N valid trajectories (after the
    update that consumed them), stops at whichever budget limit comes first, and reports: a line
    per checkpoint on the console, every step's numbers to the run's wandb run."""

    def __init__(
        self,
        run: Run,
        budget: Budget,
        outputs: Outputs,
        journal: Journal,
        restart: Restart | None,
        frozen_utc: str,
        processor,
        console: Console,
        tracker,
        ranks: Ranks,
        judge: StopJudge | None = None,
    ):
        self.run, self.budget, self.outputs = run, budget, outputs
        self.judge = judge  # stop at target (budget.stop_at_target): None trains to the budget
        self.ranks = ranks
        self.journal, self.restart = journal, restart
        self.frozen_utc, self.processor = frozen_utc, processor
        self.console, self.tracker = console, tracker
        self.stop_reason: str | None = None
        self.last_saved = restart.point.checkpoint if restart else START_CHECKPOINT
        self.begun = False  # this process has begun a step
        self.step_started = 0.0
        self.step_s = 0.0
        self.progress = tqdm(
            total=budget.max_valid_trajectories,
            desc=f"{run.ledger.arm} seed{run.ledger.seed} valid",
            file=sys.stderr,
            mininterval=0,
            dynamic_ncols=False,
            ascii=True,
            disable=not ranks.main,
        )

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        ledger = self.run.ledger
        first, self.begun = not self.begun, True
        if first and self.restart is None:  # rank 0 saves the model and starts the clock
            if self.ranks.main:
                self._save(model, START_CHECKPOINT, 0)
                ledger.start()
                first_step_after_freeze(ledger.started_utc, self.frozen_utc)
            self._save_point(START_CHECKPOINT, 0, None)
        elif first and self.ranks.main:  # the first step after a restart: the downtime ends here
            ledger.start()
            now = utc_now()
            downtime = seconds_between(self.restart.heartbeat_utc, now)
            self.journal.record_restart(self.restart, now, downtime)
            self.console.say(
                f"resumed at step {state.global_step + 1} after {duration(downtime)} down "
                "(not counted)"
            )
        self.run.step = state.global_step + 1
        self.step_started = time.monotonic()
        self.run.times.begin_step()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.run.times.enter("learning")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.run.times.leave()

    def on_train_end(self, args, state, control, **kwargs):
        self.run.times.end()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        moment("step_end")
        ledger = self.run.ledger
        self.step_s = time.monotonic() - self.step_started
        if self.ranks.several:  # every rank's attempts to rank 0, which decides for all
            gathered = self.ranks.gather(ledger.take_pending())
            decision = (False, None)
            if self.ranks.main:
                for rank, attempts in enumerate(gathered):
                    for attempt, step in attempts:
                        ledger.record(attempt, step, rank=rank)
                decision = self._account(ledger, state, model)
            saved, self.stop_reason = self.ranks.broadcast(decision)
        else:
            saved, self.stop_reason = self._account(ledger, state, model)
        if saved:
            control.should_save = True  # TRL's state of this step too, then a resume point
        if self.stop_reason:
            control.should_training_stop = True

    def _account(self, ledger: Ledger, state, model) -> tuple[bool, str | None]:
        """Rank 0's part of a step's end: the progress bar, the checkpoints that came due, the
        heartbeat, and the budget's verdict; (whether a checkpoint was saved, why to stop)."""
        self.progress.update(ledger.valid - self.progress.n)
        self.progress.set_postfix(invalid=ledger.invalid, step=state.global_step)
        saved = False
        while ledger.checkpoint_due():
            name = f"valid-{(ledger.checkpoints + 1) * ledger.checkpoint_interval:06d}"
            record = self._save(model, name, state.global_step)
            log.info("checkpoint %s at %d valid trajectories", name, record["valid_trajectories"])
            self.console.say(self._checkpoint_line(record))
            self.last_saved = name
            saved = True
        decided = self._judge() if saved and self.judge else None
        self.journal.beat(ledger.wall_clock_s())
        return saved, decided or ledger.stop_reason(
            self.budget.max_wall_clock_s, self.budget.max_valid_trajectories
        )

    def _judge(self) -> str | None:
        """Stop at target: the checkpoints so far judged with the clock paused; why to stop, or
        None to go on."""
        with self.run.ledger.paused(), self.run.times.span("judging"):
            reason = self.judge(self.last_saved)
        verdict = self.judge.verdicts[-1]
        if verdict["decision"] in ("failed", "timeout"):
            self.console.say(
                f"stop at target: the judge {verdict['decision']} at {self.last_saved} (exit "
                f"{verdict['exit']}; its log: {self.judge.settings['log']}): going on to the budget"
            )
        else:
            self.console.say(
                f"stop at target, {self.last_saved}: "
                + (f"stop ({reason})" if reason else "go on")
                + f", judged in {verdict.get('judged_s', 0):.1f} s (clock paused)"
            )
        return reason

    def on_save(self, args, state, control, **kwargs):
        """TRL's checkpoint of this step is whole: the run can resume from here."""
        if self.ranks.main:
            moment("resume_point")
        self._save_point(self.last_saved, state.global_step, f"checkpoint-{state.global_step}")

    def _save_point(self, checkpoint: str, step: int, trl_checkpoint: str | None) -> None:
        """Every rank's draws to rank 0, which writes the point."""
        backend = self.run.groups.backend
        draws = self.ranks.gather(
            {
                "resets": self.run.groups.resets,
                "backend": backend.resume_state() if hasattr(backend, "resume_state") else None,
            }
        )
        if not self.ranks.main:
            return
        self.journal.save_point(
            ResumePoint(
                checkpoint=checkpoint,
                global_step=step,
                trl_checkpoint=trl_checkpoint,
                offsets=self.journal.offsets(),
                ledger=self.run.ledger.state(),
                draws=draws,
                utc=utc_now(),
            )
        )

    def on_log(self, args, state, control, logs=None, **kwargs):
        """TRL's numbers of the step (reward, loss, KL) with our counters, against valid
        trajectories (tracking.py defines the axes)."""
        counters = self.run.ledger.counters()
        trl = {f"train/{k}": v for k, v in (logs or {}).items() if isinstance(v, int | float)}
        self.tracker.log(
            {
                **trl,
                "valid_trajectories": counters["valid_trajectories"],
                "wall_clock_s": counters["wall_clock_s"],
                "train/invalid_discarded": counters["invalid_discarded"],
                "train/step_s": self.step_s,
                "train/env_busy_s": counters["env_busy_s"],
                "train/inference_s": counters["inference_s"],
                "train/env_cost_usd": counters["env_cost_usd"],
                "train/global_step": state.global_step,
                # the previous step's parts (this one's period ends when the next one begins)
                **{f"time/{k}": v for k, v in (self.run.times.last() or {}).items()},
            }
        )

    def _checkpoint_line(self, record: dict) -> str:
        valid, budget = record["valid_trajectories"], self.budget
        wall = record["wall_clock_s"]
        left = min(
            (budget.max_valid_trajectories - valid) * wall / valid if valid else float("inf"),
            budget.max_wall_clock_s - wall,
        )
        reward = record["train_success"]
        reward = f"{reward:.2f}" if reward is not None else "-"
        return (
            f"checkpoint {record['checkpoint']}: {valid}/{budget.max_valid_trajectories} valid "
            f"({100 * valid / budget.max_valid_trajectories:.0f}%), "
            f"{record['invalid_discarded']} invalid, train reward {reward}, {duration(wall)}, "
            f"ETA {duration(left) if left != float('inf') else '?'} "
            + ("(held-out: judged now, clock paused)" if self.judge else "(held-out: its eval job)")
        )

    def _save(self, model, name: str, step: int) -> dict:
        files = save_checkpoint(model, self.processor, self.journal.checkpoints / name)
        self.journal.link_checkpoint(name, self.outputs.checkpoints)
        return self.run.ledger.record_checkpoint(name, step, files)


def seconds_between(earlier_utc: str, later_utc: str) -> float:
    parse = datetime.fromisoformat
    return max(0.0, (parse(later_utc) - parse(earlier_utc)).total_seconds())


def first_step_after_freeze(started_utc: str, frozen_utc: str) -> None:
    if started_utc <= frozen_utc:  # both ISO 8601 UTC with a Z: string order is time order
        raise GuardError(
            f"first training step at {started_utc} is not after the freeze at {frozen_utc}"
        )


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a file too large); nothing of it is left."""


def save_checkpoint(model, processor, path: Path) -> dict[str, str]:
    """Save into a temporary sibling, then rename: a checkpoint folder is whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        moment("checkpoint_write")
        os.replace(tmp, path)
    except (OSError, SafetensorError) as e:  # safetensors reports a failed write as its own error
        raise CheckpointWriteError(f"checkpoint {path.name} not written: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return file_manifest(path)
