"""A message channel between the host and one worker process: a Unix stream socket, or a pair
of pipes (a worker in a gVisor sandbox talks over its standard input and output).

Messages are length-prefixed pickles. Both ends are this project's own processes on one machine
(a socketpair or pipes, never a listening socket), so pickle is safe here. New channels for
forked children travel as file descriptors (SCM_RIGHTS) after a `fork` message.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import socket
import struct
import time

_HEADER = struct.Struct("!I")


class ChannelClosed(ConnectionError):
    """The other end is gone (the worker died or exited)."""


class ChannelTimeout(TimeoutError):
    """No answer within the time limit; the channel is out of step and must be dropped."""


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    @classmethod
    def from_fd(cls, fd: int) -> Channel:
        return cls(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd))

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.sock.sendall(_HEADER.pack(len(data)) + data)
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            raise ChannelClosed(str(e)) from None

    def recv(self, timeout: float | None = None):
        self.sock.settimeout(timeout)
        try:
            (size,) = _HEADER.unpack(self._read(_HEADER.size))
            return pickle.loads(self._read(size))
        except TimeoutError:
            raise ChannelTimeout(f"no answer within {timeout} s") from None
        finally:
            if self.sock.fileno() >= 0:
                self.sock.settimeout(None)

    def call(self, message, timeout: float | None = None):
        self.send(message)
        return self.recv(timeout)

    def send_fds(self, fds: list[int]) -> None:
        try:
            socket.send_fds(self.sock, [b"F"], fds)
        except OSError as e:
            raise ChannelClosed(str(e)) from None

    def recv_fds(self, n: int) -> list[int]:
        try:
            _, fds, _, _ = socket.recv_fds(self.sock, 1, n)
        except OSError as e:
            raise ChannelClosed(str(e)) from None
        if len(fds) != n:
            raise ChannelClosed(f"expected {n} descriptors, got {len(fds)}")
        return fds

    def close(self) -> None:
        self.sock.close()

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except (ConnectionResetError, OSError) as e:
                if isinstance(e, TimeoutError):
                    raise
                raise ChannelClosed(str(e)) from None
            if not chunk:
                raise ChannelClosed("end of stream")
            buf += chunk
        return bytes(buf)


class PipeChannel(Channel):
    """The same messages over two pipe descriptors (read, write): what a sandboxed worker has.

    A worker restored from a checkpoint keeps reading the same descriptor numbers, which the
    restore binds to the new copy's pipes, so each copy gets a channel of its own.
    """

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd
        self._open = True

    def fileno(self) -> int:
        return self.read_fd

    def send(self, message) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        data = memoryview(_HEADER.pack(len(payload)) + payload)
        try:
            while data:
                data = data[os.write(self.write_fd, data) :]
        except OSError as e:  # EPIPE, or closed here
            raise ChannelClosed(str(e)) from None

    def recv(self, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        (size,) = _HEADER.unpack(self._read_until(_HEADER.size, deadline, timeout))
        return pickle.loads(self._read_until(size, deadline, timeout))

    def send_fds(self, fds: list[int]) -> None:
        raise ChannelClosed("a pipe cannot carry descriptors")

    def recv_fds(self, n: int) -> list[int]:
        raise ChannelClosed("a pipe cannot carry descriptors")

    def close(self) -> None:
        if self._open:
            self._open = False
            for fd in {self.read_fd, self.write_fd}:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _read_until(self, n: int, deadline: float | None, timeout: float | None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                    raise ChannelTimeout(f"no answer within {timeout} s")
            try:
                chunk = os.read(self.read_fd, n - len(buf))
            except OSError as e:
                raise ChannelClosed(str(e)) from None
            if not chunk:
                raise ChannelClosed("end of stream")
            buf += chunk
        return bytes(buf)
