"""Start the host in a subprocess on a free loopback port for as long as a job needs it.

The pipeline does this when an arm says `url: embedded`; tests and the benchmark do it too.
The listening socket is bound here and handed to the child, so there is no race for the port.
The host dies with the process that started it (Linux's parent-death signal), so a job killed
outright (kill -9, out of memory) leaves no host behind; its workers exit when their host's
channel closes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from envab.envs.auth import TokenError, read_token
from envab.envs.lifetime import start_child


def host_token(path: str | Path) -> str:
    """The host's bearer token from its file; a missing or empty file exits with one line."""
    try:
        return read_token(token_file=path)
    except TokenError as e:
        raise SystemExit(str(e)) from None


def write_token_file(path: str | Path) -> Path:
    """A fresh random token in a file only its owner can read (for an embedded arm)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path


@contextmanager
def serve_embedded(
    mode: str,
    token_file: str | Path,
    *,
    allow_faults: bool = False,
    step_timeout_s: float = 10.0,
    log_path: str | Path | None = None,
    startup_timeout_s: float = 60.0,
    extra_args: Sequence[str] = (),
    max_restarts: int = 10,
    sandbox: str = "gvisor",
) -> Iterator[str]:
    """Run `python -m envab.envs.host` on 127.0.0.1; yield its base URL; stop it on exit.

    Host output goes to `log_path` (appended) or is discarded. Raises RuntimeError with the
    log's last lines when the host does not come up healthy within `startup_timeout_s`. A host
    that dies while in use is started again on the same socket (as a service manager would),
    up to `max_restarts` times; requests made meanwhile wait in the socket's queue, and the new
    host answers 404 for the environments the old one held. `sandbox` is where each environment
    runs: "gvisor" (a sandbox forked by checkpoint and restore), "process" (os.fork),
    "namespaces" (os.fork inside a sandbox of Linux namespaces), "runc" (a fresh OCI container
    per environment, restore mode) or "qemu" (the X desktop in restore mode: a VM reset by
    loadvm).
    """
    token = host_token(token_file)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(2048)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    cmd = [
        sys.executable,
        "-m",
        "envab.envs.host",
        "--mode",
        mode,
        "--fd",
        str(listener.fileno()),
        "--token-file",
        str(token_file),
        "--step-timeout",
        str(step_timeout_s),
        "--sandbox",
        sandbox,
        *extra_args,
    ]
    if allow_faults:
        cmd.append("--allow-faults")
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    supervisor = _Supervisor(cmd, listener, log, max_restarts)
    try:
        proc = supervisor.launch()
        _wait_healthy(url, token, proc, startup_timeout_s, log_path)
        supervisor.watch()
        yield url
    finally:
        supervisor.stop()
        listener.close()
        if log is not subprocess.DEVNULL:
            log.close()


class _Supervisor(threading.Thread):
    """Starts the host and starts it again when it dies before `stop()`; each start goes through
    envs/lifetime.py, so the host dies with the job however the job goes."""

    def __init__(self, cmd: list[str], listener: socket.socket, log, max_restarts: int):
        super().__init__(name="embedded-host", daemon=True)
        self.cmd, self.listener, self.log, self.max_restarts = cmd, listener, log, max_restarts
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._requests: queue.Queue = queue.Queue()
        self._launched: queue.Queue = queue.Queue()

    def launch(self) -> subprocess.Popen:
        """Start the thread, which starts the host; the host's process."""
        super().start()
        launched = self._launched.get()
        if isinstance(launched, BaseException):
            raise launched
        return launched

    def watch(self) -> None:
        """From now on, a host that dies is started again."""
        self._requests.put("watch")

    def run(self) -> None:
        try:
            self.proc = self._popen()
        except OSError as e:
            self._launched.put(e)
            return
        self._launched.put(self.proc)
        if self._requests.get() != "watch":
            return
        while not self._stopping.wait(0.2):
            if self.proc.poll() is None:
                continue
            if self.restarts >= self.max_restarts:
                self._write(f"embedded host exited with {self.proc.returncode}; "
                            f"{self.restarts} restarts already, giving up\n")  # fmt: skip
                with contextlib.suppress(OSError):
                    self.listener.shutdown(socket.SHUT_RDWR)  # refuse rather than hang clients
                return
            self.restarts += 1
            self._write(f"embedded host exited with {self.proc.returncode}; "
                        f"starting it again (restart {self.restarts})\n")  # fmt: skip
            self.proc = self._popen()

    def stop(self) -> None:
        self._stopping.set()
        self._requests.put("stop")
        if self.is_alive():
            self.join(timeout=5)
        if self.proc is not None:
            _stop(self.proc)

    def _popen(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return start_child(
            self.cmd,
            pass_fds=[self.listener.fileno()],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def _write(self, line: str) -> None:
        if self.log is not subprocess.DEVNULL:
            self.log.write(line.encode())
            self.log.flush()


def _wait_healthy(url, token, proc, timeout_s, log_path) -> None:
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"embedded host exited with {proc.returncode}{_tail(log_path)}")
            try:
                if client.get(f"{url}/v1/health", headers=headers).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    _stop(proc)
    raise RuntimeError(f"embedded host not healthy after {timeout_s} s{_tail(log_path)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # uvicorn shuts down and the pool stops its workers
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(log_path, lines: int = 5) -> str:
    if not log_path or not Path(log_path).exists():
        return ""
    tail = Path(log_path).read_text(errors="replace").splitlines()[-lines:]
    return ":\n" + "\n".join(tail)
