"""Sandboxes of Linux namespaces and a seccomp filter for the host's workers: the zygote runs
inside one, and every environment is an `os.fork` of it (or of another environment), so each
inherits the sandbox at the cost of a fork: a fork stays a copy-on-write copy of the prepared
process, milliseconds, where a gVisor fork is a checkpoint and a restore.

The sandbox is made by bubblewrap (Debian's `bwrap`, the tool Flatpak's sandboxes are made with),
run by the host (as root, or as an ordinary user) around the zygote:

- its own process, network, IPC, UTS (and, where the kernel has them, cgroup) namespaces: no
  process of the host is visible; the network is a loopback of its own, so nothing on the host's
  loopback (the host's own HTTP port included) or beyond is reachable;
- its own mount namespace: a read-only empty root holding only what the worker imports (the
  system's /usr, the Python installation and this package: the same binds as a gVisor sandbox's,
  `gvisor._root_mounts`), a bounded tmpfs at /tmp and /dev/shm (writable, in memory), bwrap's
  minimal /dev and a /proc of its own process namespace;
- uid and gid nobody, no capabilities, no new privileges and not dumpable (a same-uid process
  cannot trace it or read its memory). Run by root, bwrap makes no user namespace (it would map
  the sandbox's uid to root's): the zygote drops to nobody itself, with no supplementary groups
  (`envab.envs.xdesktop.confine.drop`, as the X desktop's checker does). Run by an ordinary
  user, bwrap makes a user namespace whose only id is nobody, mapped onto the user's own
  (`USER_NAMESPACE`): no root on the host is needed, where the kernel lets an ordinary user make
  user namespaces (`namespaces_problem` names the setting that forbids it). The user's
  supplementary groups stay on the sandbox's processes there (the kernel lets no one drop them in
  a user namespace; they show as nobody's group); what they could open is outside the sandbox's
  root, which holds only /usr, Python and this package;
- resource limits (`LIMITS`, per process, inherited by every fork; the CPU limit is set anew in
  each environment, `ENV_CPU_S`, so the zygote's own use never counts against it);
- a seccomp filter (`DENIED`, compiled by libseccomp, Debian's libseccomp2, through ctypes) that
  refuses with EPERM what a Pillow environment never needs: starting a program, tracing or
  signalling another process, sockets other than Unix ones, mounts and new namespaces, kernel
  modules, BPF, keyrings, io_uring, the clock.

What it does not isolate: the environments of one host share the sandbox's kernel (the host's:
a kernel bug is an escape, which gVisor's own kernel guards against), its uid, its /tmp and its
process namespace (one may see another's pid, but not trace, signal or read it), and the sandbox
ends with its zygote (bwrap's init takes every process of the namespace with it). The real X
desktop does not run here: it starts programs (Xvfb, its applications), which the filter refuses.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from envab.envs import seccomp
from envab.envs.host.gvisor import _python_path, _root_mounts
from envab.envs.xdesktop.confine import NOBODY, ConfinementError, Limits, drop

BWRAP = "bwrap"
TMPFS_BYTES = 256 * 2**20  # each writable folder, in memory: a `dd` into /tmp ends with ENOSPC
# Per process (each environment is one), inherited by every fork. The address space matches a
# gVisor sandbox's memory limit; processes count every process and thread of uid nobody (the
# kernel counts per uid), so it is sized for a host's 512 environments with room to spare.
LIMITS = Limits(
    uid=NOBODY,
    gid=NOBODY,
    cpu_s=resource.RLIM_INFINITY,  # the zygote forks for the whole run; environments get ENV_CPU_S
    memory_bytes=2 * 2**30,
    file_bytes=64 * 2**20,
    open_files=256,
    processes=4096,
)
ENV_CPU_S = 600  # one environment's CPU seconds (a step takes milliseconds)

# What a Pillow environment never needs, refused with EPERM: starting programs (the Pillow desktop
# runs none), signalling other processes (the environment's own death is os._exit; the host
# signals it from outside, where this filter does not apply), and what no sandboxed worker needs
# (`seccomp.KERNEL`: tracing, mounts and namespaces, the kernel's facilities, the clock).
DENIED = (
    "execve", "execveat",
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open",
    "pidfd_send_signal",
    *seccomp.KERNEL,
)  # fmt: skip


@cache
def namespaces_problem() -> str | None:
    """Why the namespace sandbox cannot run on this machine, or None when it can (one trial
    sandbox with the same namespaces, a few milliseconds, once per process)."""
    if shutil.which(BWRAP) is None:
        return f"{BWRAP} not found: install Debian's bubblewrap (apt-get install bubblewrap)"
    try:
        seccomp.libseccomp()
    except OSError:
        return "libseccomp.so.2 not found: install Debian's libseccomp2"
    trial = subprocess.run(
        [BWRAP, *_namespaces(), "--ro-bind", "/", "/", "--", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if trial.returncode == 0:
        return None
    why = f"{BWRAP} cannot make namespaces here: {trial.stderr.strip()[-200:]}"
    if os.geteuid() != 0:
        return f"{why}; {user_namespaces_setting()}"
    return why


# The kernel settings that can forbid an ordinary user's user namespaces, each with the value that
# forbids them and the value that allows them: Debian's switch, the upstream limit, Ubuntu's
# AppArmor restriction.
USER_NAMESPACE_SETTINGS = (
    ("kernel.unprivileged_userns_clone", "0", "1"),
    ("user.max_user_namespaces", "0", "15000"),
    ("kernel.apparmor_restrict_unprivileged_userns", "1", "0"),
)


def user_namespaces_setting(sysctl: Path = Path("/proc/sys")) -> str:
    """What forbids an ordinary user's user namespaces here, read from `sysctl`, with the
    setting that allows them (or, where none of them forbids it, the settings to look at)."""
    blocking = []
    for name, forbidding, allowing in USER_NAMESPACE_SETTINGS:
        try:
            value = sysctl.joinpath(*name.split(".")).read_text().strip()
        except OSError:
            continue  # this kernel has no such setting
        if value == forbidding:
            blocking.append(f"{name} = {value} (as root: sysctl -w {name}={allowing})")
    if blocking:
        return "an ordinary user may not make user namespaces here: " + "; ".join(blocking)
    names = ", ".join(name for name, _, _ in USER_NAMESPACE_SETTINGS)
    return f"it needs an ordinary user's user namespaces (look at {names}), or root"


_NAMESPACES = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
               "--unshare-cgroup-try", "--die-with-parent", "--new-session")  # fmt: skip
# Run by an ordinary user: a user namespace whose one uid and gid, nobody, is the user's own.
USER_NAMESPACE = ("--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY))


def _namespaces() -> tuple[str, ...]:
    """bwrap's namespace options: root's sandbox has no user namespace (its zygote drops to
    nobody itself); an ordinary user's is a user namespace mapping nobody onto the user."""
    return _NAMESPACES if os.geteuid() == 0 else (*_NAMESPACES, *USER_NAMESPACE)


