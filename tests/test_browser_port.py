"""The browser's debugging port reaches the confined checker (envs/xdesktop/debugging.py) and
nothing else does: a probe in a real checker process talks to a stand-in browser (a loopback
server on the host) through the in-environment server's own `op_browser`, and what a checker
asks of the port that is not a stream's turn is a named failure. Chromium itself, through
desktop-env's getters and Playwright, is tests/test_xdesktop_full.py's (the full image)."""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading

import pytest

from envab.envs.channel import check_reply, decode, encode
from envab.envs.xdesktop import checker, debugging, evaluate, server
from envab.envs.xdesktop.checker import CheckerFailed
from envab.envs.xdesktop.confine import Limits
from tests.test_checker_sandbox import PROBES, Environment, _why_not

pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


class StandInBrowser:
    """A loopback server on the host in the browser's place: it answers what a connection says,
    upper-cased, after `greeting`; it counts its connections."""

    def __init__(self, greeting: bytes = b""):
        self.greeting = greeting
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed: the browser is gone
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.sendall(self.greeting)
            while data := conn.recv(2**16):
                conn.sendall(data.upper())


def _environment(browser: StandInBrowser) -> server.Environment:
    """The in-environment server's own operations, its debugging port the stand-in's."""
    env = server.Environment(display=None)
    env.debugging_port = browser.port
    return env


def _turns(env: server.Environment):
    """The environment's `browser` operation as the host reaches it: over the channel's encoding,
    its reply checked."""

    def browser(stream, data, close, wait):
        request = decode(encode(["browser", stream, data, close, wait]))
        reply = getattr(env, f"op_{request[0]}")(*request[1:])
        return check_reply("browser", decode(encode(reply)))

    return browser


def _run(probe: str, files: Environment, browser, limits: Limits | None = None, **params):
    evaluator = {"probe": probe, **params}
    return checker.run(evaluator, files.http, evaluate.ROUTES, limits, PROBES, browser=browser)


def test_a_checker_talks_to_the_browser_through_its_port_and_leaves_nothing_open():
    browser = StandInBrowser()
    env, files = _environment(browser), Environment({})
    said = "get /json/version"
    assert _run("browser_echo", files, _turns(env), say=said, want=len(said)) == 1.0
    (request,) = files.requests
    assert request == ("POST", "/file", said.upper().encode())
    assert browser.connections == 1
    assert env.streams == {}  # the probe left its connection open; the host closed it


