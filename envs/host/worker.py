"""The worker process: one environment (one desktop) per process, driven over a `Channel`.

The host starts one *zygote* (`python -m envab.envs.host.worker --fd N --mode M`), which holds the
prepared blank desktop of each screen size and forks a fresh worker per environment, so no
environment pays for an interpreter start. What a new worker does next is the arm's difference:

- restore mode: `Desktop.restore(snapshot)` from the saved bytes of the prepared desktop, then the
  task's set-up;
- fork mode: the prepared desktop is already in the worker's (copy-on-write) memory; the task's
  set-up runs on it. A running worker forks into n children (`os.fork`) in exactly its state.

In a gVisor sandbox (`--stdio`, see `envab.envs.host.gvisor`) there is no zygote: the worker
prepares the blank desktop once, the host checkpoints the sandbox, and every environment is a
restored copy, which the host greets (`hello`) before use; a fork is another checkpoint and
restore. The channel is then the worker's standard input and output.

Fault injection (armed by the host, which refuses it unless started with --allow-faults) lives
here, where a real failure would happen: the process dies, stalls, restores a corrupt snapshot,
paints a blank screen or shows the frame from before the action (a display that stopped updating).
Every screenshot carries its frame number (the step it was drawn after), as a display's frame
counter would, so that the host can tell a stale one from a current one.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import random
import signal
import sys
import time

from PIL import Image

from envab.envs.channel import Channel, ChannelClosed, PipeChannel


def load_object(spec: str):
    """Import "package.module:attribute"."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"import spec {spec!r} must look like 'package.module:attribute'")
    return getattr(importlib.import_module(module), attr)


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=1)  # speed over size: screens are small
    return buf.getvalue()


def corrupt_snapshot(desktop_cls, blob: bytes) -> bytes:
    """A dirty restore: the snapshot of a prepared desktop that an earlier episode already used.

    This is the failure the state-hash gate exists for: the restore succeeds, the task's set-up
    runs and the screen looks plausible, but the state is not the one the task was made from.
    """
    used = desktop_cls.restore(blob)
    used.apply({"action_type": "DONE", "parameters": {}})
    return used.snapshot()