def bwrap_argv(worker_argv: Sequence[str]) -> list[str]:
    """The command that runs `worker_argv` (which must confine itself: `confine_zygote`) inside
    a fresh sandbox. Descriptors the host passes stay open in it (the zygote's channel)."""
    binds, links = _root_mounts()
    argv = [BWRAP, *_namespaces(), "--hostname", "env", "--clearenv"]
    for name, value in (
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONPATH", _python_path()),
    ):
        argv += ["--setenv", name, value]
    if os.geteuid() == 0:
        # Root's uid change is the worker's own (bwrap only changes uids in a user namespace);
        # it needs these two capabilities, which it gives up with the uid.
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    # The writable folders before the binds: a bind below one of them (a checkout or its
    # environment under /tmp) goes on top of the tmpfs instead of under it, hidden.
    writable = ("/tmp", "/dev/shm")
    for d in writable:
        argv += ["--perms", "1777", "--size", str(TMPFS_BYTES), "--tmpfs", d]
    destinations = [b["destination"] for b in binds]
    above: set[str] = set()
    for d in destinations:  # folders above a bind, made enterable (bwrap copies /root's 0700)
        parts = d.strip("/").split("/")
        above |= {"/" + "/".join(parts[:i]) for i in range(1, len(parts))}
    for d in sorted(above - set(destinations) - set(writable) - {"/dev"}):
        argv += ["--perms", "0755", "--dir", d]
    for b in binds:
        argv += ["--ro-bind", b["source"], b["destination"]]
    for name, target in links:
        argv += ["--symlink", target, f"/{name}"]
    # the loader's cache, alone in /etc (it finds libseccomp)
    argv += ["--perms", "0755", "--dir", "/etc"]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    argv += ["--remount-ro", "/", "--chdir", "/tmp", "--", *worker_argv]
    return argv


