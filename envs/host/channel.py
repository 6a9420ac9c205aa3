"""A message channel between the host and one worker process: a Unix stream socket.

Messages are length-prefixed pickles. Both ends are this project's own processes on one machine
(a socketpair, never a listening socket), so pickle is safe here. New channels for forked
children travel as file descriptors (SCM_RIGHTS) after a `fork` message.
"""

from __future__ import annotations

import pickle
import socket
import struct

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
