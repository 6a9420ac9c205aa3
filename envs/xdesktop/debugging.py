"""The browser's remote-debugging port, carried from the environment to the confined checker.

desktop-env's Chrome getters call Playwright's `chromium.connect_over_cdp("http://host:port")`:
an HTTP look-up (`/json/version`), then a WebSocket held open for the whole getter. The browser
listens inside the environment (a gVisor sandbox has no network; a QEMU guest none the host
routes), and the checker has only loopback, so the port travels as byte streams over the two
channels the checker already has, in turns:

- in the checker (`PortRelay`): a listener on 127.0.0.1:DEBUGGING_PORT in the checker's own
  network namespace, so the address the browser names in its answers is the relay's too. Each
  connection it accepts is a stream; in turns, it sends what the getter wrote (`{"browser":
  [stream, data, close, wait]}`) and writes back what the browser answered.
- in the host (`Streams`): each turn, checked (`turn`), goes to the environment's `browser`
  operation, for tasks whose getters need the browser only; every stream still open when the
  checker ends is closed there.
- in the environment (`envs/xdesktop/server.py`, `op_browser`): the stream's socket to the
  browser's debugging port, the only port it opens.

Everything on the stream is the environment's (the page, the browser) and is read only by the
checker, never by the host, which carries bytes it does not parse.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable, Mapping

DEBUGGING_PORT = 1337  # OSWorld's (envs/xdesktop/server.py's, which runs without this package)
STREAMS = 8  # open at once (the environment's limit too)
# The most a turn sends: its frame (base64) stays under the checker's REQUEST_MAX.
CHUNK = 512 * 2**10
ANSWER_WAIT_S = 0.5  # a turn that sent bytes waits this long for the browser's first answer
IDLE_S = 0.05  # a stream with nothing to send asks for the browser's news this often
WAIT_MAX_S = 1.0
# The most the environment answers in one turn (envs/xdesktop/server.py's BROWSER_CHUNK: the rest
# waits for the next turn); an answer over it is not an honest environment's.
ANSWER_MAX = 2**20

# (stream, data, close, wait) -> {"data": bytes, "open": bool}: one turn of a stream
Turn = Callable[[int, bytes, bool, float], Mapping]


def turn(request) -> tuple[int, bytes, bool, float]:
    """A checker's turn, as the host takes it; ValueError for anything else."""
    if not (isinstance(request, list) and len(request) == 4):
        raise ValueError("a browser turn that is not [stream, data, close, wait]")
    stream, data, close, wait = request
    if type(stream) is not int or not 0 <= stream < STREAMS:
        raise ValueError(f"stream {str(stream)[:20]!r} is not one of 0..{STREAMS - 1}")
    if not isinstance(data, bytes) or len(data) > CHUNK:
        raise ValueError(f"a turn's data is not bytes of at most {CHUNK}")
    if type(close) is not bool:
        raise ValueError("a turn's close is not true or false")
    if type(wait) not in (int, float) or not 0.0 <= wait <= WAIT_MAX_S:
        raise ValueError(f"a turn's wait is not 0 to {WAIT_MAX_S} s")
    return stream, data, close, float(wait)


class AnswerTooLarge(ValueError):
    """The environment answered a turn with more than ANSWER_MAX bytes."""


class Streams:
    """The host's side: the environment's `browser` turns for one checker, and which streams it
    left open (closed by `close`, whatever the checker did)."""

    def __init__(self, browser: Turn):
        self.browser = browser
        self.opened: set[int] = set()

    def __call__(self, stream: int, data: bytes, close: bool, wait: float) -> dict:
        reply = self.browser(stream, data, close, wait)
        if not (isinstance(reply.get("data"), bytes) and type(reply.get("open")) is bool):
            raise ValueError("a browser answer that is not {data: bytes, open: true or false}")
        if len(reply["data"]) > ANSWER_MAX:
            raise AnswerTooLarge(f"a browser answer of {len(reply['data'])} bytes in one turn "
                                 f"(at most {ANSWER_MAX})")  # fmt: skip
        if reply["open"]:
            self.opened.add(stream)
        else:
            self.opened.discard(stream)
        return {"data": reply["data"], "open": reply["open"]}

    def close(self) -> None:
        for stream in sorted(self.opened):
            with contextlib.suppress(Exception):  # a dead environment closed them all
                self.browser(stream, b"", True, 0.0)
        self.opened.clear()


class PortRelay:
    """The checker's side: a loopback listener on `port`, each connection a stream whose turns
    go through `ask` (the checker's channel to the host)."""

    def __init__(self, ask: Turn, port: int = DEBUGGING_PORT):
        self.ask = ask
        self.listener = socket.create_server(("127.0.0.1", port))
        self.free = list(range(STREAMS))
        self.lock = threading.Lock()

    def start(self) -> PortRelay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                stream = self.free.pop(0) if self.free else None
            if stream is None:  # as a port with no room: refused
                conn.close()
                continue
            threading.Thread(target=self._pump, args=(stream, conn), daemon=True).start()

    def _pump(self, stream: int, conn: socket.socket) -> None:
        """Turns until either end closes: what the getter wrote out, what the browser sent in."""
        try:
            with conn:
                while True:
                    data, close = b"", False
                    if select.select([conn], [], [], IDLE_S)[0]:
                        data = conn.recv(CHUNK)
                        close = not data
                    reply = self.ask(stream, data, close, ANSWER_WAIT_S if data else 0.0)
                    if close:
                        return
                    if reply["data"]:
                        conn.sendall(reply["data"])
                    if not reply["open"]:
                        return
        except OSError:  # the getter hung up mid-turn: the browser's end closes too
            with contextlib.suppress(Exception):
                self.ask(stream, b"", True, 0.0)
        finally:
            with self.lock:
                self.free.append(stream)
