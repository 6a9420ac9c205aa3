"""A training run that survives its process: the run's journal, its resume points, and what a
restart rolls back.

A run can die at any moment (out of memory, pre-emption, a reboot, kill -9). Snakemake deletes a
failed job's outputs, so the run keeps its records in a journal beside them, `<run>/journal/`,
and each output is a hard link to the journal's file (a checkpoint folder: links to its files).
Deleting the outputs leaves the journal whole:

    trajectories.jsonl, steps.jsonl, checkpoints.jsonl   the records, append-only
    checkpoints/<name>/                                   every saved model checkpoint
    trl/checkpoint-<step>/                                TRL's state of that step: optimizer,
                                                          scheduler, RNG, trainer state
    resume.json      the last complete resume point: written (atomically, as every file here
                     that is replaced) only once TRL's checkpoint of its step is whole
    heartbeat.json   the run's wall-clock after every attempt and step: how far lost work went
    lost.jsonl       attempts made after the resume point by a process that died
    resumes.jsonl    one line per restart

A restart cuts each record back to its length at the resume point (the attempts cut off go to
lost.jsonl: never used, never counted as valid), removes the checkpoints and TRL states past it,
and continues from it with model, optimizer, scheduler, RNG and sampler state (TRL's
`resume_from_checkpoint`), the ledger's counters, the attempt ordinal and the backend's draws.
The wall-clock continues from the last heartbeat, so the lost work counts; the time from the
last heartbeat to the first resumed step is downtime, on its own line and not counted (the first
start's set-up is not counted either). A run that ends removes its journal; its outputs keep
the data.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from trl.trainer.utils import RepeatSampler

from envab.errors import Refusal
from envab.io import append_jsonl, atomic_write_json, read_jsonl
from envab.receipts import utc_now
from envab.trainer.generation import GuardedGenerationMixin
from envab.trainer.step_digests import DigestingGRPOTrainer
from envab.trainer.step_times import StepTimes, TimedGRPOTrainer
from envab.trainer.toolcalls import ConcurrentToolsMixin, ToolCalls

RECORDS = ("trajectories", "steps", "checkpoints")  # journal file stems, in Outputs' terms

# Tests and bench/soak.py: "<moment>:<n>[,...]" makes the run die (SIGKILL, as an out-of-memory
# kill would) the n-th time this process reaches that moment.
KILL_ENV = "ENVAB_KILL_AT"
MOMENTS = ("generation", "env_reset", "env_step", "checkpoint_write", "resume_point", "step_end")
_reached: Counter = Counter()
_reaching = threading.Lock()  # a turn's environment steps reach "env_step" from several threads


def moment(name: str) -> None:
    """A named moment of a run, where ENVAB_KILL_AT may ask it to die."""
    plan = os.environ.get(KILL_ENV)
    if not plan:
        return
    with _reaching:
        _reached[name] += 1
        reached = _reached[name]
    for item in plan.split(","):
        at, _, n = item.partition(":")
        if at not in MOMENTS:
            raise ValueError(f"{KILL_ENV}: {at!r} is not one of {MOMENTS}")
        if at == name and reached == int(n or 1):
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class ResumePoint:
    """Where a restart continues from (resume.json)."""

    checkpoint: str  # the last checkpoint saved before it
    global_step: int
    trl_checkpoint: str | None  # folder under trl/; None: the start, before the first update
    offsets: dict[str, int]  # record stem -> its length in bytes at this point
    ledger: dict  # the ledger's counters (Ledger.state)
    # Each training process's own draws, in rank order: {"resets": attempts started (ForkGroups'
    # ordinal), "backend": a control backend's state when the arm has one, else None}
    draws: list[dict]
    utc: str

    @classmethod
    def read(cls, path: Path) -> ResumePoint:
        return cls(**json.loads(path.read_text()))


@dataclass(frozen=True)
class Restart:
    """What one restart rolled back."""

    point: ResumePoint
    lost: int  # attempts cut off
    lost_s: float  # wall-clock of the work after the point (counted in the run's wall-clock)
    wall_clock_s: float  # where the run's wall-clock continues from
    heartbeat_utc: str  # the last sign of life of the process that died


class RunHeld(Refusal):
    """Another trainer holds this run's journal."""


LOCK = "journal.lock"  # beside the journal, which a fresh start removes


