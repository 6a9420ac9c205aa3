"""The host's environments: one worker process each, and the gates checked around every call.

No HTTP here (the app in `envab.envs.host.app` is a thin layer over `Pool`), so the gates can be
read in one place: at creation and fork the state hash must equal the expected one; at every step
the action's generation must match, the worker must be alive and answer within its timeout, and
the screenshot must not be blank. The first gate that fails quarantines the environment: its
worker is stopped, later steps are refused, and verify reports the verdict and the failed gate.
The checker runs here, in the host process, on state read back from the worker; the X desktop's
(OSWorld's getters and metrics, which read the environment itself) runs in a confined process
of its own (`envab.envs.xdesktop.checker`).

Where a worker runs is the host's `sandbox`: `gvisor` (each environment in its own gVisor sandbox,
forked by checkpoint and restore: `envab.envs.host.gvisor`), `process` (each a plain process
forked from a zygote with os.fork: no isolation, the fastest fork there is), `namespaces` (the
same forks, inside one sandbox of Linux namespaces, uid nobody, limits and a seccomp filter that
the zygote sets up and every fork inherits: `envab.envs.host.namespaces`), `runc` (each a fresh
OCI container, restore mode: the gVisor sandbox's bundle under runc, `envab.envs.host.runc`),
or, for the real X desktop in restore mode, `qemu` (each a QEMU VM reset by `loadvm` of a warm
snapshot: `envab.envs.xdesktop.qemu`, the same files as the gVisor sandboxes' root).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from envab.envs.arm_schema import MODES, SANDBOXES, WORLDS, check_embedded_host
from envab.envs.channel import Channel, ChannelClosed, ChannelTimeout
from envab.envs.faults import UNKNOWN_GATE, FaultError, Faults
from envab.envs.host import namespaces
from envab.envs.host.gvisor import Gvisor, Sandbox, SandboxUnavailable
from envab.envs.host.runc import Runc
from envab.envs.host.worker import load_object
from envab.envs.lifetime import start_child
from envab.envs.protocol import (
    TERMINAL_ACTIONS,
    ActionRejected,
    ForkUnsupported,
    Gate,
    Verdict,
    Verification,
    check_action,
    checked,
    is_blank,
    verdict_for,
)
from envab.envs.tasks.filestore import FileNotFrozen, FrozenFiles
from envab.envs.tasks.staging import cloud_file_reply, cloud_urls, is_cloud_file, stage_messages
from envab.hashing import sha256_json

log = logging.getLogger(__name__)

XDESKTOP_SERVER = ["/usr/bin/python3", "/opt/envab/xdesktop/server.py", "--stdio"]
# Not `-m envab.envs.host.worker`: the package imports the worker module before runpy would run it.
_ZYGOTE = "import sys; from envab.envs.host.worker import main; main(sys.argv[1:])"


class BadRequest(ValueError):
    """The request itself is wrong (HTTP 400)."""


class UnknownEnvironment(KeyError):
    """No environment with that id (HTTP 404)."""


class FaultsDisabled(PermissionError):
    """Fault injection was asked for but the host was not started with --allow-faults (403)."""


class Quarantined(RuntimeError):
    """The environment failed a gate and cannot be forked (HTTP 409, naming the gates)."""

    def __init__(self, message: str, failed_gates: list[str]):
        super().__init__(message)
        self.failed_gates = list(failed_gates)


@dataclass(frozen=True)
class HostConfig:
    mode: str
    allow_faults: bool = False
    step_timeout_s: float = 10.0
    create_timeout_s: float = 60.0
    max_envs: int = 512
    desktop: str = "envab.envs.desktop:Desktop"
    checker: str = "envab.envs.tasks.checkers:check"
    screen_of: str = "envab.envs.desktop:screen_of"
    tasks: str | None = None  # a tasks.jsonl this host serves by id (create {"task_id": ...})
    sandbox: str = "process"
    sandbox_dir: str | None = None  # images and runsc state (default: a temporary directory)
    world: str = "pillow"
    rootfs: str | None = None  # the X desktop's built root (python -m envab.envs.xdesktop.image)
    # the frozen task set's files.json: the files a task downloads come from the store beside it
    files: str | None = None
    # the X desktop image a QEMU VM boots (envs/xdesktop/apps.py); gVisor's is `rootfs`
    image: str = "base"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {SANDBOXES}, got {self.sandbox!r}")
        if self.world not in WORLDS:
            raise ValueError(f"world must be one of {WORLDS}, got {self.world!r}")
        if self.world == "xdesktop" and self.sandbox == "gvisor" and not self.rootfs:
            raise ValueError("the X desktop runs in a gVisor sandbox on its built root (rootfs)")
        check_embedded_host(self.mode, self.sandbox, self.world, rootfs_given=bool(self.rootfs))
        if self.step_timeout_s <= 0 or self.create_timeout_s <= 0:
            raise ValueError("timeouts must be positive")


@dataclass
class Environment:
    env_id: str
    task: dict
    channel: Channel | None
    pid: int | None
    expected_sha256: str | None  # the state it must start in (None: the task names none)
    parent: str | None = None
    sandbox: Sandbox | None = None  # gvisor or qemu: the sandbox (or VM) the worker runs in
    sandbox_audit: dict | None = None  # its last account, kept once it is stopped
    suspended: str | None = None  # gvisor, after a fork: the checkpoint it waits in until used
    faults: Faults = field(default_factory=Faults)
    generation: int = 0
    steps: int = 0
    last_action: str | None = None  # the action_type of the last action it took (a fork's too)
    state_sha256: str | None = None
    failed_gates: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def quarantined(self) -> bool:
        return bool(self.failed_gates)

    def status(self) -> dict:
        return {
            "env_id": self.env_id,
            "generation": self.generation,
            "state_sha256": self.state_sha256,
            "valid": not self.failed_gates,
            "verdict": str(verdict_for(self.failed_gates)),
            "failed_gates": list(self.failed_gates),
        }


def check_task(task: Any) -> dict:
    """The fields a host needs from an OSWorld-format task, or BadRequest naming the gap."""
    if not isinstance(task, Mapping):
        raise BadRequest("task must be an object")
    for key in ("id", "config", "evaluator"):
        if key not in task:
            raise BadRequest(f"task has no {key!r}")
    if not isinstance(task["config"], list):
        raise BadRequest(f"task {task['id']}: config must be a list of set-up steps")
    if not isinstance(task["evaluator"], Mapping):
        raise BadRequest(f"task {task['id']}: evaluator must be an object")
    expected = task["evaluator"].get("initial_state_sha256")
    if expected is not None and (not isinstance(expected, str) or len(expected) != 64):
        raise BadRequest(f"task {task['id']}: evaluator.initial_state_sha256 is not a sha256")
    return dict(task)


def _served_tasks(path: str | None) -> dict[str, dict]:
    """The tasks of a tasks.jsonl, by id (a host that serves tasks by id, as drumsd serves its
    pinned OSWorld checkout's)."""
    if path is None:
        return {}
    with open(path, encoding="utf-8") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    return {t["id"]: t for t in tasks}


def _faults(d: Any) -> Faults:
    try:
        return Faults.parse(d)
    except FaultError as e:
        raise BadRequest(str(e)) from None


def b64_png(png: bytes | None) -> str | None:
    return None if png is None else base64.b64encode(png).decode()


class Pool:
    """Every environment of one host, and the zygote that makes new worker processes."""

    def __init__(self, config: HostConfig):
        self.config = config
        if config.world == "xdesktop":
            from envab.envs.xdesktop import evaluate

            self.check, self.screen_of = evaluate.check, evaluate.screen_of
        else:
            self.check = load_object(config.checker)
            self.screen_of = load_object(config.screen_of)
        self.reads_environment = bool(getattr(self.check, "reads_environment", False))
        self._envs: dict[str, Environment] = {}
        self._envs_lock = threading.Lock()
        self._zygote_lock = threading.Lock()
        self._zygote: Channel | None = None
        self._zygote_proc: subprocess.Popen | None = None
        self.zygote_pid: int | None = None
        self.sandboxes: Gvisor | None = None  # or a QemuDesktops: the same calls
        self.tasks = _served_tasks(config.tasks)
        self.files = FrozenFiles(config.files) if config.files else None

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self.config.sandbox == "qemu":
            from envab.envs.xdesktop.qemu import QemuDesktops

            self.sandboxes = QemuDesktops(
                self.config.sandbox_dir, self.config.create_timeout_s, image=self.config.image
            )
            self.sandboxes.probe()
            log.info("QEMU VMs under %s (mode restore)", self.sandboxes.workdir)
            return
        if self.config.sandbox in ("gvisor", "runc"):
            argv = [sys.executable, "-c", _ZYGOTE, "--stdio", "--mode", self.config.mode,
                    "--desktop", self.config.desktop]  # fmt: skip
            root = None
            if self.config.world == "xdesktop":
                argv, root = XDESKTOP_SERVER, self.config.rootfs
            runtime = Runc if self.config.sandbox == "runc" else Gvisor  # the same bundle
            self.sandboxes = runtime(
                self.config.sandbox_dir, argv, self.config.create_timeout_s, root=root
            )
            self.sandboxes.probe()  # a worker that cannot start in a sandbox stops the host here
            log.info("%s sandboxes under %s (mode %s)", self.sandboxes.name,
                     self.sandboxes.workdir, self.config.mode)  # fmt: skip
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [
            sys.executable,
            "-c",
            _ZYGOTE,
            "--fd",
            str(theirs.fileno()),
            "--mode",
            self.config.mode,
            "--desktop",
            self.config.desktop,
        ]
        if self.config.sandbox == "namespaces":
            problem = namespaces.namespaces_problem()
            if problem:
                raise SandboxUnavailable(f"the namespace sandbox cannot run: {problem}")
            # The zygote confines itself inside bwrap's namespaces; every environment is a fork
            # of it and inherits them. The sandbox goes with the host however the host goes.
            self._zygote_proc = start_child(
                namespaces.bwrap_argv([*cmd, "--confine"]),
                death_signal=signal.SIGKILL,
                pass_fds=[theirs.fileno()],
            )
        else:
            self._zygote_proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()])
        theirs.close()
        self._zygote = Channel(ours)
        try:
            hello = self._zygote.recv(timeout=self.config.create_timeout_s, expect="started")
        except (ChannelClosed, ChannelTimeout):
            if self.config.sandbox != "namespaces":
                raise
            problem = namespaces.launch_problem(self._zygote_proc)
            self._stop_zygote()
            raise SandboxUnavailable(problem) from None
        self.zygote_pid = hello["pid"]  # in a namespace sandbox: its pid there
        log.info("zygote up (pid %s, mode %s, sandbox %s)", self.zygote_pid, self.config.mode,
                 self.config.sandbox)  # fmt: skip

    def stop(self) -> None:
        for env_id in list(self._envs):
            self.close(env_id)
        self._stop_zygote()
        if self.sandboxes is not None:
            self.sandboxes.close()

    def _stop_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.close()  # the zygote reads end-of-stream and exits
            self._zygote = None
        if self._zygote_proc is not None:
            try:
                self._zygote_proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._zygote_proc.kill()
                self._zygote_proc.wait()
            self._zygote_proc = None

    def __len__(self) -> int:
        return len(self._envs)

    # --- the protocol -----------------------------------------------------------------------

    def task_for(self, task: Any, task_id: Any) -> Any:
        """The task a create request names: given whole, or by id from the tasks this host
        serves (its --tasks file), never both."""
        if (task is None) == (task_id is None):
            raise BadRequest("give the task, or its task_id, not both")
        if task_id is None:
            return task
        if task_id not in self.tasks:
            served = f"{len(self.tasks)} tasks" if self.tasks else "no tasks by id (no --tasks)"
            raise BadRequest(f"unknown task_id {task_id!r}: this host serves {served}")
        return self.tasks[task_id]

    def create(self, task: Any, faults: Mapping | None = None) -> dict:
        task = check_task(task)
        armed = _faults(faults)
        if armed.any() and not self.config.allow_faults:
            raise FaultsDisabled("fault injection is off (start the host with --allow-faults)")
        if len(self._envs) >= self.config.max_envs:
            raise BadRequest(f"host holds its maximum of {self.config.max_envs} environments")
        try:
            size = tuple(self.screen_of(task["config"]))
        except (ValueError, KeyError, TypeError) as e:
            raise BadRequest(f"task {task['id']}: {e}") from None
        t0 = time.perf_counter()
        env = Environment(
            env_id=uuid.uuid4().hex[:16],
            task=task,
            channel=None,
            pid=None,
            expected_sha256=task["evaluator"].get("initial_state_sha256"),
            faults=armed,
        )
        if self.sandboxes is not None:
            self._sandboxed(env, size)
        else:
            with self._zygote_lock:
                try:
                    ((env.channel, env.pid, _),) = self._spawn(self._zygote, 1, size)
                except (ChannelClosed, ChannelTimeout):  # the zygote died: start another, once
                    log.error("zygote lost; starting a new one")
                    self._stop_zygote()
                    self.start()
                    ((env.channel, env.pid, _),) = self._spawn(self._zygote, 1, size)
        t1 = time.perf_counter()
        reply = None
        if not env.quarantined:
            self._stage(env, task["config"])
        if not env.quarantined:
            reply = self._call(
                env,
                ("init", size, task["config"], armed.for_worker()),
                self.config.create_timeout_s,
                Gate.SETUP,
            )
        png = None
        if reply is not None:
            env.state_sha256 = reply["state_sha256"]
            png = reply["screenshot"]
            if env.expected_sha256 is not None and env.state_sha256 != env.expected_sha256:
                self._quarantine(env, Gate.STATE_HASH)
            elif self._blank(png):
                self._quarantine(env, Gate.SCREEN_NOT_BLANK)
        self._register(env)
        timings = {"spawn_s": t1 - t0, "create_s": time.perf_counter() - t0}
        if reply is not None:
            timings.update(reply["timings"])
        log.info(
            "create %s task=%s verdict=%s", env.env_id, task["id"], verdict_for(env.failed_gates)
        )
        return {
            **env.status(),
            "task_sha256": sha256_json(task),
            "screenshot_png": b64_png(None if env.quarantined else png),
            "timings": timings,
        }

    def fork(self, env_id: str, n: int, faults: Any = None) -> dict:
        """n children of `env_id` in its state. `faults`, when given, is a list of n fault
        objects, one per child (a parent's faults are never inherited)."""
        if self.config.mode != "fork":
            raise ForkUnsupported("this host runs in restore mode; create n environments instead")
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 64:
            raise BadRequest(f"n must be an integer 1..64, got {n!r}")
        if faults is not None and (not isinstance(faults, list) or len(faults) != n):
            raise BadRequest(f"faults must be a list of {n} fault objects, one per child")
        armed = [_faults(f) for f in faults or [None] * n]
        if any(a.any() for a in armed) and not self.config.allow_faults:
            raise FaultsDisabled("fault injection is off (start the host with --allow-faults)")
        if len(self._envs) + n > self.config.max_envs:
            raise BadRequest(f"host holds its maximum of {self.config.max_envs} environments")
        parent = self._get(env_id)
        with parent.lock:
            if parent.quarantined:
                raise Quarantined(
                    f"environment {env_id} failed {parent.failed_gates}", parent.failed_gates
                )
            t0 = time.perf_counter()
            try:
                if self.sandboxes is not None:
                    spawned = self._fork_sandbox(parent, n)
                else:
                    spawned = [(*s, None) for s in self._spawn(parent.channel, n, None)]
            except Quarantined:
                raise
            except (ChannelClosed, ChannelTimeout, RuntimeError, OSError) as e:
                log.warning("environment %s: fork failed: %s", env_id, e)
                self._quarantine(parent, Gate.WORKER_ALIVE)
                raise Quarantined(
                    f"environment {env_id} died while forking", parent.failed_gates
                ) from None
            elapsed = time.perf_counter() - t0
        children = []
        for (channel, pid, hello, sandbox), child_faults in zip(spawned, armed, strict=True):
            child = Environment(
                env_id=uuid.uuid4().hex[:16],
                task=parent.task,
                channel=channel,
                pid=pid,
                sandbox=sandbox,
                expected_sha256=parent.state_sha256,
                parent=parent.env_id,
                generation=parent.generation,
                steps=parent.steps,
                last_action=parent.last_action,
                state_sha256=hello["state_sha256"],
                faults=child_faults,
            )
            if child_faults.any():  # the worker's own switches; a corrupt state shows at once
                reply = self._call(
                    child,
                    ("arm", child_faults.for_worker()),
                    self.config.create_timeout_s,
                    Gate.SETUP,
                )
                if reply is not None:
                    child.state_sha256 = reply["state_sha256"]
            if not child.quarantined and child.state_sha256 != child.expected_sha256:
                self._quarantine(child, Gate.STATE_HASH)
            self._register(child)
            children.append(child.status())
        log.info("fork %s into %d children", env_id, n)
        return {"children": children, "timings": {"fork_s": elapsed, "per_child_s": elapsed / n}}

    def step(self, env_id: str, action: Any, generation: Any) -> dict:
        try:
            action = check_action(action)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise BadRequest(f"generation must be an integer, got {generation!r}")
        env = self._get(env_id)
        t0 = time.perf_counter()
        with env.lock:
            png = None
            if not env.quarantined and generation != env.generation:
                self._quarantine(env, Gate.GENERATION)
            if not env.quarantined:
                reply = self._call(
                    env, ("step", action), self.config.step_timeout_s, Gate.WORKER_ALIVE
                )
                if reply is not None and "rejected" in reply:
                    raise ActionRejected(reply["rejected"])
                if reply is not None:
                    if env.steps + 1 == env.faults.restart_host_at_step:
                        self._die(env)  # no answer: the host is gone
                    env.steps += 1
                    env.last_action = action["action_type"]
                    env.generation += 1
                    png = self._screen(env, reply)
                    if not env.quarantined and env.steps == env.faults.unknown_gate_at_step:
                        self._quarantine(env, UNKNOWN_GATE)
            status = env.status()
        done = action["action_type"] in TERMINAL_ACTIONS
        return {
            **status,
            "done": done,
            "screenshot_png": b64_png(None if env.quarantined else png),
            "timings": {"step_s": time.perf_counter() - t0},
        }

    def observe(self, env_id: str) -> dict:
        """The environment's screen now, without acting (the same generation), gated as a
        step's: the worker alive, the frame its latest, the screen not blank."""
        env = self._get(env_id)
        with env.lock:
            png = None
            if not env.quarantined:
                reply = self._call(env, ("observe",), self.config.step_timeout_s, Gate.WORKER_ALIVE)
                if reply is not None:
                    png = self._screen(env, reply)
            status = env.status()
        return {**status, "screenshot_png": b64_png(None if env.quarantined else png)}

    def _screen(self, env: Environment, reply: Mapping) -> bytes:
        """A worker's screenshot after a step or a look, gated: its frame must be the
        environment's latest (a display that stopped updating fails screen_current) and it
        must not be one colour."""
        env.state_sha256 = reply["state_sha256"]
        png = reply["screenshot"]
        if reply.get("frame") != env.steps:
            self._quarantine(env, Gate.SCREEN_CURRENT)
        elif self._blank(png):
            self._quarantine(env, Gate.SCREEN_NOT_BLANK)
        return png

    def _die(self, env: Environment) -> None:
        """The host process dies mid-step (fault restart_host_at_step), as on a crash or a reboot:
        no answer, every environment lost with it. Whoever supervises the host starts it again."""
        with self._envs_lock:
            lost = sorted(self._envs)
        log.error("fault: the host dies at step %d of %s; %d environments lost: %s",
                  env.steps + 1, env.env_id, len(lost), " ".join(lost))  # fmt: skip
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def verify(self, env_id: str) -> dict:
        env = self._get(env_id)
        with env.lock:
            self._wake(env)  # its audit names the sandbox it runs in
            audit = {
                "env_id": env.env_id,
                "parent": env.parent,
                "worker_pid": env.pid,
                "task": env.task["id"],
                "mode": self.config.mode,
                "sandbox": self._sandbox_audit(env),
                "generation": env.generation,
                "steps": env.steps,
                "checker": env.task["evaluator"].get("func"),
                "flags": [],
            }
            if env.quarantined:
                return self._verification(env.failed_gates, audit)
            if env.faults.verifier_unavailable:
                audit["flags"].append("verifier_unreachable")
                return self._verification([Gate.VERIFIER_AVAILABLE], audit)
            reply = self._call(env, ("state",), self.config.step_timeout_s, Gate.WORKER_ALIVE)
            if reply is None:
                return self._verification(env.failed_gates, audit)
            audit["state_sha256"] = reply["state_sha256"]
            # A world whose tasks are scored from the agent's last action first (OSWorld's:
            # infeasible tasks, and FAIL on a feasible one) needs no checker for those.
            final = getattr(self.check, "final_action", None)
            score = final(env.task["evaluator"], env.last_action) if final else None
            if score is not None:
                audit["final_action"] = env.last_action
                audit["trusted"] = True
                return Verification(score, True, Verdict.VALID, (), audit).to_dict()
            # A checker that reads the environment itself (OSWorld's getters) gets access to
            # it, under the environment's lock, instead of a snapshot of its state.
            state = _Access(self, env) if self.reads_environment else reply["state"]
            verification = checked(self.check, env.task["evaluator"], state, audit)
        if not verification.valid:
            audit["flags"].append(f"checker_{audit.pop('checker_failure')}")
            return self._verification(verification.failed_gates, audit)
        audit["trusted"] = not audit["flags"]
        return Verification(verification.score, True, Verdict.VALID, (), audit).to_dict()

    def close(self, env_id: str) -> dict:
        with self._envs_lock:
            env = self._envs.pop(env_id, None)
        if env is None:
            return {"env_id": env_id, "closed": False}
        with env.lock:
            self._stop_worker(env, kill=False)
        return {"env_id": env_id, "closed": True}

    # --- helpers ----------------------------------------------------------------------------

    def _sandboxed(self, env: Environment, size) -> None:
        """Give `env` a sandbox restored from the prepared desktop of its screen size (made on
        first use); a sandbox that cannot start fails gate worker_alive."""

        def prepare(sandbox: Sandbox) -> None:
            reply = sandbox.channel.call(("prepare", size), timeout=self.config.create_timeout_s)
            if "error" in reply:
                raise BadRequest(f"cannot prepare the desktop: {reply['error']}")

        try:
            image = self.sandboxes.template(("size", size), prepare)
            ((sandbox, _),) = self.sandboxes.restore(image, 1)
        except (ChannelClosed, ChannelTimeout, RuntimeError, OSError) as e:
            log.error("environment %s: no sandbox: %s", env.env_id, e)
            env.failed_gates.append(str(Gate.WORKER_ALIVE))
            return
        env.sandbox, env.channel, env.pid = sandbox, sandbox.channel, sandbox.pid

    def _fork_sandbox(self, parent: Environment, n: int) -> list[tuple]:
        """n children restored from a checkpoint of the parent's sandbox (each is checked
        against the parent's state hash by `fork`). The parent waits in that checkpoint until
        it is used again (`_wake`); a parent forked again while it waits is not checkpointed
        again."""
        if parent.suspended is None:
            parent.sandbox_audit = parent.sandbox.audit()
            parent.suspended, children = self.sandboxes.fork(parent.sandbox, n)
            parent.sandbox, parent.channel, parent.pid = None, None, None
        else:
            children = self.sandboxes.restore(parent.suspended, n)
        return [(sb.channel, sb.pid, hello, sb) for sb, hello in children]

    def _wake(self, env: Environment) -> None:
        """Restore a parent that waits in its fork's checkpoint (under its lock); a copy that
        cannot start fails gate worker_alive, one not in the parent's state gate state_hash."""
        if env.suspended is None:
            return
        image, env.suspended = env.suspended, None
        try:
            sandbox, hello = self.sandboxes.resume(image)
        except (ChannelClosed, ChannelTimeout, RuntimeError, OSError) as e:
            log.warning("environment %s: cannot restore it after its fork: %s", env.env_id, e)
            env.failed_gates.append(str(Gate.WORKER_ALIVE))
            return
        env.sandbox, env.channel, env.pid = sandbox, sandbox.channel, sandbox.pid
        if hello["state_sha256"] != env.state_sha256:
            self._quarantine(env, Gate.STATE_HASH)

    def _sandbox_audit(self, env: Environment) -> dict:
        if self.config.sandbox == "namespaces":
            return namespaces.audit()
        if self.sandboxes is None:
            return {"runtime": "process", "isolation": "none"}
        if env.sandbox is not None:
            return env.sandbox.audit()
        return env.sandbox_audit or {"runtime": self.config.sandbox, "container": None}

    def _spawn(self, channel: Channel, n: int, size) -> list[tuple[Channel, int, dict]]:
        """Ask a process to fork n children, each with a fresh channel; returns their hellos."""
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(n)]
        try:
            channel.send(("fork", n, size))
            channel.send_fds([theirs.fileno() for _, theirs in pairs])
        finally:
            for _, theirs in pairs:
                theirs.close()
        reply = channel.recv(timeout=self.config.create_timeout_s, expect="fork")
        if "error" in reply:
            raise BadRequest(f"cannot prepare the desktop: {reply['error']}")
        out = []
        for (ours, _), pid in zip(pairs, reply["pids"], strict=True):
            child = Channel(ours)
            hello = child.recv(timeout=self.config.create_timeout_s, expect="hello")
            out.append((child, pid, hello))
        return out

    def _call(self, env: Environment, message, timeout: float, error_gate: Gate) -> dict | None:
        """One request to the worker; a gate failure quarantines `env` and returns None."""
        self._wake(env)
        if env.quarantined:
            return None
        try:
            reply = env.channel.call(message, timeout=timeout)
        except ChannelTimeout:
            self._quarantine(env, Gate.STEP_TIMEOUT)
            return None
        except ChannelClosed:
            self._quarantine(env, Gate.WORKER_ALIVE)
            return None
        if "error" in reply:
            log.warning("environment %s: %s", env.env_id, reply["error"])
            self._quarantine(env, error_gate)
            return None
        return reply

    def _stage(self, env: Environment, steps: list) -> None:
        """Deliver the files the `download` steps among `steps` name, from the frozen store
        (envs/tasks/staging.py); a file the store does not hold fails the set-up gate."""
        try:
            for message in stage_messages(steps, self.files):
                if self._call(env, message, self.config.create_timeout_s, Gate.SETUP) is None:
                    return
        except FileNotFrozen as e:
            log.warning("environment %s: %s", env.env_id, e)
            self._quarantine(env, Gate.SETUP)

    def _quarantine(self, env: Environment, gate: str) -> None:
        env.failed_gates.append(str(gate))
        log.warning("environment %s quarantined: gate %s failed", env.env_id, gate)
        # A worker that missed its timeout may be wedged: stop it hard.
        self._stop_worker(env, kill=gate == Gate.STEP_TIMEOUT)

    def _stop_worker(self, env: Environment, kill: bool) -> None:
        if env.suspended is not None:  # waits in a checkpoint: nothing runs, the image goes
            self.sandboxes.discard(env.suspended)
            env.suspended = None
        if env.sandbox is not None:
            env.sandbox_audit = env.sandbox.audit()
            self.sandboxes.stop(env.sandbox, kill)
            env.sandbox, env.channel = None, None
            return
        if env.channel is None:
            return
        if kill and env.pid:
            pid = env.pid
            if self.config.sandbox == "namespaces":  # env.pid is its pid in the sandbox
                sandbox = self._zygote_proc.pid if self._zygote_proc else None
                pid = namespaces.host_pid(sandbox, env.pid) if sandbox else None
            with contextlib.suppress(ProcessLookupError):
                if pid:
                    os.kill(pid, signal.SIGKILL)
        env.channel.close()  # a live worker reads end-of-stream and exits
        env.channel = None

    def _register(self, env: Environment) -> None:
        with self._envs_lock:
            self._envs[env.env_id] = env

    def _get(self, env_id: str) -> Environment:
        try:
            return self._envs[env_id]
        except KeyError:
            raise UnknownEnvironment(env_id) from None

    @staticmethod
    def _blank(png: bytes) -> bool:
        with Image.open(io.BytesIO(png)) as image:
            return is_blank(image)

    @staticmethod
    def _verification(gates, audit: dict) -> dict:
        audit["trusted"] = False
        return Verification.invalid([str(g) for g in gates], **audit).to_dict()


