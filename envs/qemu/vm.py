"""One QEMU virtual machine: its process, its QMP monitor and its two guest channels.

The desktop agent's channel (virtio-serial, JSON lines) carries set-up, action frames and state
read-back; qemu-guest-agent's (`guest-sync`) shows the guest's OS answers after a restore.

The guest's root disk is shared and read-only; a small per-VM qcow2 that the guest never sees
(a `-blockdev` with no device) holds the internal snapshot `warm`: QEMU keeps vmstate only on
writable images, and a read-only root is never changed by a restore. Screens come from QMP
`screendump` (PPM), input from QMP `input-send-event` into a virtio tablet and keyboard.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from PIL import Image
from qemu.qmp import QMPError
from qemu.qmp.legacy import QEMUMonitorProtocol
from qemu.qmp.protocol import ConnectError

from envab.envs.lifetime import start_child
from envab.envs.qemu.tools import require

AGENT_PORT = "org.envab.desktop.0"
QGA_PORT = "org.qemu.guest_agent.0"
FB_SIZE = (640, 480)  # the virtual display; the desktop is drawn at its top-left corner
KERNEL_ARGS = (
    "root=/dev/vda ro rootfstype=ext4 console=ttyS0 quiet loglevel=3 "
    "vt.global_cursor_default=0 init_on_free=1 mitigations=off systemd.show_status=0 "
    "systemd.service_watchdogs=0"
)
# Under TCG the guest keeps time by the HPET, not the TSC: TCG reads the TSC from the host and a
# restore does not turn it back, so each restored guest saw every second since its VM launched
# pass at once. Past three minutes systemd took journald for hung (its WatchdogSec) and restarted
# it after every restore, ~1 s of CPU, and the rest of the guest's catch-up grew with the VM's
# age: a GRPO step on this arm doubled within minutes. QEMU restores the HPET's counter with the
# snapshot, so the restored guest's clock reads the snapshot's time. Under KVM the TSC and
# kvm-clock are restored with the snapshot already. Service watchdogs are off either way: no
# service of a restored guest has pinged since the snapshot was saved.
TCG_CLOCK_ARGS = "clocksource=hpet tsc=unstable"


def kernel_args(accel: str) -> str:
    return f"{KERNEL_ARGS} {TCG_CLOCK_ARGS}" if accel == "tcg" else KERNEL_ARGS


LAUNCH_TIMEOUT_S = 60.0
# QEMU's own seccomp filter: the process that runs the guest's (untrusted) code cannot start
# programs, raise its privileges, change its scheduling or call obsolete system calls. It stays
# root: `-runas` would drop it to an unprivileged user, but a change of credentials clears the
# parent-death signal that takes a VM down with a job killed outright (envs/lifetime.py;
# tests/test_qemu.py::test_a_killed_job_takes_its_vms_with_it fails with it). This shapes the
# host process, not the VM, so it stays out of VMSpec.definition (what a snapshot is bound to).
HOST_SANDBOX = [
    "-sandbox",
    "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
]
MONITOR_TIMEOUT_S = 120.0  # savevm and loadvm included


class AgentError(RuntimeError):
    """The desktop agent answered with an error (its message is the agent's)."""


class AgentTimeout(TimeoutError):
    """The desktop agent did not answer in time."""


class VMDied(RuntimeError):
    """The QEMU process exited or its monitor or channel closed."""


@dataclass(frozen=True)
class VMSpec:
    """What makes two VMs interchangeable: a snapshot saved by one loads in the other."""

    root: Path
    kernel: Path
    initrd: Path
    memory_mib: int  # no defaults: a VM is always made from a guest record's memory and accel
    accel: str  # kvm or tcg, as chosen for this machine (never "auto")

    def definition(self) -> list[str]:
        """The QEMU command line with neutral paths: what a warm snapshot is bound to."""
        args = self.args(Path("warm.qcow2"), Path("run"))
        return [
            "qemu-system-x86_64",
            *(
                a.replace(str(self.root), "root.qcow2")
                .replace(str(self.kernel), "vmlinuz")
                .replace(str(self.initrd), "initrd.img")
                for a in args[1:]
            ),
        ]

    def args(self, warm: Path, run_dir: Path) -> list[str]:
        qemu = require("qemu-system-x86_64")
        xres, yres = FB_SIZE
        return [
            qemu,
            "-name",
            run_dir.name,
            "-nodefaults",
            "-no-user-config",
            "-machine",
            f"pc,accel={self.accel}",
            "-smp",
            "1",
            "-m",
            str(self.memory_mib),
            "-display",
            "none",
            "-device",
            f"VGA,xres={xres},yres={yres}",
            "-kernel",
            str(self.kernel),
            "-initrd",
            str(self.initrd),
            "-append",
            kernel_args(self.accel),
            "-drive",
            f"file={self.root},if=none,id=root,format=qcow2,readonly=on",
            "-device",
            "virtio-blk-pci,drive=root",
            "-blockdev",
            f"driver=qcow2,node-name=warm,file.driver=file,file.filename={warm}",
            "-device",
            "virtio-tablet-pci",
            "-device",
            "virtio-keyboard-pci",
            "-device",
            "virtio-serial-pci",
            "-chardev",
            f"socket,id=desk,path={run_dir / 'agent.sock'},server=on,wait=off",
            "-device",
            f"virtserialport,chardev=desk,name={AGENT_PORT}",
            "-chardev",
            f"socket,id=qga,path={run_dir / 'qga.sock'},server=on,wait=off",
            "-device",
            f"virtserialport,chardev=qga,name={QGA_PORT}",
            "-qmp",
            f"unix:{run_dir / 'qmp.sock'},server=on,wait=off",
            "-serial",
            f"file:{run_dir / 'console.log'}",
        ]


class LineChannel:
    """JSON objects, one per line, over a unix socket to a virtio-serial port."""

    def __init__(self, path: Path, what: str):
        self.what = what
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(str(path))
        except OSError:
            self.sock.close()
            raise
        self.buffer = b""
        self.next_id = 0

    def send(self, message: dict) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self, wanted, deadline: float, waiting_for: str) -> dict:
        """The first object for which `wanted(obj)` holds; older replies are dropped."""
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                try:  # 0xFF is qemu-ga's sync delimiter; a cut line is left over from a restore
                    reply = json.loads(line.replace(b"\xff", b""))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    continue
                if isinstance(reply, dict) and wanted(reply):
                    return reply
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgentTimeout(f"{self.what} did not answer {waiting_for} in time")
            if select.select([self.sock], [], [], left)[0]:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise VMDied(f"{self.what} channel closed")
                self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