class Worker:
    def __init__(self, channel: Channel, mode: str, desktop_cls, on_fork=None):
        self.channel = channel
        self.mode = mode
        self.desktop_cls = desktop_cls
        # zygote only: called in each new environment before it greets the host (a namespace
        # sandbox's per-environment limits); a fork of an environment inherits its parent's
        self.on_fork = on_fork
        self.desktop = None
        self.faults: dict = {}
        self.steps = 0
        self.shown: tuple[bytes, int] | None = None  # the last screenshot sent, and its frame
        # zygote only: screen size -> prepared desktop (fork mode) or its snapshot (restore mode)
        self.templates: dict[tuple[int, int], object] = {}

    def serve(self) -> None:
        while True:
            try:
                message = self.channel.recv()
            except ChannelClosed:
                os._exit(0)  # the host is gone or closed us; nothing to flush
            op, *args = message
            if op == "fork":
                try:
                    self.fork(*args)
                except ChannelClosed:
                    os._exit(0)
                continue
            if op == "close":
                os._exit(0)
            try:
                reply = getattr(self, f"op_{op}")(*args)
            except Exception as e:  # reported to the host, which turns it into a gate
                reply = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
            try:
                self.channel.send(reply)
            except ChannelClosed:
                os._exit(0)

    # --- process management -------------------------------------------------------------

    def fork(self, n: int, size: tuple[int, int] | None = None) -> None:
        """Fork n children, each served over one of the n descriptors that follow."""
        fds = self.channel.recv_fds(n)
        if size is not None:
            try:
                self.prepare(tuple(size))
            except Exception as e:  # e.g. a screen size the desktop cannot make
                for fd in fds:
                    os.close(fd)
                self.channel.send({"error": f"{type(e).__name__}: {e}".splitlines()[0]})
                return
        pids = []
        for i, fd in enumerate(fds):
            pid = os.fork()
            if pid == 0:
                for other in fds[:i] + fds[i + 1 :]:
                    os.close(other)
                self.channel.close()
                self.channel = Channel.from_fd(fd)
                self.faults = {}  # faults are armed per environment, not inherited
                if size is not None and self.on_fork is not None:
                    self.on_fork()  # raises: the child dies unseen, the host's hello fails
                state = self.desktop.state_hash() if self.desktop is not None else None
                self.channel.send({"pid": os.getpid(), "state_sha256": state})
                return  # back to serve(), now as the child
            pids.append(pid)
        for fd in fds:
            os.close(fd)
        self.channel.send({"pids": pids})

    def prepare(self, size: tuple[int, int]) -> None:
        """Build the prepared blank desktop of this size once (zygote)."""
        if size in self.templates:
            return
        desktop = self.desktop_cls(*size)
        self.templates[size] = desktop if self.mode == "fork" else desktop.snapshot()

    # --- operations ---------------------------------------------------------------------

    def op_prepare(self, size) -> dict:
        """Prepare the blank desktop of this size (a sandbox about to be checkpointed)."""
        self.prepare(tuple(size))
        return {"pid": os.getpid()}

    def op_hello(self) -> dict:
        """First words of a copy restored from a checkpoint: every copy starts with the saved
        random state, so each reseeds from the (sandbox's) kernel before anything else."""
        random.seed()
        state = self.desktop.state_hash() if self.desktop is not None else None
        return {"pid": os.getpid(), "state_sha256": state}

    def op_init(self, size, config, faults) -> dict:
        size = tuple(size)
        self.faults = dict(faults or {})
        template = self.templates[size]
        t0 = time.perf_counter()
        if self.mode == "restore":
            blob = template
            if self.faults.get("corrupt_restore"):
                blob = corrupt_snapshot(self.desktop_cls, blob)
            self.desktop = self.desktop_cls.restore(blob)
        else:
            self.desktop = template  # this process's private copy-on-write copy
            if self.faults.get("corrupt_restore"):
                self._corrupt()
        self.templates = {}
        t1 = time.perf_counter()
        self.desktop.setup(config)
        t2 = time.perf_counter()
        self.shown = (png_bytes(self.desktop.screenshot()), self.steps)
        return {
            "state_sha256": self.desktop.state_hash(),
            "screenshot": self.shown[0],
            "timings": {"restore_s": t1 - t0, "setup_s": t2 - t1},
        }

    def op_arm(self, faults) -> dict:
        """A fork child's own fault switches (a fork never inherits its parent's)."""
        self.faults = dict(faults or {})
        if self.faults.get("corrupt_restore"):
            self._corrupt()
        return {"state_sha256": self.desktop.state_hash()}

    def _corrupt(self) -> None:
        """The live desktop replaced by a dirty copy of itself (a restore in the wrong state)."""
        self.desktop = self.desktop_cls.restore(
            corrupt_snapshot(self.desktop_cls, self.desktop.snapshot())
        )

    def op_step(self, action) -> dict:
        try:
            self.desktop.apply(action)
        except ValueError as e:  # the policy's mistake (off-screen, after DONE): state unchanged
            return {"rejected": str(e).splitlines()[0]}
        # Step faults count accepted actions, as on every arm. Dying or hanging after applying
        # the action looks the same to the host as before it: no answer, the environment lost.
        self.steps += 1
        if self.faults.get("kill_at_step") == self.steps:
            if os.getpid() != 1:  # a sandbox's init ignores its own SIGKILL
                with contextlib.suppress(OSError):  # a seccomp filter may refuse kill
                    os.kill(os.getpid(), signal.SIGKILL)
            os._exit(137)  # die as abruptly
        if self.faults.get("stall_at_step") == self.steps:
            time.sleep(float(self.faults.get("stall_s", 3600)))
        state = self.desktop.state_hash()
        if self.faults.get("stale_at_step") == self.steps and self.shown is not None:
            png, frame = self.shown  # the display never drew this step's frame
            return {"screenshot": png, "frame": frame, "state_sha256": state}
        image = self.desktop.screenshot()
        if self.faults.get("blank_at_step") == self.steps:
            image = Image.new("RGB", image.size)
        self.shown = (png_bytes(image), self.steps)
        return {"screenshot": self.shown[0], "frame": self.steps, "state_sha256": state}

    def op_observe(self) -> dict:
        """The screen now, without acting: a fresh drawing of the current frame."""
        self.shown = (png_bytes(self.desktop.screenshot()), self.steps)
        return {
            "screenshot": self.shown[0],
            "frame": self.steps,
            "state_sha256": self.desktop.state_hash(),
        }

    def op_state(self) -> dict:
        return {"state": self.desktop.state(), "state_sha256": self.desktop.state_hash()}

    def op_ping(self) -> dict:
        return {"pid": os.getpid()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="env-ab worker zygote (started by the host)")
    parser.add_argument("--fd", type=int)
    parser.add_argument("--mode", choices=["restore", "fork"], required=True)
    parser.add_argument("--desktop", default="envab.envs.desktop:Desktop")
    parser.add_argument("--stdio", action="store_true", help="talk over stdin/stdout (sandbox)")
    parser.add_argument(
        "--confine",
        action="store_true",
        help="confine this zygote and its environments (inside a namespace sandbox)",
    )
    args = parser.parse_args(argv)
    # Children are reaped by the kernel: the host watches them through their channels.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the host decides when we stop
    if args.stdio:
        channel = PipeChannel(0, 1)
        sys.stdout = sys.stderr  # a stray print must not land in the channel
    elif args.fd is not None:
        channel = Channel.from_fd(args.fd)
    else:
        parser.error("give --fd or --stdio")
    desktop_cls = load_object(args.desktop)
    on_fork = None
    if args.confine:  # after the imports, before any request: see envs/host/namespaces.py
        from envab.envs.host import namespaces
        from envab.envs.xdesktop.confine import ConfinementError

        try:
            namespaces.confine_zygote()
        except ConfinementError as e:
            print(f"worker: cannot confine itself: {e}", file=sys.stderr, flush=True)
            os._exit(1)  # never serve unconfined
        on_fork = namespaces.confine_environment
    worker = Worker(channel, args.mode, desktop_cls, on_fork)
    channel.send({"pid": os.getpid()})
    worker.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