def test_an_answer_larger_than_a_turn_arrives_whole():
    greeting = hashlib.sha256(b"page").digest() * (3 * 2**20 // 32)  # 3 MiB: several turns
    browser = StandInBrowser(greeting)
    env, files = _environment(browser), Environment({})
    assert _run("browser_echo", files, _turns(env), say="", want=len(greeting), digest=True) == 1
    (request,) = files.requests
    assert request[2] == hashlib.sha256(greeting).digest()


def test_an_environment_that_answers_a_turn_past_its_chunk_or_without_end_is_oversize():
    """An honest environment answers at most a chunk a turn (server.BROWSER_CHUNK, the relay's
    ANSWER_MAX); a turn's answer over it, or a browser that streams without end past the
    evaluation's relayed bytes, makes the evaluation invalid (`oversize`), never a host that
    carries whatever comes."""
    assert debugging.ANSWER_MAX == server.BROWSER_CHUNK  # two copies: the server runs alone
    browser = StandInBrowser()
    env, files = _environment(browser), Environment({})
    honest = _turns(env)

    def inflated(stream, data, close, wait):
        reply = honest(stream, data, close, wait)
        return {**reply, "data": reply["data"] + b"x" * (debugging.ANSWER_MAX + 1)}

    with pytest.raises(CheckerFailed) as failed:
        _run("browser_echo", files, inflated, say="hi", want=2)
    assert failed.value.failure == "oversize" and "in one turn" in str(failed.value)

    endless = StandInBrowser(greeting=b"p" * (64 * 2**20))  # more than the budget below
    env = _environment(endless)
    limits = Limits(relayed_bytes=8 * 2**20)
    with pytest.raises(CheckerFailed) as failed:
        _run("browser_echo", Environment({}), _turns(env), limits, say="", want=64 * 2**20)
    assert failed.value.failure == "oversize" and "passed 8388608 bytes" in str(failed.value)
    assert env.streams == {}  # the host closed what the checker left open


def test_a_checker_whose_getters_do_not_ask_the_browser_finds_its_port_closed():
    browser = StandInBrowser()
    assert _run("browser_closed", Environment({}), None) == 1.0
    assert browser.connections == 0


def test_a_browser_that_is_not_there_is_a_closed_port_not_a_failure():
    env = server.Environment(display=None)
    with socket.socket() as held:  # bound and not listening: refused, and no one else's port
        held.bind(("127.0.0.1", 0))
        env.debugging_port = held.getsockname()[1]
        assert _run("browser_closed", Environment({}), _turns(env)) == 1.0


@pytest.mark.parametrize(
    "turn",
    [
        '[99, {"$bytes": ""}, false, 0]',  # a stream the host does not carry
        '[-1, {"$bytes": ""}, false, 0]',
        '[0, "GET / HTTP/1.1", false, 0]',  # data that is not bytes
        '[0, {"$bytes": ""}, 0, 0]',  # close that is not true or false
        '[0, {"$bytes": ""}, false, 30]',  # a wait past the longest
        '[0, {"$bytes": ""}, false]',
        '"open"',
    ],
)
def test_a_turn_that_is_not_a_streams_turn_is_garbage(turn):
    browser = StandInBrowser()
    env = _environment(browser)
    frame = f'{{"browser": {turn}}}'
    with pytest.raises(CheckerFailed) as failed:
        _run("raw_frame", Environment({}), _turns(env), Limits(deadline_s=20), frame=frame)
    assert failed.value.failure == "garbage"
    assert browser.connections == 0


def test_the_environment_opens_its_debugging_port_only_for_the_streams_it_carries():
    browser = StandInBrowser()
    env = _environment(browser)
    with pytest.raises(ValueError, match="stream"):
        env.op_browser(server.BROWSER_STREAMS, b"x", False, 0.0)
    assert env.op_browser(0, b"hello", False, 1.0) == {"data": b"HELLO", "open": True}
    assert env.op_browser(0, b"", True, 0.0) == {"data": b"", "open": False}
    assert env.streams == {} and browser.connections == 1


def test_the_environment_and_the_relay_agree_on_the_port_and_the_streams():
    # server.py runs without this package, so it carries its own copy of the numbers
    assert server.DEBUGGING_PORT == debugging.DEBUGGING_PORT
    assert server.BROWSER_STREAMS == debugging.STREAMS
    assert server.BROWSER_WAIT_S == debugging.WAIT_MAX_S


class LyingBrowser:
    """A hostile environment's browser (the environment is untrusted): its debugging port answers
    `/json/version` naming a WebSocket at `elsewhere`, an address of its choosing, so that
    Playwright in the checker would connect there instead."""

    def __init__(self, elsewhere: str):
        body = json.dumps({"Browser": "Chrome/140.0.0.0", "webSocketDebuggerUrl": elsewhere})
        self.answer = (
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.recv(2**16))
                conn.sendall(self.answer)


@pytest.mark.integration
def test_a_browser_that_names_another_address_leads_playwright_nowhere():
    # The real getter (desktop-env's open_tabs_info, Playwright's connect_over_cdp) in the real
    # checker: the WebSocket it is sent to is the host's own listener, which the checker's
    # network namespace cannot reach; the getter's fallback (a /setup/launch request to the
    # in-environment server) is a route the checker is refused. The task scores 0, validly.
    bait = socket.create_server(("127.0.0.1", 0))
    bait.settimeout(0.1)
    browser = LyingBrowser(f"ws://127.0.0.1:{bait.getsockname()[1]}/devtools/browser/bait")
    env, files = _environment(browser), Environment({})
    evaluator = {
        "func": "is_expected_tabs",
        "result": {"type": "open_tabs_info"},
        "expected": {"type": "rule", "rules": {"type": "url", "urls": ["file:///root/a.html"]}},
    }
    score = evaluate.evaluate(evaluator, files.http, lambda steps: None, browser=_turns(env))
    assert score == 0.0
    assert browser.requests and browser.requests[0].startswith(b"GET /json/version")
    with pytest.raises(TimeoutError):
        bait.accept()  # nothing the checker did reached the host's listener
    assert files.requests == []  # nor the environment's other routes
    assert env.streams == {}


class StandInDevTools:
    """The browser's DevTools HTTP endpoints, recording what is asked of them: one page open
    (`first`), new tabs made, tabs closed."""

    def __init__(self):
        self.asked: list[tuple[str, str]] = []
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                stand_in.asked.append((self.command, self.path))
                if self.path == "/json/list":
                    body = json.dumps([{"id": "first", "type": "page", "url": "about:blank"},
                                       {"id": "worker", "type": "service_worker"}])  # fmt: skip
                elif self.path.startswith("/json/close/"):
                    body = "Target is closing"
                else:
                    body = "{}"
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body.encode())

            do_GET = do_PUT = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_open_tabs_set_up_opens_each_url_and_closes_the_first_tab():
    devtools = StandInDevTools()
    env = server.Environment(display=None)
    env.debugging_port = devtools.port
    urls = ["https://a.example/x?q=1", "file:///root/b.html"]
    env.setup([{"type": "chrome_open_tabs", "parameters": {"urls_to_open": urls}}])
    assert devtools.asked == [
        ("GET", "/json/version"),
        ("GET", "/json/list"),
        ("PUT", "/json/new?https%3A%2F%2Fa.example%2Fx%3Fq%3D1"),
        ("GET", "/json/close/first"),  # the page it started with, after the first tab opened
        ("PUT", "/json/new?file%3A%2F%2F%2Froot%2Fb.html"),
    ]
    devtools.server.shutdown()


@pytest.mark.parametrize("urls", [None, [], "https://a.example", [1]])
def test_an_open_tabs_step_without_a_list_of_urls_is_a_set_up_error(urls):
    env = server.Environment(display=None)
    with pytest.raises(server.SetupError, match="urls_to_open"):
        env.setup([{"type": "chrome_open_tabs", "parameters": {"urls_to_open": urls}}])