class AgentChannel(LineChannel):
    """The desktop agent's requests and replies, matched by id."""

    def __init__(self, path: Path):
        super().__init__(path, "desktop agent")

    def call(self, op: str, timeout: float, **fields) -> dict:
        self.next_id += 1
        rid = self.next_id
        self.send({"id": rid, "op": op, **fields})
        reply = self.receive(lambda r: r.get("id") == rid, time.monotonic() + timeout, op)
        if "error" in reply:
            raise AgentError(reply["error"])
        return reply


class GuestAgentChannel(LineChannel):
    """qemu-guest-agent: only `guest-sync`, which proves the guest's OS answers."""

    def __init__(self, path: Path):
        super().__init__(path, "qemu-guest-agent")

    def sync(self, timeout: float) -> None:
        token = int.from_bytes(os.urandom(4), "big")
        self.send({"execute": "guest-sync", "arguments": {"id": token}})
        self.receive(lambda r: r.get("return") == token, time.monotonic() + timeout, "guest-sync")


class VM:
    """A running QEMU process restored from `warm`, with its monitor and agent channel."""

    def __init__(self, spec: VMSpec, warm: Path, run_dir: Path, channel=None):
        self.spec, self.warm, self.run_dir = spec, warm, run_dir
        # What speaks on the desktop's port: the Pillow desktop agent's JSON lines by default,
        # or another protocol's channel class, made from the socket's path.
        self.channel = channel or AgentChannel
        self.proc: subprocess.Popen | None = None
        self.qmp: QEMUMonitorProtocol | None = None
        self.agent = None
        self.guest_agent: GuestAgentChannel | None = None

    def launch(self, loadvm: str | None) -> None:
        """Start QEMU (paused on `loadvm` when given) and connect the monitor and the agent."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        remove_sockets(self.run_dir)  # a previous QEMU's sockets would look like ours
        args = self.spec.args(self.warm, self.run_dir) + HOST_SANDBOX
        if loadvm:
            args += ["-loadvm", loadvm]
        log = open(self.run_dir / "qemu.log", "ab")  # noqa: SIM115 - lives as long as QEMU
        # Started on the one thread that lives as long as this process: the VM dies with the job.
        self.proc = start_child(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        paths = [self.run_dir / name for name in SOCKETS]
        while not all(p.exists() for p in paths):
            if self.proc.poll() is not None:
                raise VMDied(f"qemu exited with {self.proc.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise VMDied(f"qemu sockets not up after {LAUNCH_TIMEOUT_S:.0f} s")
            time.sleep(0.02)
        self.qmp = self._when_listening(deadline, self._monitor)
        self.agent = self._when_listening(deadline, self.channel, self.run_dir / "agent.sock")
        self.guest_agent = self._when_listening(
            deadline, GuestAgentChannel, self.run_dir / "qga.sock"
        )

    def _monitor(self) -> QEMUMonitorProtocol:
        qmp = QEMUMonitorProtocol(str(self.run_dir / "qmp.sock"))
        try:
            qmp.connect()
        except ConnectError as e:
            if isinstance(e.exc, ConnectionRefusedError):
                raise e.exc from e  # not listening yet: _when_listening tries again
            raise
        return qmp

    def _when_listening(self, deadline: float, connect, *args):
        """`connect(*args)`, again while the socket refuses. QEMU binds a socket (the file
        appears) before it listens on it, and on a loaded host a connection in between is
        refused: an embedded-default run died so, starting its 17th VM."""
        while True:
            try:
                return connect(*args)
            except ConnectionRefusedError:
                if self.proc.poll() is not None:
                    raise VMDied(
                        f"qemu exited with {self.proc.returncode}: {self._log_tail()}"
                    ) from None
                if time.monotonic() > deadline:
                    raise VMDied(
                        f"qemu sockets not listening after {LAUNCH_TIMEOUT_S:.0f} s"
                    ) from None
                time.sleep(0.02)

    # --- monitor ----------------------------------------------------------------------------

    def command(self, name: str, timeout: float = MONITOR_TIMEOUT_S, **args):
        if self.qmp is None or not self.alive():
            raise VMDied("qemu is not running")
        try:
            self.qmp.settimeout(timeout)
            return self.qmp.cmd(name, **args)
        except TimeoutError:
            raise AgentTimeout(f"monitor: {name} took over {timeout:.1f} s") from None
        except (OSError, EOFError, QMPError) as e:
            raise VMDied(f"monitor: {name}: {e}") from None

    def hmp(self, line: str, timeout: float = MONITOR_TIMEOUT_S) -> None:
        """A monitor command whose error comes back as text (savevm, loadvm)."""
        out = self.command("human-monitor-command", timeout, **{"command-line": line})
        if isinstance(out, str) and out.strip():
            raise VMDied(f"{line}: {out.strip().splitlines()[0]}")

    def loadvm(self, tag: str = "warm", timeout: float = MONITOR_TIMEOUT_S) -> None:
        self.hmp(f"loadvm {tag}", timeout)

    def savevm(self, tag: str = "warm") -> None:
        self.hmp(f"savevm {tag}")

    def screendump(self, timeout: float = MONITOR_TIMEOUT_S) -> Image.Image:
        path = self.run_dir / "screen.ppm"
        self.command("screendump", timeout, filename=str(path))
        with Image.open(path) as image:
            image.load()
            return image

    def send_input(self, events: list[dict], timeout: float = MONITOR_TIMEOUT_S) -> None:
        self.command("input-send-event", timeout, events=events)

    def guest_sync(self, timeout: float) -> None:
        """qemu-guest-agent answers: the guest's OS runs (not only its desktop agent)."""
        if self.guest_agent is None:
            raise VMDied("no guest agent channel")
        self.guest_agent.sync(timeout)

    def call(self, op: str, timeout: float, **fields) -> dict:
        if self.agent is None:
            raise VMDied("no agent channel")
        return self.agent.call(op, timeout, **fields)

    # --- life ------------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Quit QEMU (hard after a short grace); closing twice is harmless."""
        for closer in (self.agent, self.guest_agent, self.qmp):
            if closer is not None:
                # A QEMU that has already exited (after `quit`) ends its QMP stream with EOF
                # while the client disconnects: nothing is left to close.
                with contextlib.suppress(OSError, EOFError, QMPError):
                    closer.close()
        self.agent = self.guest_agent = self.qmp = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def quit(self) -> None:
        """Ask QEMU to quit cleanly (after savevm, so the image is closed properly)."""
        with contextlib.suppress(VMDied):
            self.command("quit")
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        self.stop()

    def _log_tail(self) -> str:
        path = self.run_dir / "qemu.log"
        lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return lines[-1] if lines else "no output"


SOCKETS = ("qmp.sock", "agent.sock", "qga.sock")


def remove_sockets(run_dir: Path) -> None:
    for name in SOCKETS:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(run_dir / name)