class _Access:
    """An environment's in-environment server, for a checker that reads it (one evaluation,
    under the environment's lock): raw requests, turns of a stream to its browser, and the
    evaluator's post-config steps."""

    def __init__(self, pool: Pool, env: Environment):
        self.pool, self.env = pool, env

    def _ask(self, message, timeout: float) -> dict:
        if self.env.channel is None:
            raise ChannelClosed("the environment is gone")
        reply = self.env.channel.call(message, timeout=timeout)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def http(self, method: str, path: str, content_type: str, body: bytes) -> dict:
        if is_cloud_file(path):  # a cloud_file expectation: from the frozen store, not the env
            allowed = cloud_urls(self.env.task.get("evaluator") or {})  # this task's files only
            return cloud_file_reply(path, self.pool.files, allowed)
        request = ("http", method, path, content_type, body)
        # A checker's request reads what a set-up made (a whole file, the whole accessibility
        # tree: Chromium's took more than a step's 60 s in a QEMU guest under TCG), so it may
        # take as long as a set-up; the checker's own deadline is checked between requests.
        return self._ask(request, self.pool.config.create_timeout_s)

    def browser(self, stream: int, data: bytes, close: bool, wait: float) -> dict:
        """One turn of a byte stream to the browser's debugging port in the environment
        (envs/xdesktop/debugging.py)."""
        return self._ask(("browser", stream, data, close, wait), self.pool.config.step_timeout_s)

    def postconfig(self, steps: list) -> dict:
        """Run the evaluation's set-up steps in the environment: what their commands printed,
        by the name each step gives (unchecked here: the checker's `cache_files` checks it)."""
        for message in stage_messages(steps, self.pool.files):  # FileNotFrozen: no score
            self._ask(message, self.pool.config.create_timeout_s)
        return self._ask(("postconfig", steps), self.pool.config.create_timeout_s)["cache"]