def confine_zygote() -> None:
    """Called by the zygote inside its sandbox, after its imports and before it serves: uid
    nobody, no capabilities, the limits, no new privileges, then the seccomp filter. Raises
    ConfinementError naming the step the kernel refused; the zygote must not serve then."""
    drop(LIMITS)
    load_filter()


def confine_environment() -> None:
    """Called in each environment the zygote forks, before it serves: the CPU limit of one
    environment (a few system calls; everything else is inherited)."""
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (ENV_CPU_S, ENV_CPU_S))
    except (ValueError, OSError) as e:
        raise ConfinementError(f"setrlimit(RLIMIT_CPU, {ENV_CPU_S}): {e}") from None


def load_filter() -> None:
    """The seccomp filter (`DENIED`, sockets other than AF_UNIX, clone into new namespaces,
    clone3 answered ENOSYS so the C library falls back to clone, whose flags it can check),
    loaded on this process and everything it forks from now on."""
    try:
        seccomp.load(DENIED, unix_sockets_only=True)
    except seccomp.FilterError as e:
        raise ConfinementError(str(e)) from None


def host_pid(sandbox_pid: int, inner_pid: int) -> int | None:
    """The host's pid of the process whose pid in the sandbox is `inner_pid`, among the
    processes below `sandbox_pid` (bwrap's), or None when it is gone. A worker knows only its
    pid in the sandbox; the host needs its own to kill a wedged one."""
    todo = [sandbox_pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                pids = line.split()[1:] if line.startswith("NSpid:") else []
                if len(pids) > 1 and int(pids[-1]) == inner_pid:  # in the sandbox's namespace
                    return p
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    children = Path(f"/proc/{p}/task/{tid}/children").read_text()
                    todo += [int(k) for k in children.split()]
    return None


@cache
def bwrap_version() -> str:
    out = subprocess.run([BWRAP, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def audit() -> dict:
    """What a verdict's audit says of the sandbox an environment runs in."""
    return {
        "runtime": "namespaces",
        "bwrap": bwrap_version(),
        "namespaces": ["pid", "net", "ipc", "uts", "mount", "cgroup where the kernel has it"],
        "network": "none",
        "root": "read-only",
        "uid": LIMITS.uid,
        "seccomp": "deny list",
        "limits": {
            "memory_mib": LIMITS.memory_bytes // 2**20,
            "cpu_s": ENV_CPU_S,
            "tmpfs_mib": TMPFS_BYTES // 2**20,
            "processes_of_uid": LIMITS.processes,
        },
    }


def launch_problem(proc: subprocess.Popen) -> str:
    """One line for a zygote that did not start in its sandbox."""
    code = proc.poll()
    return (
        f"the worker did not start in its namespace sandbox (exit {code}); its error is above"
        if code is not None
        else "the worker did not greet the host from its namespace sandbox"
    )
