"""Sandboxes for the host's workers: each environment runs inside gVisor (Debian's `runsc`).

A Drums host forks sandboxes, not processes; this is that, locally. A worker starts once per
screen size in a fresh sandbox, prepares the blank desktop and is checkpointed: that image is the
prepared environment every create restores. A fork is a checkpoint of the running parent and
n restores of it (this runsc's `--leave-running` is not a usable fork); the parent waits in the
checkpoint and is restored from it only if it is used again (a GRPO group closes its parent right
after forking it: one restore in nine saved). A restored copy takes the standard input and output
of its own `runsc restore`, so each copy gets a channel of its own, and reseeds its random state
on its first message (every copy wakes with the saved one).

Every sandbox: the ptrace platform (the KVM platform needs hardware virtualisation and hangs
without it), no network, a read-only root that holds only what the worker needs (the system's
/usr, the Python installation and this package: no host secrets, no home), and its writable
directories in the sandbox's own memory (tmpfs), so a checkpoint carries them and a fork copies
them. `runsc` runs as root; where it cannot, the host refuses to start with the reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from envab.envs import scratch
from envab.envs.channel import PipeChannel
from envab.envs.lifetime import start_child
from envab.envs.memory import tree_pss_bytes
from envab.errors import Refusal

log = logging.getLogger(__name__)

RUNSC = "runsc"
# Each writable folder of a sandbox is a tmpfs in its memory, bounded: an agent's `dd` into /tmp
# fails with ENOSPC inside its own environment instead of taking the host's memory, and every
# checkpoint (the sandbox's whole memory) stays bounded with it.
TMPFS_SIZE = "256m"
# And each sandbox is a cgroup of its own (runsc applies the bundle's `linux.resources`): an
# agent's fork bomb or memory hog kills its own sandbox at these bounds — the host sees that
# environment's worker die (gate `worker_alive`) — instead of starving the host and the other
# environments. Host tasks, not the sandbox's processes, are what `pids` counts: an idle worker
# holds about 40 (the Sentry's threads and the platform's stubs). The tmpfs folders count
# towards the memory bound.
MEMORY_LIMIT_BYTES = 2 * 2**30
PIDS_LIMIT = 1024
CHECKPOINT_ROOM = 1.5  # a checkpoint image against the sandbox's memory (it is compressed less)
MIN_FREE_BYTES = 512 * 2**20  # left free on the images' disk after any checkpoint
PLATFORM = "ptrace"


CGROUPS = Path("/sys/fs/cgroup")
LEAKED_AFTER_S = 3600.0  # an empty sandbox cgroup this old belongs to no host still starting it


def sweep_leaked_cgroups(
    root: Path = CGROUPS, older_than_s: float = LEAKED_AFTER_S, names: str = "env-*"
) -> int:
    """Remove the empty cgroups a killed host's sandboxes left (`<controller>/env-<id>`, the
    sandboxes' `names`: `runsc delete` removes them, a host killed before it could does not);
    returns how many. Only an empty one (no process in `cgroup.procs`) older than
    `older_than_s` goes: another host's sandbox that is starting has its cgroup made moments
    before its first process."""
    swept, now = 0, time.time()
    for group in root.glob(f"*/{names}"):
        try:
            if now - group.stat().st_mtime < older_than_s:
                continue
            if (group / "cgroup.procs").read_text().strip():
                continue
            group.rmdir()  # a cgroup folder goes with its control files; refused while in use
            swept += 1
        except OSError:  # gone meanwhile, in use, or not ours to remove: left as it is
            continue
    return swept


class SandboxUnavailable(Refusal, RuntimeError):
    """A sandbox cannot run here (gVisor, runc's container, the namespace sandbox): the message
    names which, why, and what to do."""


def container_runtime_problem(tool: str, why_root: str) -> str | None:
    """Why an OCI runtime cannot run a sandbox here (missing, or not root), or None."""
    if shutil.which(tool) is None:
        return f"{tool} not found: install Debian's {tool} (apt-get install {tool})"
    if os.geteuid() != 0:
        return f"{tool} needs root here ({why_root}); run as root"
    return None


def runtime_version(tool: str) -> str:
    """The first line of an OCI runtime's `--version`."""
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"


def gvisor_problem(runsc: str | None = None) -> str | None:
    """Why gVisor sandboxes cannot run on this machine, or None when they can."""
    return container_runtime_problem(runsc or RUNSC, "rootless gVisor needs --network=host")


@cache
def runsc_version() -> str:
    return runtime_version(RUNSC)


def _package_dirs() -> list[str]:
    """The directories the worker's imports come from: this package (an editable install maps
    it outside site-packages), the environment's prefix and the Python it was made from."""
    import envab
    import envab.envs

    dirs = {sys.prefix, sys.base_prefix, *envab.__path__, *envab.envs.__path__}
    return sorted({os.path.realpath(d) for d in dirs})


def _root_mounts() -> tuple[list[dict], list[tuple[str, str]]]:
    """Read-only binds of what the worker needs, and the symlinks a merged-/usr system has at
    the top (/bin -> usr/bin and the like), recreated in the sandbox's empty root."""
    mounts, links = [], []
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / top
        if path.is_symlink():
            links.append((top, os.readlink(path)))
        elif path.is_dir():
            mounts.append(str(path))
    binds = ["/usr", *mounts]
    for d in _package_dirs():  # skip what a bind above already holds
        if not any(d == b or d.startswith(b + "/") for b in binds):
            binds.append(d)
    spec = [
        {"destination": b, "type": "bind", "source": b, "options": ["rbind", "ro"]} for b in binds
    ]
    return spec, links


def _python_path() -> str:
    """Where `envab` itself was found, for a job that imports it from its working folder (a
    workflow copy) rather than from the environment: only the package is bound there."""
    import envab

    return os.pathsep.join(sorted({os.path.dirname(os.path.realpath(d)) for d in envab.__path__}))


def _write_bundle(bundle: Path, argv: Sequence[str], root: Path | None = None) -> None:
    """An OCI bundle. Without `root`: an empty read-only root with read-only binds of what a
    worker of this package needs. With `root`: that folder (a built image) as the read-only
    root, nothing of the host's. Either way tmpfs where a desktop writes."""
    env = ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8",
           "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"]  # fmt: skip
    binds: list[dict] = []
    if root is None:
        rootfs = bundle / "rootfs"
        binds, links = _root_mounts()
        for name, target in links:
            (rootfs / name).parent.mkdir(parents=True, exist_ok=True)
            (rootfs / name).symlink_to(target)
        for mount in binds:
            (rootfs / mount["destination"].lstrip("/")).mkdir(parents=True, exist_ok=True)
        for d in ("proc", "sys", "tmp", "root", "run"):
            (rootfs / d).mkdir(parents=True, exist_ok=True)
        env.append(f"PYTHONPATH={_python_path()}")
    else:
        rootfs = Path(root).resolve()
        for d in ("tmp", "root", "run"):
            if not (rootfs / d).is_dir():
                raise SandboxUnavailable(f"{rootfs} has no /{d}: not a built root file system")
    spec = {
        "ociVersion": "1.0.0",
        "process": {"args": list(argv), "cwd": "/tmp", "env": env, "user": {"uid": 0, "gid": 0}},
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "env",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro"]},
            *(
                {
                    "destination": d,
                    "type": "tmpfs",
                    "source": "tmpfs",
                    "options": [f"size={TMPFS_SIZE}"],
                }
                for d in ("/dev/shm", "/tmp", "/root", "/run")
            ),
            *binds,
        ],
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "resources": {
                "memory": {"limit": MEMORY_LIMIT_BYTES},
                "pids": {"limit": PIDS_LIMIT},
            },
        },
    }
    (bundle / "config.json").write_text(json.dumps(spec, indent=1))


