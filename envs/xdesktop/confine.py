"""Confine the current process before it runs code on untrusted input: the X desktop's checker
process (`envab.envs.xdesktop.checker`) calls these, in this order, on itself.

1. `no_new_privileges`: nothing it executes can gain privileges (setuid binaries, file
   capabilities), it cannot be traced or dumped by its uid's other processes.
2. `isolate` (while single-threaded: a namespace is a thread's): a network namespace of its own
   with only loopback up, so it reaches nothing outside itself, and a process namespace, so
   nothing it starts outlives it. Root unshares them directly, with a mount namespace in which
   the interpreter's folders stay reachable after the uid change; another uid unshares a user
   namespace with them, keeping its uid outside.
3. `drop` (after the modules it needs are imported): resource limits (`Limits`), then, when root,
   the unprivileged uid and gid with no supplementary groups, then no capabilities at all, and
   death with its parent.
4. `filter_calls`: a seccomp filter (`envab.envs.seccomp`) refusing what no checker needs and a
   compromised one would reach the kernel through: tracing, other processes' memory, mounts and
   new namespaces (an unprivileged uid may otherwise make a user namespace, and be root in it),
   BPF, keyrings, io_uring, userfaultfd, perf events, file handles, modules, the clock.
   Starting programs stays (desktop-env's document and media metrics run converters), and so do
   sockets (its network namespace holds only its own loopback, where the browser relay listens).

Each step raises `ConfinementError` naming what the kernel refused; the checker then refuses to
run (its host counts a failed check), never runs unconfined. The standard library only, and
libseccomp: libc's `unshare`, `prctl`, `mount` and `capset` through ctypes, `ioctl` for loopback.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import resource
import signal
import socket
import stat
import struct
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from envab.envs import seccomp

NOBODY = 65534  # nobody / nogroup
# The uids (and gids) a root host gives its checkers, one each while it runs (`checker_ids`), so
# that two checkers side by side are two users: neither can read or write the other's folder.
# Above any account a distribution makes, below the 2^31 some tools choke on.
CHECKER_IDS = range(2_000_000_000, 2_000_000_000 + 4096)

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = struct.Struct("16sh22x")  # struct ifreq: the name, then ifr_flags in a 24-byte union
_CAP_VERSION_3 = 0x20080522


@dataclass(frozen=True)
class Limits:
    """What the checker process may use. `uid`/`gid` apply when the host is root; a host that is
    not root keeps its own uid (it is unprivileged already). `deadline_s` is the host's total
    wait for a score; `cpu_s` the kernel's CPU limit, the same by default."""

    uid: int = NOBODY
    gid: int = NOBODY
    deadline_s: float = 300.0
    cpu_s: int = 300
    # Address space, not resident memory: desktop-env's getters import pandas, and its Writer
    # metrics (docs.py) import easyocr and so torch, whose CUDA build maps 3.9 GiB at import.
    memory_bytes: int = 8 * 2**30
    file_bytes: int = 64 * 2**20  # one file: the largest the environment's channel carries
    open_files: int = 256
    processes: int = 256  # the uid's processes and threads: the relay runs a thread a request
    # What the host relays for one evaluation, whatever the deadline leaves time for: the
    # checker's requests (files and browser turns; an idle browser stream asks 20 times a
    # second) and the environment's answers' bytes (a few files of up to file_bytes each, and the
    # browser's pages). Past either, the evaluation is invalid (`oversize`), not slow.
    requests: int = 65_536
    relayed_bytes: int = 512 * 2**20


class ConfinementError(RuntimeError):
    """The kernel refused a step of the confinement; the checker must not run."""


