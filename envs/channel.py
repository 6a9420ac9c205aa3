"""A message channel between the host and one worker process: a Unix stream socket, or a pair
of pipes (a worker in a gVisor sandbox talks over its standard input and output).

Messages are length-prefixed JSON (bytes as `{"$bytes": <base64>}`), never pickles: the other end
is code this project wrote, but it runs inside the environment, next to the agent's terminal and
the task's set-up steps, so anything there can write a frame. A frame is data only and bounded
(`MAX_FRAME`), and each reply is checked against what its request expects (`REPLIES`); anything
else is `ChannelCorrupt`, which callers treat as a dead environment (never a crash, never code
run on the host). New channels for forked children travel as file descriptors (SCM_RIGHTS) after
a `fork` message. The in-environment server (envs/xdesktop/server.py) carries its own copy of
the encoding (it runs without this package); tests/test_channel.py holds the two to each other.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import select
import socket
import struct
import time

_HEADER = struct.Struct("!I")
# The largest frame either end accepts: a screenshot is a few MiB; a file read back for a checker
# (the X desktop's `/file`) is the largest answer there is, and is refused past this.
MAX_FRAME = 64 * 2**20

# What each request's reply must hold (key -> type), besides {"error": str}, which any request may
# get; a step may instead be {"rejected": str}. "started": a process's first words.
_SCREEN = {"screenshot": bytes, "frame": int, "state_sha256": str}
REPLIES: dict[str, dict[str, type | tuple[type, ...]]] = {
    "started": {"pid": int},
    "prepare": {"pid": int},
    "hello": {"pid": int, "state_sha256": (str, type(None))},
    "init": {"state_sha256": str, "screenshot": bytes, "timings": dict},
    "arm": {"state_sha256": str},
    "step": _SCREEN,
    "observe": _SCREEN,
    "state": {"state": dict, "state_sha256": str},
    "postconfig": {"state_sha256": str, "cache": dict},
    "http": {"status": int, "content_type": (str, type(None)), "body": bytes},
    "browser": {"data": bytes, "open": bool},
    "ping": {"pid": int},
    "fork": {"pids": list},
}


class ChannelClosed(ConnectionError):
    """The other end is gone (the worker died or exited)."""


class ChannelCorrupt(ChannelClosed):
    """A frame that is not a well-formed message: too large, not JSON, or not the reply its
    request expects. The other end is out of step or hostile; the channel is dropped."""


class FrameTooLarge(ChannelCorrupt):
    """A frame over its channel's size limit (a caller may name this apart from garbage)."""


def encode(message) -> bytes:
    """A message as a frame's payload: JSON, bytes tagged, tuples as lists, no NaN."""

    def tagged(value):
        if isinstance(value, bytes | bytearray):
            return {"$bytes": base64.b64encode(value).decode("ascii")}
        raise TypeError(f"a channel message cannot carry {type(value).__name__}")

    data = json.dumps(message, default=tagged, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_FRAME:
        raise FrameTooLarge(f"a message of {len(data)} bytes is over the {MAX_FRAME} limit")
    return data


def decode(data: bytes):
    """A frame's payload as a message; ChannelCorrupt for anything that is not one."""

    def untagged(obj: dict):
        if "$bytes" in obj:
            if len(obj) != 1 or not isinstance(obj["$bytes"], str):
                raise ChannelCorrupt("a malformed bytes value")
            try:
                return base64.b64decode(obj["$bytes"], validate=True)
            except binascii.Error:
                raise ChannelCorrupt("bytes that are not base64") from None
        return obj

    def no_constant(name: str):
        raise ChannelCorrupt(f"{name} in a frame")

    try:
        return json.loads(data, object_hook=untagged, parse_constant=no_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError included
        raise ChannelCorrupt(f"a frame that is not JSON ({type(e).__name__})") from None


def check_reply(request: str, reply) -> dict:
    """`reply` if it is what `request` expects (REPLIES), else ChannelCorrupt naming what is not."""
    if not isinstance(reply, dict):
        raise ChannelCorrupt(f"{request}: a reply that is not an object")
    if "error" in reply:
        # A process's first words and a restored copy's hello are read without an error check:
        # a copy that cannot greet is as good as dead.
        if not isinstance(reply["error"], str) or request in ("started", "hello"):
            raise ChannelCorrupt(f"{request}: {str(reply['error'])[:200]}")
        return reply
    if request == "step" and "rejected" in reply:
        if not isinstance(reply["rejected"], str):
            raise ChannelCorrupt("step: a refusal that is not text")
        return reply
    for key, kind in REPLIES.get(request, {}).items():
        value = reply.get(key)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise ChannelCorrupt(f"{request}: {key} is not {getattr(kind, '__name__', kind)}")
    return reply


def _size(header: bytes, limit: int = MAX_FRAME) -> int:
    (size,) = _HEADER.unpack(header)
    if size > limit:
        raise FrameTooLarge(f"a frame of {size} bytes is over the {limit} limit")
    return size


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
        data = encode(message)
        try:
            self.sock.sendall(_HEADER.pack(len(data)) + data)
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            raise ChannelClosed(str(e)) from None

    def recv(self, timeout: float | None = None, expect: str | None = None):
        """The next message; `expect`: the request it answers, whose reply shape is checked."""
        self.sock.settimeout(timeout)
        try:
            message = decode(self._read(_size(self._read(_HEADER.size))))
        except TimeoutError:
            raise ChannelTimeout(f"no answer within {timeout} s") from None
        finally:
            if self.sock.fileno() >= 0:
                self.sock.settimeout(None)
        return message if expect is None else check_reply(expect, message)

    def call(self, message, timeout: float | None = None) -> dict:
        """Send a request (`[op, *args]`) and return its checked reply."""
        self.send(message)
        return self.recv(timeout, expect=message[0])

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
    restore binds to the new copy's pipes, so each copy gets a channel of its own. `max_frame`:
    the largest frame this end reads (at most MAX_FRAME; a checker's requests are small).
    """

    def __init__(self, read_fd: int, write_fd: int, max_frame: int = MAX_FRAME):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.max_frame = min(max_frame, MAX_FRAME)
        self._open = True

    def fileno(self) -> int:
        return self.read_fd

    def send(self, message) -> None:
        payload = encode(message)
        data = memoryview(_HEADER.pack(len(payload)) + payload)
        try:
            while data:
                data = data[os.write(self.write_fd, data) :]
        except OSError as e:  # EPIPE, or closed here
            raise ChannelClosed(str(e)) from None

    def recv(self, timeout: float | None = None, expect: str | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        size = _size(self._read_until(_HEADER.size, deadline, timeout), self.max_frame)
        message = decode(self._read_until(size, deadline, timeout))
        return message if expect is None else check_reply(expect, message)

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
