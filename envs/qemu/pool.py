"""QemuPool: the session protocol over N QEMU VMs restored from the warm snapshot.

create(task) takes a free VM and resets it: QMP `loadvm warm`, the agent's hello (alive, and
its state hash must be the blank desktop's), the task's set-up through the agent channel (the
state hash must equal the task's `initial_state_sha256` where it names one), then a screendump
that must show the frame the agent drew and must not be blank. step(action) types the action into
the virtual tablet and keyboard, waits for the agent, and screendumps. verify() reads the state
back and runs the task's checker here, on the host.

Gates, as for every arm (envs.protocol): state hash, set-up, generation, VM/agent alive, step
timeout, screen not blank, verifier available. The first failure makes the episode invalid with
that gate; the VM goes back to the pool and is restored again by the next create, or replaced
(a fresh QEMU from a fresh copy of the snapshot) when it died or stopped answering. This arm
cannot fork: a GRPO group is G restores.

Fault switches (envs/faults.py; a pool made with allow_faults=True) act on the VM where they can:
a killed or stopped (SIGSTOP) QEMU process, a restored desktop dirtied before its hello; the
display's faults (a blank screen, a frame that never updates) replace what the screendump read,
and the verifier's and the unknown gate are answered by the pool. No host restart: the pool runs
inside the trainer, so its restart is a kill of the trainer (trainer/resume.py).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from envab.envs import scratch
from envab.envs.arm_schema import QEMU_DEFAULTS, ArmError, arm_settings
from envab.envs.desktop import screen_of
from envab.envs.desktop.actions import parse_action
from envab.envs.faults import UNKNOWN_GATE, Faults
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
from envab.envs.qemu.image import GuestRecord, ImageConfig, ensure_guest
from envab.envs.qemu.inputs import frame
from envab.envs.qemu.vm import VM, AgentError, AgentTimeout, VMDied
from envab.envs.tasks.checkers import check
from envab.hashing import sha256_bytes

log = logging.getLogger(__name__)

SCREEN_POLL_S = 0.005
LAUNCH_SYNC_S = 60.0


@dataclass(frozen=True)
class QemuConfig:
    """A qemu arm's settings; the defaults are the config schema's (`envab.envs.arm_schema`)."""

    vms: int = QEMU_DEFAULTS["vms"]  # started with the pool
    max_vms: int | None = QEMU_DEFAULTS["max_vms"]  # more start while sessions need them; None: vms
    memory_mib: int = QEMU_DEFAULTS["memory_mib"]
    accel: str = QEMU_DEFAULTS["accel"]  # auto | kvm | tcg
    cache: Path = Path(QEMU_DEFAULTS["cache"])
    build: bool = True  # build the guest when it is not cached (minutes), else refuse
    step_timeout_s: float = QEMU_DEFAULTS["step_timeout_s"]
    create_timeout_s: float = QEMU_DEFAULTS["create_timeout_s"]
    screen_wait_s: float = QEMU_DEFAULTS["screen_wait_s"]  # the display's lag behind the agent
    vm_wait_s: float = QEMU_DEFAULTS["vm_wait_s"]  # create's wait for a VM while max_vms are held
    run_dir: Path | None = None  # where VM sockets and logs go; a temporary folder by default

    @classmethod
    def from_arm(cls, arm: Mapping) -> QemuConfig:
        """From an arm of config.yaml, {backend: qemu, vms, memory_mib, ...}, checked against the
        schema and its defaults filled; ArmError names a setting the schema does not allow."""
        settings = arm_settings(arm)
        if settings.pop("backend") != "qemu":
            raise ArmError(f"arm.backend: {arm['backend']!r} is not a qemu arm")
        settings.pop("deterministic_screens", None)  # the trainer's check, not the pool's
        return cls(**{**settings, "cache": Path(settings["cache"])})

    @property
    def ceiling(self) -> int:
        return self.vms if self.max_vms is None else self.max_vms

    def __post_init__(self):
        if not 1 <= self.vms <= 64:
            raise ValueError(f"vms must be 1..64, got {self.vms}")
        if not self.vms <= self.ceiling <= 64:
            raise ValueError(f"max_vms must be vms..64, got {self.max_vms}")
        if min(self.step_timeout_s, self.create_timeout_s, self.screen_wait_s, self.vm_wait_s) <= 0:
            raise ValueError("timeouts must be positive")


class GateFailed(Exception):
    """Internal: a gate failed during reset or step."""

    def __init__(self, gate: Gate, reason: str):
        super().__init__(reason)
        self.gate = gate


class PooledVM:
    """A VM slot of the pool: replaced (relaunched from a fresh snapshot copy) when broken."""

    def __init__(self, index: int, guest: GuestRecord, cache: Path, run_root: Path):
        self.name = f"vm{index}"
        self.guest, self.cache = guest, cache
        self.run_dir = run_root / self.name
        self.vm: VM | None = None
        self.broken = True  # not launched yet
        self.launches = 0

    def ensure_running(self) -> None:
        if not self.broken and self.vm is not None and self.vm.alive():
            return
        if self.vm is not None:
            self.vm.stop()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        warm = self.run_dir / "warm.qcow2"
        # Each VM owns a copy: QEMU opens the snapshot image read-write and locks it.
        shutil.copyfile(self.guest.path("warm", self.cache), warm)
        self.vm = VM(self.guest.spec(self.cache), warm, self.run_dir)
        self.vm.launch(loadvm="warm")
        self.vm.guest_sync(timeout=LAUNCH_SYNC_S)  # the restored guest's OS answers
        self.launches += 1
        self.broken = False

    def stop(self) -> None:
        if self.vm is not None:
            self.vm.stop()
            self.vm = None


class QemuSession(Session):
    def __init__(
        self,
        pool: QemuPool,
        slot: PooledVM,
        task: Mapping,
        env_id: str,
        faults: Faults | None = None,
    ):
        self.pool, self.slot, self.task, self.env_id = pool, slot, task, env_id
        self.faults = faults or Faults()
        self.vm_name = slot.name
        self.failed_gates: list[str] = []
        self.failure: str | None = None  # why the first gate failed, for the audit
        self.status = "running"
        self.steps = 0
        self.timings: dict[str, float | list[float]] = {"step_s": []}
        self.screen = tuple(screen_of(task["config"]))
        self.fb = (0, 0)
        self._shown: Image.Image | None = None  # the last whole screendump that was current
        self._drawn: Mapping = {}  # the agent's last frame: its digest and number
        self.state_sha256: str | None = None
        self.observation = Observation(0, None)
        try:
            shot = self._reset()
        except GateFailed as e:
            self._fail(e.gate, 0, str(e))
            return
        self.observation = Observation(0, shot, state_sha256=self.state_sha256)

    # --- reset --------------------------------------------------------------------------------

    def _reset(self) -> Image.Image:
        cfg = self.pool.config
        with self._gated(Gate.WORKER_ALIVE):
            self.slot.ensure_running()  # a replaced VM starts here, restored from `warm`
            vm = self.slot.vm
        deadline = time.monotonic() + cfg.create_timeout_s
        t0 = time.perf_counter()
        with self._gated(Gate.WORKER_ALIVE):
            vm.loadvm("warm", timeout=_left(deadline))
            t1 = time.perf_counter()
            if self.faults.corrupt_restore:  # the restored desktop used before it is handed out
                vm.call("setup", timeout=_left(deadline), config=self.task["config"])
            hello = vm.call("hello", timeout=_left(deadline))
        if hello["state_sha256"] != self.pool.guest.blank_state_sha256:
            raise GateFailed(Gate.STATE_HASH, "the restored desktop is not the blank one")
        if tuple(hello["screen"]) != self.screen:
            raise GateFailed(Gate.SETUP, f"task screen {self.screen} != guest {hello['screen']}")
        self.fb = tuple(hello["fb"])
        with self._gated(Gate.SETUP):
            reply = vm.call("setup", timeout=_left(deadline), config=self.task["config"])
        t2 = time.perf_counter()
        self.state_sha256 = reply["state_sha256"]
        expected = self.task["evaluator"].get("initial_state_sha256")
        if expected is not None and self.state_sha256 != expected:
            raise GateFailed(Gate.STATE_HASH, "state after restore and set-up is not the task's")
        shot = self._screen(reply, deadline)
        self._drawn = reply
        self.timings.update(loadvm_s=t1 - t0, setup_s=t2 - t1, create_s=time.perf_counter() - t0)
        return shot

    # --- the protocol -------------------------------------------------------------------------

    def step(self, action: Mapping, *, generation: int | None = None) -> Observation:
        """Apply one action; a refused action raises ValueError and changes nothing."""
        if self.failed_gates:
            return self.observation
        self._open()
        if generation is not None and generation != self.generation:
            return self._fail(Gate.GENERATION, self.generation, "action from an old screenshot")
        parsed = parse_action(check_action(action), *self.screen)
        if self.status != "running":
            raise ValueError(f"the episode already ended with {self.status.upper()}")
        framed = frame(parsed, self.fb)
        vm = self.slot.vm
        deadline = time.monotonic() + self.pool.config.step_timeout_s
        t0 = time.perf_counter()
        n = self.steps + 1  # this step's number, as the fault switches count
        if self.faults.at("kill", n):
            vm.proc.kill()
            vm.proc.wait()
        if self.faults.at("stall", n):
            os.kill(vm.proc.pid, signal.SIGSTOP)  # QEMU stops answering anything
        try:
            with self._gated(Gate.WORKER_ALIVE):
                for batch in framed.batches:
                    vm.send_input(batch, timeout=_left(deadline))
                reply = vm.call("act", timeout=_left(deadline), **framed.frame)
            if "rejected" in reply:  # the agent's desktop refused it: nothing changed
                raise ValueError(reply["rejected"])
            read = parse_action(reply["action"], *self.screen)
            if read != parsed:  # the virtual devices delivered something else
                raise GateFailed(Gate.WORKER_ALIVE, f"the guest read {read} for {parsed}")
            display = "blank" if self.faults.at("blank", n) else None
            display = "stale" if self.faults.at("stale", n) else display
            shot = self._screen(reply, deadline, display)
            self._drawn = reply
        except GateFailed as e:
            return self._fail(e.gate, self.generation, str(e))
        if self.faults.at("unknown_gate", n):
            self.steps += 1
            return self._fail(UNKNOWN_GATE, self.generation + 1, "the pool reports a new gate")
        self.timings["step_s"].append(time.perf_counter() - t0)
        self.steps += 1
        self.status = reply["status"]
        self.state_sha256 = reply["state_sha256"]
        done = parsed.kind in TERMINAL_ACTIONS
        self.observation = Observation(
            self.generation + 1, shot, done=done, state_sha256=self.state_sha256
        )
        return self.observation

    def observe(self) -> Observation:
        """The screen now (a screendump), without acting; it must show the agent's last frame."""
        if self.failed_gates:
            return self.observation
        self._open()
        deadline = time.monotonic() + self.pool.config.step_timeout_s
        try:
            shot = self._screen(self._drawn, deadline)
        except GateFailed as e:
            return self._fail(e.gate, self.generation, str(e))
        self.observation = Observation(
            self.generation, shot, done=self.observation.done, state_sha256=self.state_sha256
        )
        return self.observation

    def verify(self) -> Verification:
        audit = {
            "env_id": self.env_id,
            "task": self.task["id"],
            "backend": "qemu",
            "vm": self.vm_name,
            "accel": self.pool.guest.accel,
            "guest_image": self.pool.guest.image_digest,
            "warm_snapshot": self.pool.guest.warm_digest,
            "generation": self.generation,
            "steps": self.steps,
        }
        if self.failed_gates:
            return Verification.invalid(self.failed_gates, failure=self.failure, **audit)
        self._open()
        if self.faults.verifier_unavailable:
            return Verification.invalid(
                [Gate.VERIFIER_AVAILABLE], failure="the verifier is unreachable", **audit
            )
        try:
            with self._gated(Gate.WORKER_ALIVE):
                reply = self.slot.vm.call("state", timeout=self.pool.config.step_timeout_s)
        except GateFailed as e:
            self._fail(e.gate, self.generation, str(e))
            return Verification.invalid(self.failed_gates, failure=self.failure, **audit)
        audit["state_sha256"] = reply["state_sha256"]
        return checked(check, self.task["evaluator"], reply["state"], audit)

    def close(self) -> None:
        if self.slot is not None:
            self.pool._release(self.slot)
            self.slot = None

    # --- helpers ------------------------------------------------------------------------------

    def _screen(self, drawn: Mapping, deadline: float, fault: str | None = None) -> Image.Image:
        """Screendump until the display shows the frame the agent drew: its picture and its frame
        number (it may lag a little); a display that never does is stale. `fault` (blank, stale)
        replaces what the screendump read, as a dead or frozen display would."""
        w, h = self.screen
        # Patience for the display is not the monitor's deadline: the last screendump of a wait
        # that ran out still gets the step's time, so a wrong screen is never read as a timeout.
        patience = min(deadline, time.monotonic() + self.pool.config.screen_wait_s)
        with self._gated(Gate.WORKER_ALIVE):
            while True:
                dump = self.slot.vm.screendump(_left(deadline))
                dump = dump if dump.mode == "RGB" else dump.convert("RGB")
                if fault == "blank":
                    dump = Image.new("RGB", dump.size)
                elif fault == "stale" and self._shown is not None:
                    dump = self._shown
                shot = dump.crop((0, 0, w, h))
                if (
                    sha256_bytes(shot.tobytes()) == drawn["frame_sha256"]
                    and frame_number(dump, h) == drawn["frame"]
                ):
                    break
                if time.monotonic() > patience:
                    if is_blank(shot):
                        raise GateFailed(Gate.SCREEN_NOT_BLANK, "the screen is one colour")
                    raise GateFailed(Gate.SCREEN_CURRENT, "the screen never showed the frame")
                time.sleep(SCREEN_POLL_S)
        if is_blank(shot):
            raise GateFailed(Gate.SCREEN_NOT_BLANK, "the screen is one colour")
        self._shown = dump
        return shot

    def _gated(self, gate: Gate):
        return _Gated(self, gate)

    def _fail(self, gate: str, generation: int, reason: str) -> Observation:
        self.failed_gates.append(str(gate))
        self.failure = reason
        log.warning("%s (%s): gate %s failed: %s", self.env_id, self.vm_name, gate, reason)
        if gate in (Gate.WORKER_ALIVE, Gate.STEP_TIMEOUT):
            self.slot.broken = True  # wedged or dead: replace it rather than trust a restore
        self.observation = Observation(
            generation,
            None,
            False,
            verdict_for(self.failed_gates),
            tuple(self.failed_gates),
            done=True,
        )
        return self.observation

    def _open(self) -> None:
        if self.slot is None:
            raise RuntimeError(f"session {self.env_id} is closed")