@contextlib.contextmanager
def checker_ids(folder: str | None = None):
    """A uid of `CHECKER_IDS` no other checker on this machine holds, held (a lock file of its
    own, flock'd) until the block ends: every process of every host takes its checkers' ids
    from the same folder, root's alone."""
    folder = folder or os.path.join(tempfile.gettempdir(), "envab-checker-ids")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if os.stat(folder).st_uid != os.geteuid() or os.stat(folder).st_mode & 0o077:
        raise ConfinementError(f"{folder}: not this host's own folder (mode 0700)")
    for uid in CHECKER_IDS:
        fd = os.open(os.path.join(folder, str(uid)), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # the lock goes with it
        return
    raise ConfinementError(f"every one of {len(CHECKER_IDS)} checker ids is in use")


@cache
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _ok(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise ConfinementError(f"{what}: {os.strerror(errno)}")


def _prctl(option: int, value: int, what: str) -> None:
    prctl = _libc().prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _ok(prctl(option, value, 0, 0, 0), what)


def no_new_privileges() -> None:
    _prctl(PR_SET_NO_NEW_PRIVS, 1, "prctl(PR_SET_NO_NEW_PRIVS)")
    _prctl(PR_SET_DUMPABLE, 0, "prctl(PR_SET_DUMPABLE)")


def isolate(home: str, keep: Iterable[str] = ()) -> None:
    """Fresh network, process and mount namespaces (and a user namespace where the host is not
    root): loopback only (a relay inside the process listens there); nothing the checker starts
    outlives it; a root of its own (`private_root`) holding the system's folders and the
    interpreter's read-only, its `home` and nothing else of the host's. The process forks into
    the new process namespace: the parent only waits and exits as its child did; the child, the
    namespace's first process (whose end takes every process it started with it, however they
    detach), returns. `keep`: more folders to show read-only (a test's entry file's)."""
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # the other threads would stay in the host's namespaces
        raise ConfinementError(f"unshare: {threads} threads; only a single thread moves")
    root = os.geteuid() == 0
    flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | (0 if root else CLONE_NEWUSER)
    uid, gid = os.getuid(), os.getgid()
    _ok(_libc().unshare(flags), "unshare(CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS)")
    if not root:  # its own ids map to themselves: files it makes in its root have an owner
        # /proc/self of a process that is not dumpable is root's: dumpable only for the maps
        _prctl(PR_SET_DUMPABLE, 1, "prctl(PR_SET_DUMPABLE)")
        try:
            for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                               ("gid_map", f"{gid} {gid} 1")):  # fmt: skip
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(line)
        except OSError as e:
            raise ConfinementError(f"user namespace map: {e.strerror}") from None
        finally:
            _prctl(PR_SET_DUMPABLE, 0, "prctl(PR_SET_DUMPABLE)")
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            name = b"lo"
            (_, flags) = _IFREQ.unpack(fcntl.ioctl(s, SIOCGIFFLAGS, _IFREQ.pack(name, 0)))
            fcntl.ioctl(s, SIOCSIFFLAGS, _IFREQ.pack(name, flags | IFF_UP))
    except OSError as e:
        raise ConfinementError(f"loopback up: {e.strerror}") from None
    private_root(home, _interpreter_folders() | {os.path.realpath(k) for k in keep})


def _interpreter_folders() -> set[str]:
    """The folders the interpreter imports from: its prefixes and path, every loaded module's
    folder, and an editable install's package folders (its finder's mapping), so that a module
    imported later (a metric's) is found."""
    folders = {p for p in sys.path if p}
    folders |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for module in list(sys.modules.values()):
        where = getattr(module, "__file__", None)
        if isinstance(where, str):
            folders.add(os.path.dirname(where))
        if module.__name__.startswith("__editable__") and hasattr(module, "MAPPING"):
            folders |= set(module.MAPPING.values())
    return {os.path.realpath(f) for f in folders if os.path.isdir(f)}


#: What a checker's root shows of the host's, read-only: the system's programs, libraries and
#: settings (the document metrics run converters). Nothing else of the host's: not its home,
#: its /tmp (other checkers' homes, the VMs' monitor sockets), the checkout's results and
#: receipts, /run or /var.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
MNT_DETACH = 2
# statvfs's flags of a mount, which a read-only remount in a user namespace must keep
MS_NOEXEC, MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 8, 1024, 2048, 1 << 21
_KEPT_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)