@contextlib.contextmanager
def held(run_dir: Path) -> Iterator[dict]:
    """This process's exclusive hold on a run for the block's length: an advisory lock (flock)
    on `<run>/journal.lock`, whose content names the holder (host, pid, since). A second trainer
    on the same run (a rerun started beside a live job, `--rerun-incomplete` on a cluster) is
    refused in one line naming the holder, before it reads or writes anything of the run. The
    kernel releases the lock when the holder dies, however it dies; the file stays (removing it
    would let two processes lock two different files of the same name)."""
    path = Path(run_dir) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process"
        os.close(fd)
        raise RunHeld(
            f"{run_dir}: another trainer holds this run ({holder}); one trainer per run"
        ) from None
    lease = {"host": socket.gethostname(), "pid": os.getpid(), "since": utc_now()}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(lease).encode() + b"\n", 0)
        yield lease
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class Journal:
    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / "journal"
        self.records = {stem: self.dir / f"{stem}.jsonl" for stem in RECORDS}
        self.checkpoints = self.dir / "checkpoints"
        self.trl = self.dir / "trl"
        self.point_path = self.dir / "resume.json"
        self.heartbeat_path = self.dir / "heartbeat.json"
        self.lost_path = self.dir / "lost.jsonl"
        self.resumes_path = self.dir / "resumes.jsonl"

    # --- opening -----------------------------------------------------------------------------

    def open(self) -> Restart | None:
        """Roll back to the last resume point and say what was lost; or, with none, start an
        empty journal (whatever a run that died before its first point left is discarded)."""
        if not self.point_path.is_file():
            shutil.rmtree(self.dir, ignore_errors=True)
            self.checkpoints.mkdir(parents=True)
            self.trl.mkdir()
            for path in self.records.values():
                path.touch()
            return None
        return self._roll_back(ResumePoint.read(self.point_path))

    def _roll_back(self, point: ResumePoint) -> Restart:
        lost = 0
        for stem, path in self.records.items():
            offset = point.offsets[stem]
            with path.open("rb+") as f:
                f.seek(offset)
                tail = f.read()
                f.truncate(offset)
            if stem == "trajectories":
                for line in tail.decode(errors="replace").splitlines():
                    try:
                        attempt = json.loads(line)
                    except ValueError:  # a line the kill cut short is no attempt
                        continue
                    append_jsonl(self.lost_path, {**attempt, "lost": True})
                    lost += 1
        kept = {c["checkpoint"] for c in read_jsonl(self.records["checkpoints"])}
        for folder in self.checkpoints.iterdir():
            if folder.name not in kept:  # saved after the point, or half-written
                shutil.rmtree(folder)
        for folder in self.trl.glob("checkpoint-*"):  # TRL also leaves a model card there
            if folder.name != point.trl_checkpoint:
                shutil.rmtree(folder)
        wall = point.ledger["wall_clock_s"]
        beat = self._heartbeat() or {"wall_clock_s": wall, "utc": point.utc}
        resumed_from = max(wall, beat["wall_clock_s"])
        return Restart(point, lost, resumed_from - wall, resumed_from, beat["utc"])

    def _heartbeat(self) -> dict | None:
        try:
            return json.loads(self.heartbeat_path.read_text())
        except (OSError, ValueError):
            return None

    def link_outputs(self, outputs: dict[str, Path], checkpoints: Path) -> None:
        """Make each output a hard link to its journal file (a file there already is replaced:
        Snakemake deleted it, or it is a link to the same data)."""
        for stem, path in outputs.items():
            path.unlink(missing_ok=True)
            os.link(self.records[stem], path)
        shutil.rmtree(checkpoints, ignore_errors=True)
        checkpoints.mkdir(parents=True)
        for folder in sorted(self.checkpoints.iterdir()):
            self.link_checkpoint(folder.name, checkpoints)

    def link_checkpoint(self, name: str, checkpoints: Path) -> None:
        source = self.checkpoints / name
        for file in sorted(source.rglob("*")):
            target = checkpoints / name / file.relative_to(source)
            if file.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(file, target)

    # --- while running -----------------------------------------------------------------------

    def beat(self, wall_clock_s: float) -> None:
        atomic_write_json(self.heartbeat_path, {"wall_clock_s": wall_clock_s, "utc": utc_now()})

    def save_point(self, point: ResumePoint) -> None:
        atomic_write_json(self.point_path, point.__dict__)

    def offsets(self) -> dict[str, int]:
        return {stem: path.stat().st_size for stem, path in self.records.items()}

    def record_restart(self, restart: Restart, resumed_utc: str, downtime_s: float) -> None:
        append_jsonl(
            self.resumes_path,
            {
                "resumed_utc": resumed_utc,
                "from_checkpoint": restart.point.checkpoint,
                "from_step": restart.point.global_step,
                "lost_trajectories": restart.lost,
                "lost_s": restart.lost_s,
                "last_heartbeat_utc": restart.heartbeat_utc,
                "downtime_s": downtime_s,
            },
        )

    def restarts(self) -> list[dict]:
        """One line per restart of this run, for run.json."""
        return list(read_jsonl(self.resumes_path)) if self.resumes_path.is_file() else []

    # --- the end -----------------------------------------------------------------------------

    def close(self, run_dir: Path) -> None:
        """The lost attempts move beside the outputs (lost.jsonl); the journal goes (the outputs
        are links to its data)."""
        lost = Path(run_dir) / "lost.jsonl"
        if self.lost_path.is_file():
            os.replace(self.lost_path, lost)
        else:
            lost.unlink(missing_ok=True)
        shutil.rmtree(self.dir)


class EpochSeededSampler(RepeatSampler):
    """TRL's RepeatSampler, whose order for epoch e is the one TRL draws, whatever ran before.

    TRL draws every epoch's order from one generator that runs on from epoch to epoch, so the
    order of epoch e is the e-th draw after seeding, made only if the epochs before it were
    iterated in the same process: a run resumed in epoch e would draw epoch 0's order instead.
    Transformers' Trainer calls `set_epoch` before each epoch, a resumed one included; the
    generator is seeded again and the draws of the epochs before are made and dropped."""

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)


class ResumableGRPOTrainer(
    GuardedGenerationMixin, ConcurrentToolsMixin, TimedGRPOTrainer, DigestingGRPOTrainer
):
    """The run's GRPOTrainer: no unsampleable token reaches a forward pass, a turn's tool calls
    run at once, step digests, each step's times, and a sampler whose order a resumed run
    repeats."""

    def __init__(self, *args, step_times: StepTimes, tool_calls: ToolCalls | None = None, **kwargs):
        self.step_times = step_times
        self.tool_calls = tool_calls
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        moment("generation")
        return super()._generate_and_score_completions(inputs)

    def _get_train_sampler(self, dataset=None) -> EpochSeededSampler:
        return EpochSeededSampler(  # TRL's arguments (GRPOTrainer._get_train_sampler)
            data_source=self.train_dataset if dataset is None else dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )
