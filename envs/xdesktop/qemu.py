"""The X desktop as a QEMU guest: the very folder the gVisor sandboxes run as their root
(envs/xdesktop/image.py), as an ext4 disk with its own kernel, where systemd starts the same
in-environment server on a virtio-serial port. Both arms run the same files.

    python -m envab.envs.xdesktop.qemu [--size 1024x768] [--cache build/xdesktop] [--image full]

Two stages, cached beside the image by digest:
  disk  root.qcow2 (read-only, shared by every VM), vmlinuz and initrd.img, made from the image's
        folder; keyed by the image digest and this file.
  warm  boot once, wait for the server, `prepare` the display at the screen size, `savevm warm`
        into warm-<W>x<H>.qcow2; keyed by the disk, the size, the VM's memory and acceleration,
        the QEMU version and the VM's definition (a snapshot loads only into the same machine).

`QemuDesktops` gives the embedded host (`sandbox: qemu`, restore mode) its environments: each is
a running VM, reset by `loadvm warm` of its screen size's snapshot; a closed environment's VM
waits for the next create, a broken one is stopped. This arm cannot fork: a snapshot restore per
environment is what the QEMU arm is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from envab.envs import scratch
from envab.envs.channel import Channel
from envab.envs.memory import tree_pss_bytes
from envab.envs.qemu.accel import choose
from envab.envs.qemu.image import BuildError, make_disk, qemu_version
from envab.envs.qemu.tools import require
from envab.envs.qemu.vm import VM, VMDied, VMSpec
from envab.envs.xdesktop.apps import DEFAULT_IMAGE
from envab.envs.xdesktop.image import REPO, build_lock, ensure_desktop
from envab.errors import Refusal, refused
from envab.hashing import sha256_file, sha256_json
from envab.io import atomic_write_json

MEMORY_MIB = 1024  # X, a GTK editor and the server's Python, with room for the page cache
# The full image's applications (LibreOffice, Chromium, GIMP) each take hundreds of MiB more.
IMAGE_MEMORY_MIB = {"base": MEMORY_MIB, "full": 2048}
BOOT_TIMEOUT_S = 900.0  # a first boot under TCG, X and its fonts included


class Frames(Channel):
    """The server's channel (length-prefixed JSON frames) over the VM's virtio-serial socket."""

    def __init__(self, path: Path):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        super().__init__(sock)


@dataclass(frozen=True)
class Guest:
    """One screen size's warm snapshot and the machine it loads into."""

    spec: VMSpec
    warm: Path
    digest: str
    record: dict


def _spec(disk: Path, memory_mib: int, accel: str) -> VMSpec:
    return VMSpec(
        root=disk / "root.qcow2",
        kernel=disk / "vmlinuz",
        initrd=disk / "initrd.img",
        memory_mib=memory_mib,
        accel=accel,
    )


def ensure_guest(
    size: tuple[int, int],
    cache: Path = REPO / "build" / "xdesktop",
    memory_mib: int | None = None,
    accel: str = "auto",
    log=print,
    image: str = DEFAULT_IMAGE,
) -> Guest:
    """The warm snapshot of the X desktop (`image`: base or full) at `size`, building the
    image, the disk and the snapshot where they are not cached."""
    for tool in ("qemu-system-x86_64", "qemu-img", "mkfs.ext4"):
        require(tool)
    memory_mib = memory_mib or IMAGE_MEMORY_MIB[image]
    image = ensure_desktop(cache, log, image=image)
    cache = cache.resolve()
    disk_digest = sha256_json({"image": image.digest, "builder": sha256_file(Path(__file__))})
    disk = cache / "qemu" / disk_digest[:16]
    disk.parent.mkdir(parents=True, exist_ok=True)
    # Two processes that want the same guest at once (test workers, a workflow's jobs): one
    # builds the disk and the snapshot, the other waits and finds them built.
    with build_lock(disk.parent / f".lock-{disk_digest[:16]}", log):
        if not (disk / "disk.json").is_file():
            log(f"X desktop guest disk {disk_digest[:16]}: ext4 of the image (a minute)")
            t0 = time.monotonic()
            files = make_disk(image.rootfs, disk)
            built = {"digest": disk_digest, "image": image.digest, "files": files,
                     "build_s": round(time.monotonic() - t0, 1)}  # fmt: skip
            atomic_write_json(disk / "disk.json", built)
        chosen = choose(accel)
        spec = _spec(disk, memory_mib, chosen.mode)
        inputs = {"disk": disk_digest, "size": list(size), "memory_mib": memory_mib,
                  "accel": chosen.mode, "qemu": qemu_version(),
                  "vm": spec.definition()}  # fmt: skip
        digest = sha256_json(inputs)
        name = f"warm-{size[0]}x{size[1]}-{digest[:12]}"
        record_path = disk / f"{name}.json"
        warm = disk / f"{name}.qcow2"
        if not record_path.is_file():
            log(f"X desktop guest {name}: first boot under {chosen.mode} and savevm (minutes)")
            built = build_warm(spec, warm, size)
            atomic_write_json(record_path, {"digest": digest, "inputs": inputs, **built})
    record = {"digest": digest, "disk": disk_digest, "image": image.digest,
              "accel_reason": chosen.reason, **json.loads(record_path.read_text())}  # fmt: skip
    return Guest(spec, warm, digest, record)


def build_warm(spec: VMSpec, warm: Path, size: tuple[int, int]) -> dict:
    """Boot the guest once, prepare the display, and save the snapshot `warm` into `warm`."""
    scratch = warm.with_suffix(".partial")
    scratch.unlink(missing_ok=True)
    subprocess.run([require("qemu-img"), "create", "-q", "-f", "qcow2", str(scratch), "16M"],
                   check=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="envab-xdesktop-warm-") as tmp:
        vm = VM(spec, scratch, Path(tmp), channel=Frames)
        try:
            t0 = time.monotonic()
            vm.launch(loadvm=None)
            vm.agent.recv(
                timeout=BOOT_TIMEOUT_S, expect="started"
            )  # the server's first words: it is up
            boot_s = time.monotonic() - t0
            prepared = _ok(vm.agent.call(("prepare", tuple(size)), timeout=300))
            hello = _ok(vm.agent.call(("hello",), timeout=60))
            _ok(vm.agent.call(("http", "POST", "/execute", "application/json",
                               b'{"command": "sync; echo 3 > /proc/sys/vm/drop_caches", '
                               b'"shell": true}'), timeout=60))  # fmt: skip
            time.sleep(1.0)  # let the guest go idle
            t1 = time.monotonic()
            vm.savevm("warm")
            save_s = time.monotonic() - t1
        except (OSError, EOFError, TimeoutError, VMDied, RuntimeError) as e:
            raise BuildError(f"X desktop guest warm boot: {e} ({_console_tail(Path(tmp))})") from e
        finally:
            vm.quit()
    scratch.replace(warm)
    return {"boot_s": round(boot_s, 1), "savevm_s": round(save_s, 2), "size": list(size),
            "server_pid": prepared["pid"], "state_sha256": hello["state_sha256"]}  # fmt: skip


def _ok(reply: dict) -> dict:
    if "error" in reply:
        raise RuntimeError(f"the in-environment server: {reply['error']}")
    return reply


def _console_tail(run_dir: Path) -> str:
    path = run_dir / "console.log"
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return f"console: {lines[-1][:200]}" if lines else "console empty"


# --- the host's environments --------------------------------------------------------------------


@dataclass
class GuestVM:
    """One VM of the host: QEMU, its snapshot copy, and the server's channel."""

    vm: VM
    guest: Guest
    started: float = field(default_factory=time.monotonic)
    restored: float = field(default_factory=time.monotonic)

    @property
    def channel(self) -> Channel:
        return self.vm.agent

    @property
    def pid(self) -> int:
        return self.vm.proc.pid

    def audit(self) -> dict:
        memory = tree_pss_bytes(self.vm.proc.pid) if self.vm.alive() else None
        return {
            "runtime": "qemu",
            "qemu": self.guest.record["inputs"]["qemu"],  # the version the snapshot is bound to
            "accel": self.guest.spec.accel,
            "network": "none",
            "root": "read-only",
            "restored_from": self.guest.warm.name,
            "memory_mib": None if memory is None else round(memory / 2**20, 1),
            "age_s": round(time.monotonic() - self.restored, 3),
            "vm_age_s": round(time.monotonic() - self.started, 3),
        }