def private_root(home: str, keep: set[str]) -> None:
    """Make the checker's root a tmpfs of its own holding `SYSTEM` and `keep` read-only, `home`
    read-write, a fresh /proc of its process namespace, a /dev of the harmless devices and empty
    /tmp and /dev/shm, then pivot into it with the host's root detached: whatever code a task
    file's parser bug gives an attacker, it finds no file of the host's it was not shown (a host
    that is not root shares its uid with the checker, so hiding is what stands between them).
    Each folder keeps its path, so nothing the interpreter imports moves. Needs the mount
    namespace `isolate` made; ConfinementError where the kernel refuses a step."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing here reaches the host's mounts
    os.umask(0o022)  # the folders made on the way are for every uid to pass, whatever the host's
    new = os.path.join(home, ".root")
    os.mkdir(new, 0o755)
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    # first the empty folders, so that what is shown below them (a checkout under /tmp) stays
    for folder in ("/tmp", "/dev/shm"):
        os.makedirs(new + folder, 0o755, exist_ok=True)
        _mount("tmpfs", new + folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")
    shown = [p for p in SYSTEM if os.path.lexists(p)]
    shown += [k for k in sorted(keep) if not any(_within(k, s) for s in SYSTEM)]
    shown = [p for p in shown if not any(p != q and _within(p, q) for q in shown)]
    for path in shown:
        target = new + path
        if os.path.islink(path):  # a merged /usr's /bin -> usr/bin
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
            os.symlink(os.readlink(path), target)
            continue
        os.makedirs(target, 0o755, exist_ok=True)
        _mount(path, target, None, MS_BIND | MS_REC)
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _locked(path))
    os.makedirs(new + home, 0o755, exist_ok=True)
    _mount(home, new + home, None, MS_BIND)
    for device in DEVICES:
        open(f"{new}/dev/{device}", "w").close()
        _mount(f"/dev/{device}", f"{new}/dev/{device}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, f"{new}/dev/{name}")
    os.mkdir(new + "/proc", 0o555)
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _pivot(new)
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(home)
    for folder in sorted(keep):
        walk = "/"
        for part in folder.strip("/").split("/"):  # after the uid change too
            walk = os.path.join(walk, part)
            if not os.stat(walk).st_mode & stat.S_IXOTH:
                raise ConfinementError(f"{walk} stays closed to the checker's uid")


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _locked(path: str) -> int:
    """The mount flags of `path`'s mount that a remount must keep (a user namespace may not
    clear them)."""
    flags = os.statvfs(path).f_flag
    return sum(ms for st, ms in _KEPT_FLAGS if flags & st)


def _pivot(new: str) -> None:
    """pivot_root into `new`, the old root detached: the host's tree is gone from this mount
    namespace, not only out of sight."""
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise ConfinementError(f"pivot_root: no system call number for {os.uname().machine}")
    os.chdir(new)
    os.mkdir(".old", 0o700)
    syscall = _libc().syscall
    syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p]
    _ok(syscall(number, b".", b".old"), "pivot_root")
    os.chdir("/")
    umount = _libc().umount2
    umount.argtypes = [ctypes.c_char_p, ctypes.c_int]
    _ok(umount(b"/.old", MNT_DETACH), "umount /.old")
    os.rmdir("/.old")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data=None) -> None:
    mount = _libc().mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                      ctypes.c_char_p]  # fmt: skip
    encoded = [None if v is None else os.fsencode(v) for v in (source, target, fstype, data)]
    _ok(mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]), f"mount {target}")


def drop(limits: Limits) -> None:
    """Limits, then (when root) the unprivileged uid and gid, then no capabilities."""
    for what, value in (
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_CORE, 0),
    ):
        try:
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError) as e:
            raise ConfinementError(f"setrlimit({what}, {value}): {e}") from None
    if os.getuid() == 0:
        try:
            os.setgroups([])
            os.setresgid(limits.gid, limits.gid, limits.gid)
            os.setresuid(limits.uid, limits.uid, limits.uid)
        except OSError as e:
            raise ConfinementError(f"setuid {limits.uid}: {e.strerror}") from None
        if 0 in os.getresuid() or 0 in os.getresgid():
            raise ConfinementError("still root after setresuid")
    _no_capabilities()
    # A changed uid clears the parent-death signal, so it is set after: a checker whose host died
    # goes with it instead of waiting on a channel nobody reads.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(PR_SET_PDEATHSIG)")
    no_new_privileges()  # dumpable is reset by the uid change too


def _no_capabilities() -> None:
    """An empty capability set (a user namespace's root keeps a full one over its namespaces)."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    data = (Data * 2)()
    _ok(_libc().capset(ctypes.byref(Header(_CAP_VERSION_3, 0)), data), "capset")


def filter_calls() -> None:
    """The checker's seccomp filter (step 4): `seccomp.KERNEL`, in every thread, inherited by all
    it starts. After `drop`, which set no new privileges."""
    try:
        seccomp.load(seccomp.KERNEL, unix_sockets_only=False)
    except seccomp.FilterError as e:
        raise ConfinementError(str(e)) from None