class _Gated:
    """Turn the VM's failures into gates: timeouts -> step_timeout, the rest -> `gate`."""

    def __init__(self, session: QemuSession, gate: Gate):
        self.session, self.gate = session, gate

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None or issubclass(kind, GateFailed):
            return False
        if issubclass(kind, AgentTimeout):
            raise GateFailed(Gate.STEP_TIMEOUT, str(exc)) from None
        if issubclass(kind, AgentError | VMDied | OSError | EOFError):
            raise GateFailed(self.gate, f"{kind.__name__}: {exc}") from None
        return False


def frame_number(dump: Image.Image, row: int) -> int:
    """The frame counter the guest agent draws under the desktop: 32 pixels, white for a 1."""
    pixels = dump.crop((0, row, 32, row + 1)).tobytes()[::3]
    return sum(1 << i for i, value in enumerate(pixels) if value > 127)


def _left(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


class QemuPool(Backend):
    """VMs restored from one warm snapshot, one per open session.

    `vms` start with the pool; while every VM is held, `create` starts another, up to `max_vms`;
    past that it waits for a session to close (vm_wait_s), then raises: a caller that keeps
    more sessions open than VMs (TRL resets a whole generation batch first) needs a larger
    max_vms, never a silent deadlock."""

    can_fork = False

    def __init__(
        self,
        config: QemuConfig = QemuConfig(),
        guest: GuestRecord | None = None,
        *,
        allow_faults: bool = False,
    ):
        self.config = config
        self.allow_faults = allow_faults
        if guest is None:
            image = ImageConfig(
                cache=config.cache, memory_mib=config.memory_mib, accel=config.accel
            )
            guest = ensure_guest(image, log=log.info, build=config.build)
        self.guest = guest
        self._tmp = None
        if config.run_dir is None:
            self._tmp = run_root = scratch.make("envab-qemu-")
        else:
            run_root = config.run_dir
        self._run_root = run_root
        self.slots = [PooledVM(i, guest, config.cache, run_root) for i in range(config.vms)]
        self._free: queue.Queue[PooledVM] = queue.Queue()
        self._count = 0
        self._lock = threading.Lock()
        try:
            with ThreadPoolExecutor(max_workers=config.vms) as ex:
                list(ex.map(PooledVM.ensure_running, self.slots))
        except BaseException:
            self.close()  # no VM outlives a pool that failed to start
            raise
        for slot in self.slots:
            self._free.put(slot)

    def create(self, task: Mapping, *, faults: Mapping | None = None) -> QemuSession:
        for key in ("id", "config", "evaluator"):
            if key not in task:
                raise ValueError(f"task has no {key!r}")
        screen_of(task["config"])  # a task without a screen step is the caller's error
        armed = Faults.parse(faults)
        if armed.any() and not self.allow_faults:
            raise ValueError("fault injection is off (make the pool with allow_faults=True)")
        if armed.restart_host_at_step is not None:
            raise ValueError(
                "restart_host_at_step: the QEMU pool runs inside the trainer, whose restart is a "
                "kill of the trainer (ENVAB_KILL_AT, trainer/resume.py)"
            )
        slot = self._acquire()
        with self._lock:
            self._count += 1
            env_id = f"qemu-{slot.name}-{self._count}"
        return QemuSession(self, slot, task, env_id, armed)

    def _acquire(self) -> PooledVM:
        """A free VM; a new one (launched by the session) while fewer than max_vms exist."""
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if len(self.slots) < self.config.ceiling:
                slot = PooledVM(len(self.slots), self.guest, self.config.cache, self._run_root)
                self.slots.append(slot)
                return slot
        try:
            return self._free.get(timeout=self.config.vm_wait_s)
        except queue.Empty:
            raise RuntimeError(
                f"all {len(self.slots)} VMs are held by open sessions for "
                f"{self.config.vm_wait_s:.0f} s: close sessions, or raise max_vms to the "
                "number of sessions open at once (a GRPO generation batch)"
            ) from None

    def _release(self, slot: PooledVM) -> None:
        self._free.put(slot)

    def describe(self) -> dict:
        """What a receipt says about this arm."""
        return {
            "backend": "qemu",
            "vms": len(self.slots),
            "max_vms": self.config.ceiling,
            "memory_mib": self.guest.memory_mib,
            "accel": self.guest.accel,
            "accel_reason": self.guest.accel_reason,
            "qemu": self.guest.qemu_version,
            "guest_image": self.guest.image_digest,
            "warm_snapshot": self.guest.warm_digest,
            "launches": sum(s.launches for s in self.slots),
        }

    def close(self) -> None:
        for slot in self.slots:
            slot.stop()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
