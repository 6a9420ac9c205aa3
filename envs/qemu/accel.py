"""Hardware KVM or software emulation (TCG): part of what this arm is, so it is recorded.

KVM only where the processor advertises virtualisation (`vmx`/`svm` in /proc/cpuinfo) *and*
/dev/kvm answers. A /dev/kvm without those flags is a software nested mode under which a stock
guest kernel crawls; TCG is faster there.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass

KVM_GET_API_VERSION = 0xAE00
KVM_API_VERSION = 12
MODES = ("auto", "kvm", "tcg")


@dataclass(frozen=True)
class Acceleration:
    mode: str  # "kvm" | "tcg"
    reason: str


def cpu_flags(cpuinfo: str) -> set[str]:
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return flags


def kvm_answers(path: str = "/dev/kvm") -> bool:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fcntl.ioctl(fd, KVM_GET_API_VERSION) == KVM_API_VERSION
    except OSError:
        return False
    finally:
        os.close(fd)


def detect(cpuinfo: str, kvm_ok: bool) -> Acceleration:
    """What `auto` means on a machine with this /proc/cpuinfo and this /dev/kvm."""
    hardware = cpu_flags(cpuinfo) & {"vmx", "svm"}
    if hardware and kvm_ok:
        return Acceleration(
            "kvm", f"hardware virtualisation ({', '.join(sorted(hardware))}) and a working /dev/kvm"
        )
    if not hardware:
        return Acceleration(
            "tcg",
            "no vmx/svm in /proc/cpuinfo"
            + (" (a /dev/kvm exists but is not hardware KVM)" if kvm_ok else ""),
        )
    return Acceleration("tcg", "vmx/svm present but /dev/kvm does not answer")


def choose(mode: str = "auto") -> Acceleration:
    """The acceleration for `mode`; `kvm` on a machine without it is an error, not a fallback."""
    if mode not in MODES:
        raise ValueError(f"acceleration must be one of {', '.join(MODES)}, got {mode!r}")
    with open("/proc/cpuinfo") as f:
        found = detect(f.read(), kvm_answers())
    if mode == "auto":
        return found
    if mode == "kvm" and found.mode != "kvm":
        raise ValueError(f"acceleration kvm was asked for, but {found.reason}")
    return Acceleration(mode, "asked for in the configuration")