class QemuDesktops:
    """The host's QEMU VMs of the X desktop: the sandbox provider for `sandbox: qemu` (the
    same calls as envs/host/gvisor.py's `Gvisor`, restore mode only)."""

    def __init__(
        self,
        workdir: str | Path | None,
        timeout_s: float,
        cache: Path | None = None,
        image: str = DEFAULT_IMAGE,
    ):
        self.image = image  # which X desktop image the VMs boot (envs/xdesktop/apps.py)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or scratch.make("envab-qemu-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cache = cache or REPO / "build" / "xdesktop"
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._guests: dict[object, Guest] = {}
        self._idle: dict[str, list[GuestVM]] = {}  # warm snapshot -> VMs waiting for a create
        self._live: list[GuestVM] = []
        self._count = 0

    def probe(self) -> None:
        for tool in ("qemu-system-x86_64", "qemu-img"):
            require(tool)

    def template(self, key, prepare) -> str:
        """The warm snapshot for `key` (("size", (w, h))), built once and cached on disk; the
        server prepares its display while the snapshot is made, so `prepare` is not called."""
        with self._lock:
            if key not in self._guests:
                self._guests[key] = ensure_guest(
                    tuple(key[1]), self.cache, log=lambda m: None, image=self.image
                )
            return str(self._guests[key].warm)

    def restore(self, image: str, n: int) -> list[tuple[GuestVM, dict]]:
        if n != 1:
            raise RuntimeError("a QEMU guest cannot fork: one restore per environment")
        guest = next(g for g in self._guests.values() if str(g.warm) == image)
        with self._lock:
            waiting = self._idle.get(image, [])
            machine = waiting.pop() if waiting else None
        try:
            if machine is not None:
                try:
                    machine.vm.loadvm("warm", timeout=self.timeout_s)
                    machine.restored = time.monotonic()
                except VMDied:  # it died while idle: a killed guest powers its machine off
                    self.stop(machine, kill=True)
                    machine = None
            if machine is None:
                machine = self._launch(guest)
            hello = _ok(machine.channel.call(("hello",), timeout=self.timeout_s))
        except Exception:
            if machine is not None:
                self.stop(machine, kill=True)
            raise
        return [(machine, hello)]

    def _launch(self, guest: Guest) -> GuestVM:
        with self._lock:
            self._count += 1
            run_dir = self.workdir / f"vm{self._count}"
        run_dir.mkdir(parents=True, exist_ok=True)
        warm = run_dir / "warm.qcow2"
        shutil.copyfile(guest.warm, warm)  # QEMU writes to the image it loads a snapshot from
        vm = VM(guest.spec, warm, run_dir, channel=Frames)
        vm.launch(loadvm="warm")
        machine = GuestVM(vm, guest)
        with self._lock:
            self._live.append(machine)
        return machine

    def stop(self, machine: GuestVM, kill: bool) -> None:
        """A closed environment's VM waits for the next create; a killed one (or one whose QEMU
        is gone) is stopped and its folder removed."""
        if not kill and machine.vm.alive():
            with self._lock:
                self._idle.setdefault(str(machine.guest.warm), []).append(machine)
            return
        machine.vm.stop()
        with self._lock, contextlib.suppress(ValueError):
            self._live.remove(machine)
        shutil.rmtree(machine.vm.run_dir, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            live, self._live, self._idle = list(self._live), [], {}
        for machine in live:
            machine.vm.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1024x768", help="the screen, WxH")
    p.add_argument("--cache", type=Path, default=REPO / "build" / "xdesktop")
    p.add_argument("--memory", type=int, help="MiB (default: the image's, IMAGE_MEMORY_MIB)")
    p.add_argument("--accel", default="auto", choices=("auto", "kvm", "tcg"))
    p.add_argument("--image", choices=sorted(IMAGE_MEMORY_MIB), default=DEFAULT_IMAGE)
    args = p.parse_args(argv)
    size = tuple(int(v) for v in args.size.split("x"))
    try:
        guest = ensure_guest(size, args.cache, args.memory, args.accel,
                             log=lambda m: print(m, file=sys.stderr, flush=True),
                             image=args.image)  # fmt: skip
    except (Refusal, BuildError, subprocess.SubprocessError, OSError) as e:
        return refused(e, prefix="envab.envs.xdesktop.qemu", code=1)
    print(f"{guest.digest[:16]} {guest.warm}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
