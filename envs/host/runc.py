"""An ordinary OCI container per environment (Debian's `runc`): the control beside gVisor's
sandboxes, restore mode only.

The same bundle as a gVisor sandbox's (`gvisor._write_bundle`: a read-only root holding only
/usr, the Python installation and this package; tmpfs where the desktop writes; its own pid,
network, IPC, UTS and mount namespaces; a memory and a pids cgroup limit), run by runc instead of
runsc: the worker is the container's init, as root without any capability (runc grants only what
the bundle names, and it names none), with no seccomp filter and no user namespace, on the host's
kernel. runc cannot checkpoint without CRIU, so every environment is a fresh container whose
worker prepares the blank desktop and restores the task's state from its snapshot in its own
memory (`restore` mode); a fork is refused (ForkUnsupported), as for any restore-mode host.

Debian ships crun too, but crun 1.8.1 refuses to start a container where the machine mounts
cgroups in hybrid mode (v1 controllers beside a v2 tree), as this one does; runc 1.1.5 runs there.
"""

from __future__ import annotations

import shutil
import time
from functools import cache
from pathlib import Path

from envab.envs.host.gvisor import (
    MEMORY_LIMIT_BYTES,
    PIDS_LIMIT,
    Gvisor,
    Sandbox,
    SandboxUnavailable,
    container_runtime_problem,
    runtime_version,
)

RUNC = "runc"


def runc_problem() -> str | None:
    """Why runc containers cannot run on this machine, or None when they can."""
    return container_runtime_problem(RUNC, "its bundle sets cgroup limits")


@cache
def runc_version() -> str:
    return runtime_version(RUNC)


class Container(Sandbox):
    def audit(self) -> dict:
        memory = self.memory_bytes()
        return {
            "runtime": "runc",
            "runc": runc_version(),
            "network": "none",
            "root": "read-only",
            "user": "root without capabilities",
            "seccomp": None,
            "container": self.cid,
            "restored_from": None,  # a fresh container, its desktop made in it
            "memory_mib": None if memory is None else round(memory / 2**20, 1),
            "limits": {"memory_mib": MEMORY_LIMIT_BYTES // 2**20, "pids": PIDS_LIMIT},
            "age_s": round(time.monotonic() - self.started, 3),
        }


class Runc(Gvisor):
    """The host's containers: Gvisor's life cycle (launch, stop, reap, delete) with runc, and
    no checkpoint: a template is the way to prepare a container, applied to each new one."""

    name = "runc"

    def __init__(self, *args, **kwargs):
        self._prepares: dict[str, object] = {}
        super().__init__(*args, **kwargs)

    @staticmethod
    def _problem() -> str | None:
        return runc_problem()

    def _sandbox(self, cid, proc, channel, image) -> Container:
        return Container(cid, proc, channel, image)

    def _runsc(self, *args: str) -> list[str]:
        return [RUNC, "--root", str(self.root), *args]

    def template(self, key, prepare) -> str:
        """A name for `prepare`, which each new container of this key runs (no image)."""
        name = repr(key)
        self._prepares[name] = prepare
        return name

    def restore(self, image: str, n: int) -> list[tuple[Sandbox, dict]]:
        """n fresh containers, each prepared (`template`); each worker's hello."""
        out = []
        try:
            for _ in range(n):
                sandbox, hello = self.run()
                out.append((sandbox, hello))
                self._prepares[image](sandbox)
        except BaseException:
            for sandbox, _ in out:
                self.stop(sandbox, kill=True)
            raise
        return out

    def checkpoint(self, sandbox: Sandbox, name: str) -> str:
        raise SandboxUnavailable("runc containers cannot be checkpointed here (no CRIU)")

    def fork(self, parent: Sandbox, n: int):
        raise SandboxUnavailable("runc containers cannot fork: the host runs in restore mode")

    @staticmethod
    def discard(image: str) -> None:
        pass

    def close(self) -> None:
        super().close()
        shutil.rmtree(Path(self.workdir) / "images", ignore_errors=True)
