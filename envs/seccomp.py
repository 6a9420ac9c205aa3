"""Seccomp filters compiled by libseccomp (Debian's libseccomp2, through ctypes): a deny list over
an allow-all default, loaded on the calling process and inherited by all it forks.

Two processes load one: the fork host's zygote in its namespace sandbox
(`envab.envs.host.namespaces`) and the X desktop's checker (`envab.envs.xdesktop.confine`), each
with its own list. A deny list, because Python and the libraries a metric imports need too much of
the rest to list it safely. Each refused call answers EPERM; `clone3` answers ENOSYS, so the C
library falls back to `clone`, whose flags a filter can read (clone3's are behind a pointer).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from collections.abc import Iterable
from functools import cache

# What no sandboxed worker of this project needs, whatever its job: other processes' memory,
# the file system's and the kernel's own facilities, the clock. Each user adds its own.
KERNEL = (
    # other processes: tracing them, reading or writing their memory
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # the file system and namespaces: the sandbox's are set (open_by_handle_at reads any file of
    # a mount by its handle, the classic container escape)
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "mount_setattr",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "open_by_handle_at", "name_to_handle_at",
    # the kernel's own facilities, each a large attack surface
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "syslog",
    "acct", "quotactl", "iopl", "ioperm", "uselib", "vhangup", "sethostname", "setdomainname",
    # the clock
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
)  # fmt: skip
# A fork, but never into new namespaces: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID,
# NEWNET, NEWTIME.
CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
             0x40000000, 0x00000080)  # fmt: skip

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_NE, _SCMP_CMP_MASKED_EQ = 1, 7
_SCMP_FLTATR_CTL_TSYNC = 4


class FilterError(RuntimeError):
    """libseccomp or the kernel refused the filter; the process must not go on unfiltered."""


def _scmp_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):  # struct scmp_arg_cmp
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]  # fmt: skip


@cache
def libseccomp():
    """libseccomp (Debian's libseccomp2); inside a namespace sandbox it is found through the
    bound /etc/ld.so.cache. Raises OSError where it is not installed."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]  # fmt: skip
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    return lib


def load(denied: Iterable[str], *, unix_sockets_only: bool) -> None:
    """Refuse `denied` (EPERM), clone into new namespaces (EPERM), clone3 (ENOSYS) and, with
    `unix_sockets_only`, every socket but a Unix one, in every thread of this process and all it
    starts from now on. The process must already have no new privileges (or CAP_SYS_ADMIN)."""
    try:
        lib = libseccomp()
    except OSError as e:
        raise FilterError(f"libseccomp.so.2: {e} (install Debian's libseccomp2)") from None
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise FilterError("seccomp_init failed")
    try:
        # Every thread of the process, not only the caller: an import may have started some.
        code = lib.seccomp_attr_set(ctx, _SCMP_FLTATR_CTL_TSYNC, 1)
        if code != 0:
            raise FilterError(f"seccomp thread sync: {os.strerror(-code)}")

        def rule(name: str, action: int, *compare: _ArgCmp) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # a call this libseccomp does not know: this kernel has none to refuse
                return
            array = (_ArgCmp * len(compare))(*compare) if compare else None
            code = lib.seccomp_rule_add_array(ctx, action, number, len(compare), array)
            if code != 0:
                raise FilterError(f"seccomp rule {name}: {os.strerror(-code)}")

        for name in denied:
            rule(name, _scmp_errno(errno.EPERM))
        if unix_sockets_only:
            rule("socket", _scmp_errno(errno.EPERM), _ArgCmp(0, _SCMP_CMP_NE, socket.AF_UNIX, 0))
        for flag in CLONE_NEW:
            rule("clone", _scmp_errno(errno.EPERM), _ArgCmp(0, _SCMP_CMP_MASKED_EQ, flag, flag))
        rule("clone3", _scmp_errno(errno.ENOSYS))
        code = lib.seccomp_load(ctx)
        if code != 0:
            raise FilterError(f"seccomp_load: {os.strerror(-code)}")
    finally:
        lib.seccomp_release(ctx)