@dataclass
class Sandbox:
    """One running sandbox: its container id, the `runsc run|restore` process it is attached
    to (the sandbox dies with it), and the worker's channel (that process's stdio)."""

    cid: str
    proc: subprocess.Popen
    channel: PipeChannel
    image: str  # the checkpoint it was restored from ("" for a fresh start)
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def memory_bytes(self) -> int | None:
        """The sandbox's memory: proportional set size (shared pages split among their
        sharers) of its kernel, file proxy and address-space stubs; None once it is gone."""
        return tree_pss_bytes(self.proc.pid, include_root=False)

    def audit(self) -> dict:
        memory = self.memory_bytes()
        return {
            "runtime": "gvisor",
            "runsc": runsc_version(),
            "platform": PLATFORM,
            "network": "none",
            "root": "read-only",
            "container": self.cid,
            "restored_from": Path(self.image).name if self.image else None,
            "memory_mib": None if memory is None else round(memory / 2**20, 1),
            "limits": {"memory_mib": MEMORY_LIMIT_BYTES // 2**20, "pids": PIDS_LIMIT},
            "age_s": round(time.monotonic() - self.started, 3),
        }


class Gvisor:
    """The host's sandboxes: one runsc state root, one bundle, checkpoint images, and a reaper
    that waits for stopped sandboxes and deletes their state."""

    name = "gVisor"  # what a refusal calls it (envs/host/runc.py runs the same bundle)

    @staticmethod
    def _problem() -> str | None:
        return gvisor_problem()

    def _sandbox(self, cid: str, proc: subprocess.Popen, channel: PipeChannel, image: str):
        return Sandbox(cid, proc, channel, image)

    def __init__(
        self,
        workdir: str | Path | None,
        worker_argv: Sequence[str],
        timeout_s: float,
        root: str | Path | None = None,
    ):
        problem = self._problem()
        if problem:
            raise SandboxUnavailable(f"the {self.name} sandbox cannot run: {problem}")
        sweep_leaked_cgroups()  # what an earlier host, killed, left behind
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or scratch.make("envab-gvisor-")).resolve()
        self.root = self.workdir / "state"
        self.images = self.workdir / "images"
        self.bundle = self.workdir / "bundle"
        for d in (self.root, self.images, self.bundle):
            d.mkdir(parents=True, exist_ok=True)
        _write_bundle(self.bundle, worker_argv, None if root is None else Path(root))
        self.timeout_s = timeout_s
        self._templates: dict[object, str] = {}
        self._template_locks: dict[object, threading.Lock] = {}
        self._lock = threading.Lock()
        self._live: dict[str, Sandbox] = {}
        self._reap: queue.Queue = queue.Queue()
        self._reaper = threading.Thread(target=self._reaper_loop, name="gvisor-reaper", daemon=True)
        self._reaper.start()

    def _runsc(self, *args: str) -> list[str]:
        return [RUNSC, "--root", str(self.root), "--network=none", f"--platform={PLATFORM}", *args]

    # --- starting sandboxes ------------------------------------------------------------------

    def _launch(self, args: list[str], image: str) -> Sandbox:
        cid = f"env-{uuid.uuid4().hex[:12]}"
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            proc = start_child(
                self._runsc(*args, cid),
                death_signal=signal.SIGKILL,  # the attached sandbox goes with it
                stdin=to_child_r,
                stdout=from_child_w,
                cwd=self.bundle,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        sandbox = self._sandbox(cid, proc, PipeChannel(from_child_r, to_child_w), image)
        with self._lock:
            self._live[cid] = sandbox
        return sandbox

    def run(self) -> tuple[Sandbox, dict]:
        """A fresh sandbox running the worker, and the worker's hello."""
        sandbox = self._launch(["run", "--bundle", str(self.bundle)], "")
        return sandbox, self._first_words(sandbox, None)

    def probe(self) -> None:
        """Start one sandbox and stop it: a worker that cannot start (its imports are not in
        the sandbox's root) is the host's misconfiguration, said once at start, not an
        environment failure at every create."""
        try:
            sandbox, _ = self.run()
        except (OSError, EOFError, ConnectionError, TimeoutError) as e:
            self.close()
            raise SandboxUnavailable(
                f"the worker did not start in a {self.name} sandbox ({e}); its error is above"
            ) from None
        self.stop(sandbox, kill=False)

    def restore(self, image: str, n: int) -> list[tuple[Sandbox, dict]]:
        """n copies of a checkpoint, restored side by side; each greeted (`hello`)."""

        def one(_):
            sandbox = self._launch(
                ["restore", "--image-path", image, "--bundle", str(self.bundle)], image
            )
            return sandbox, self._first_words(sandbox, ("hello",))

        if n == 1:
            return [one(0)]
        with ThreadPoolExecutor(max_workers=min(n, 8)) as ex:
            futures = [ex.submit(one, i) for i in range(n)]
            results, error = [], None
            for f in futures:
                try:
                    results.append(f.result())
                except Exception as e:  # keep the others to stop them
                    error = error or e
        if error is not None:
            for sandbox, _ in results:
                self.stop(sandbox, kill=True)
            raise error
        return results

    def _first_words(self, sandbox: Sandbox, message) -> dict:
        try:
            if message is None:
                return sandbox.channel.recv(timeout=self.timeout_s, expect="started")
            return sandbox.channel.call(message, timeout=self.timeout_s)
        except Exception:
            self.stop(sandbox, kill=True)
            raise

    def checkpoint(self, sandbox: Sandbox, name: str) -> str:
        """Checkpoint a running sandbox into a new image (the sandbox stops); the image's path.
        Refused (RuntimeError: the environment is lost, gate worker_alive) where the disk has
        no room for the sandbox's memory: a full disk must end one environment, not the host."""
        need = (sandbox.memory_bytes() or 0) * CHECKPOINT_ROOM + MIN_FREE_BYTES
        free = shutil.disk_usage(self.images).free
        if free < need:
            self.stop(sandbox, kill=True)
            raise RuntimeError(
                f"no room for a checkpoint: {free / 2**20:.0f} MiB free in {self.images}, "
                f"{need / 2**20:.0f} MiB needed"
            )
        image = tempfile.mkdtemp(prefix=f"{name}-", dir=self.images)
        done = subprocess.run(
            self._runsc("checkpoint", "--image-path", image, sandbox.cid),
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            check=False,
        )
        self.stop(sandbox, kill=done.returncode != 0)
        if done.returncode != 0:
            shutil.rmtree(image, ignore_errors=True)
            raise RuntimeError(f"runsc checkpoint failed: {done.stderr.strip()[-300:]}")
        return image

    def template(self, key, prepare: Callable[[Sandbox], None]) -> str:
        """The checkpoint image for `key`, made once: a fresh sandbox, `prepare(sandbox)`, and
        a checkpoint. A prepare that raises leaves no image and raises again next time."""
        with self._lock:
            lock = self._template_locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._templates:
                sandbox, _ = self.run()
                try:
                    prepare(sandbox)
                except BaseException:
                    self.stop(sandbox, kill=True)
                    raise
                self._templates[key] = self.checkpoint(sandbox, "template")
            return self._templates[key]

    def fork(self, parent: Sandbox, n: int) -> tuple[str, list[tuple[Sandbox, dict]]]:
        """Checkpoint `parent` (it stops) and restore n children from its image; the image, in
        which the parent waits (`resume` or `discard` it), and the children."""
        image = self.checkpoint(parent, "fork")
        try:
            return image, self.restore(image, n)
        except BaseException:
            self.discard(image)
            raise

    def resume(self, image: str) -> tuple[Sandbox, dict]:
        """The sandbox that waits in a fork's `image`, running again; the image goes."""
        try:
            ((sandbox, hello),) = self.restore(image, 1)
        finally:
            self.discard(image)
        return sandbox, hello

    @staticmethod
    def discard(image: str) -> None:
        shutil.rmtree(image, ignore_errors=True)

    # --- stopping ----------------------------------------------------------------------------

    def stop(self, sandbox: Sandbox, kill: bool) -> None:
        """Close the worker's channel (it exits, and so does its sandbox), or kill the sandbox
        outright; the reaper waits for it and deletes its state."""
        if kill and sandbox.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                sandbox.proc.kill()
        sandbox.channel.close()
        self._reap.put(sandbox)

    def _reaper_loop(self) -> None:
        while True:
            sandbox = self._reap.get()
            if sandbox is None:
                return
            try:
                sandbox.proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                sandbox.proc.kill()
                sandbox.proc.wait()
            subprocess.run(
                self._runsc("delete", "--force", sandbox.cid), capture_output=True, check=False
            )
            with self._lock:
                self._live.pop(sandbox.cid, None)

    def close(self) -> None:
        """Stop every sandbox, wait for the reaper, remove the images and state."""
        with self._lock:
            live = list(self._live.values())
        for sandbox in live:
            self.stop(sandbox, kill=True)
        self._reap.put(None)
        self._reaper.join(timeout=60)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            for d in (self.images, self.root):
                shutil.rmtree(d, ignore_errors=True)
