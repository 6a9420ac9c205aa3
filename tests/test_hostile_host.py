"""A hostile or buggy Drums host is an invalid attempt, never a crash, and training goes on.

A real loopback HTTP server speaks the embedded host's routes (envs/host) with well-formed answers,
except where a row of the table scripts a malformed one; the real client (envs/drums/client.py,
with its real transport) is driven through create, step, observe, fork or verify. Each row expects
an invalid attempt under a named gate (or a clean one-line refusal where the contract says
refusing is right), and the next well-formed episode on the same client then succeeds.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import random
import socket
import struct
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from PIL import Image

from envab.envs.drums import ActionRejected, DrumsBackend, DrumsError
from envab.envs.drums.answer import LINE, MAX_RESPONSE_BYTES, MAX_SCREENSHOT_B64
from envab.envs.protocol import Gate, Observation, Verification

TOKEN = "hostile-test-token"
TASK = {"id": "t1"}
CLICK = {"action_type": "CLICK", "parameters": {"x": 1, "y": 1}}
STEP_S, CREATE_S = 1.5, 3.0  # the client's deadlines in this test: a trickle ends at them


def png(size=(8, 8), fmt="PNG", mode="RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, 90).save(out, fmt)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(side: int = 60000) -> bytes:
    """A few hundred bytes whose header claims side x side pixels (a decompression bomb)."""
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 4096, 9)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat)


def bad_crc_png() -> bytes:
    data = bytearray(png())
    at = data.index(b"IDAT") + 6  # a byte inside the pixel data: its chunk's checksum fails
    data[at] ^= 0xFF
    return bytes(data)


SCREEN = b64(png())
DROP = object()


def well_formed(kind: str, request: dict, n: int) -> tuple[int, dict]:
    """The embedded host's answer to a request of `kind` (the n-th request of the test)."""
    verdict = {"valid": True, "verdict": "valid", "failed_gates": []}
    state = {"state_sha256": "0" * 64}
    if kind == "health":
        return 200, {"status": "ok", "mode": "fork", "can_fork": True}
    if kind == "create":
        body = {"env_id": f"e{n}", "generation": 0, "screenshot_png": SCREEN, **state}
        return 201, {**body, "task_sha256": "1" * 64, **verdict, "timings": {"create_s": 0.1}}
    if kind in ("step", "observe"):
        generation = request.get("generation", 0) + (kind == "step")
        body = {"env_id": "e", "generation": generation, "screenshot_png": SCREEN, **state}
        return 200, {
            **body,
            **verdict,
            **({"done": False, "timings": {}} if kind == "step" else {}),
        }
    if kind == "fork":
        children = [
            {"env_id": f"c{n}x{i}", "generation": 1, **state, **verdict}
            for i in range(request["n"])
        ]
        return 200, {"children": children, "timings": {"fork_s": 0.1}}
    if kind == "verify":
        return 200, {"score": 1.0, **verdict, "audit": {"trusted": True, "audit_flags": []}}
    return 200, {"env_id": "e", "closed": True}


Answer = Callable[["Handler", str, dict, int], None]


def send(h: Handler, status: int, body: bytes, headers: dict | None = None) -> None:
    h.send_response(status)
    headers = {
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        **(headers or {}),
    }
    for key, value in headers.items():
        h.send_header(key, value)
    h.end_headers()
    h.wfile.write(body)


def js(body, status: int = 200, headers: dict | None = None) -> Answer:
    """Answer `body` (any JSON, NaN and Infinity included) with `status`."""
    return lambda h, kind, request, n: send(h, status, json.dumps(body).encode(), headers)


def raw(body: bytes, status: int = 200, headers: dict | None = None) -> Answer:
    return lambda h, kind, request, n: send(h, status, body, headers)


def edit(**changes) -> Answer:
    """The well-formed answer with fields changed (DROP removes one)."""

    def answer(h, kind, request, n):
        status, body = well_formed(kind, request, n)
        for key, value in changes.items():
            target = body["audit"] if key.startswith("audit.") else body
            key = key.removeprefix("audit.")
            if value is DROP:
                target.pop(key, None)
            else:
                target[key] = value
        send(h, status, json.dumps(body).encode())

    return answer


def edit_child(**changes) -> Answer:
    def answer(h, kind, request, n):
        status, body = well_formed(kind, request, n)
        body["children"][0].update(changes)
        send(h, status, json.dumps(body).encode())

    return answer


def trickle(headers_too: bool = False) -> Answer:
    """A byte every 0.1 s, for far longer than any deadline (until the client hangs up)."""

    def answer(h, kind, request, n):
        try:
            if headers_too:
                h.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for _ in range(2000):
                    h.wfile.write(b"X-Slow: a\r\n")
                    h.wfile.flush()
                    time.sleep(0.1)
                return
            h.send_response(200)
            h.send_header("Content-Length", "100000")
            h.end_headers()
            for _ in range(100000):
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass  # the client hung up at its deadline
        finally:
            h.close_connection = True

    return answer


def closed_mid_body(h, kind, request, n):
    h.send_response(200)
    h.send_header("Content-Length", "5000")
    h.end_headers()
    h.wfile.write(b'{"env_id": "e1", "gen')
    h.wfile.flush()
    h.connection.shutdown(socket.SHUT_RDWR)
    h.close_connection = True


def oversized(h, kind, request, n):
    """More than the size limit, chunked (no length said up front)."""
    h.send_response(200)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    piece = b" " * 2**20
    try:
        for _ in range(MAX_RESPONSE_BYTES // len(piece) + 2):
            h.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        h.wfile.write(b"0\r\n\r\n")
    except OSError:
        pass
    h.close_connection = True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's pool uses it

    def log_message(self, *args):  # quiet
        pass

    def _kind(self) -> str:
        path = self.path.rstrip("/")
        if path == "/v1/health":
            return "health"
        if path == "/v1/envs":
            return "create"
        if self.command == "DELETE":
            return "close"
        return {"screenshot": "observe"}.get(path.rsplit("/", 1)[-1], path.rsplit("/", 1)[-1])

    def _serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        server: Host = self.server  # type: ignore[assignment]
        kind = self._kind()
        with server.lock:
            server.hits[kind] += 1
            server.tokens.add(self.headers.get("Authorization"))
            n = sum(server.hits.values())
            scripted = server.script.get(kind)
            if scripted and scripted[1] is not None:
                server.script[kind] = (scripted[0], scripted[1] - 1) if scripted[1] > 1 else None
        if scripted:
            scripted[0](self, kind, request, n)
        else:
            status, body = well_formed(kind, request, n)
            send(self, status, json.dumps(body).encode())

    do_GET = do_POST = do_DELETE = _serve


class Host(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.hits: Counter = Counter()
        self.tokens: set = set()
        self.script: dict[str, tuple[Answer, int | None] | None] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(scope="module")
def hosts():
    servers = [Host(), Host()]  # the Drums host, and another a redirect points to
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def backend(hosts):
    with DrumsBackend(
        hosts[0].url,
        token=TOKEN,
        step_timeout_s=STEP_S,
        create_timeout_s=CREATE_S,
        retries=1,
        backoff_s=0,
        full_retries=2,
        full_backoff_s=0,
    ) as backend:
        yield backend


@dataclass(frozen=True)
class Row:
    id: str
    stage: str  # create | step | observe | fork | verify
    answer: Answer
    gate: str | None = "host_answer"  # the failed gate; None: a refusal or a valid outcome
    says: str = ""  # in the reason (the audit's host_answer_error / error)
    times: int | None = None  # the scripted answer this many times, then well-formed ones
    refused: type[Exception] | None = None  # a clean one-line refusal instead
    verdict: str | None = None  # expected verdict, where not the gate's


HA, REACH, TIMEOUT = "host_answer", "host_reachable", "step_timeout"
VALID = {"valid": True, "verdict": "valid", "failed_gates": []}

ROWS = [
    # create: the body
    Row("create-invalid-json", "create", raw(b"{not json"), says="not JSON"),
    Row("create-json-array", "create", js([1, 2, 3]), says="not a JSON object"),
    Row("create-empty-body", "create", raw(b""), says="not JSON"),
    Row("create-not-utf8", "create", raw(b'{"env_id": "\xff"}'), says="not JSON"),
    Row("create-deep-nesting", "create", raw(b"[" * 100000 + b"]" * 100000), says="nests"),
    Row("create-missing-env-id", "create", edit(env_id=DROP), says="env_id"),
    Row("create-env-id-int", "create", edit(env_id=5), says="env_id"),
    Row("create-env-id-path", "create", edit(env_id="../health"), says="env_id"),
    Row("create-env-id-long", "create", edit(env_id="e" * 200), says="env_id"),
    Row("create-valid-string-false", "create", edit(valid="false"), says="valid must be"),
    Row("create-valid-one", "create", edit(valid=1), says="valid must be"),
    Row("create-missing-valid", "create", edit(valid=DROP), says="valid must be"),
    Row("create-verdict-null", "create", edit(verdict=None), says="verdict"),
    Row("create-generation-negative", "create", edit(generation=-1), says="generation"),
    Row("create-generation-float", "create", edit(generation=1.5), says="generation"),
    Row("create-generation-string", "create", edit(generation="0"), says="generation"),
    Row("create-generation-bool", "create", edit(generation=True), says="generation"),
    Row("create-generation-nan", "create", edit(generation=float("nan")), says="NaN"),
    Row("create-generation-infinity", "create", edit(generation=float("inf")), says="Infinity"),
    Row("create-generation-1e400", "create", raw(b'{"generation": 1e400}'), says="float"),
    Row("create-failed-gates-int", "create", edit(failed_gates=5), says="failed_gates"),
    Row("create-failed-gates-of-ints", "create", edit(failed_gates=[5]), says="failed_gates"),
    Row("create-state-digest-int", "create", edit(state_sha256=5), says="state_sha256"),
    Row("create-timings-string", "create", edit(timings="x"), says="timings"),
    Row("create-screenshot-missing", "create", edit(screenshot_png=DROP), says="screenshot_png"),
    Row("create-screenshot-empty", "create", edit(screenshot_png=""), says="screenshot_png"),
    Row(
        "create-screenshot-garbage", "create", edit(screenshot_png="%%not base64%%"), says="base64"
    ),
    Row("create-screenshot-jpeg", "create", edit(screenshot_png=b64(png(fmt="JPEG"))), says="PNG"),
    Row(
        "create-screenshot-truncated", "create", edit(screenshot_png=b64(png()[:40])), says="decode"
    ),
    Row(
        "create-screenshot-bad-crc",
        "create",
        edit(screenshot_png=b64(bad_crc_png())),
        says="decode",
    ),
    Row(
        "create-screenshot-too-wide",
        "create",
        edit(screenshot_png=b64(png((5000, 4)))),
        says="5000x4",
    ),
    Row("create-screenshot-bomb", "create", edit(screenshot_png=b64(bomb_png())), says="Bomb"),
    Row(
        "create-screenshot-huge",
        "create",
        edit(screenshot_png="A" * (MAX_SCREENSHOT_B64 + 4)),
        says="characters",
    ),
    Row("create-body-over-limit", "create", oversized, says="over"),
    Row(
        "create-length-over-limit",
        "create",
        raw(b"{}", headers={"Content-Length": str(MAX_RESPONSE_BYTES + 1)}),
        says="over the limit",
    ),
    Row(
        "create-gzip-not-asked",
        "create",
        raw(gzip.compress(b"{}"), headers={"Content-Encoding": "gzip"}),
        says="gzip",
    ),
    Row("create-trickle-body", "create", trickle(), gate=TIMEOUT, says="within the timeout"),
    Row("create-trickle-headers", "create", trickle(headers_too=True), gate=TIMEOUT, says="within"),
    Row(
        "create-closed-mid-body", "create", closed_mid_body, gate=REACH, says="RemoteProtocolError"
    ),
    Row("create-500", "create", js({"error": "boom"}, 500), gate=REACH, says="host error 500"),
    Row("create-418", "create", js({"error": "teapot"}, 418), says="418"),
    Row("create-redirect-elsewhere", "create", None, says="not followed"),  # answer set below
    Row(
        "create-full-400",
        "create",
        js({"error": "host holds its maximum of 8 environments"}, 400),
        gate=REACH,
        says="still full after 3 tries",
    ),
    Row(
        "create-full-429",
        "create",
        js({"error": "slow down"}, 429, {"Retry-After": "0"}),
        gate=REACH,
        says="host full (429",
    ),
    Row(
        "create-full-503",
        "create",
        raw(b"<html>busy</html>", 503),
        gate=REACH,
        says="host full (503",
    ),
    Row("create-full-then-room", "create", js({"error": "at capacity"}, 503), gate=None, times=2),
    Row(
        "create-400-bad-task",
        "create",
        js({"error": "task t1: no\nsuch\nfamily " + "x" * 900}, 400),
        gate=None,
        refused=DrumsError,
    ),
    # step, observe
    Row("step-valid-string", "step", edit(valid="false"), says="valid must be"),
    Row("step-done-string", "step", edit(done="yes"), says="done must be"),
    Row("step-generation-negative", "step", edit(generation=-3), says="generation"),
    Row("step-screenshot-garbage", "step", edit(screenshot_png="@@@@"), says="base64"),
    Row("step-200-empty", "step", raw(b""), says="not JSON"),
    Row(
        "step-404",
        "step",
        js({"error": "no environment"}, 404),
        gate="session_known",
        says="no environment",
    ),
    Row(
        "step-409-garbled-gate",
        "step",
        js({"error": "q", "failed_gates": [{"x": 1}]}, 409),
        says="failed_gates",
    ),
    Row("step-400-not-ours", "step", js({"error": "malformed"}, 400), says="400"),
    Row("step-trickle", "step", trickle(), gate=TIMEOUT, says="within the timeout"),
    Row(
        "step-422-long-line",
        "step",
        js({"error": "off\nscreen " + "y" * 5000}, 422),
        gate=None,
        refused=ActionRejected,
    ),
    Row("observe-valid-string", "observe", edit(valid="true"), says="valid must be"),
    # fork
    Row(
        "fork-children-not-list", "fork", js({"children": {"a": 1}, "timings": {}}), says="children"
    ),
    Row(
        "fork-too-many-children",
        "fork",
        js({"children": [{"env_id": f"c{i}", "generation": 0, **VALID} for i in range(5)]}),
        says="children",
    ),
    Row("fork-child-valid-string", "fork", edit_child(valid="false"), says="valid must be"),
    Row(
        "fork-full-400",
        "fork",
        js({"error": "host holds its maximum of 8 environments"}, 400),
        gate=REACH,
        says="full",
    ),
    # verify
    Row("verify-score-half", "verify", edit(score=0.5), says="0 or 1"),
    Row(
        "verify-score-half-partial-credit",
        "verify",
        edit(score=0.5, **{"audit.partial_credit": True}),
        gate=None,
    ),
    Row("verify-score-null", "verify", edit(score=None), says="without a score"),
    Row("verify-score-missing", "verify", edit(score=DROP), says="without a score"),
    Row("verify-score-nan", "verify", edit(score=float("nan")), says="NaN"),
    Row("verify-score-infinity", "verify", raw(b'{"score": 1e999, "valid": true}'), says="float"),
    Row("verify-score-string", "verify", edit(score="1"), says="score must be"),
    Row("verify-score-bool", "verify", edit(score=True), says="score must be"),
    Row("verify-score-two", "verify", edit(score=2), says="0 or 1"),
    Row("verify-valid-string", "verify", edit(valid="false"), says="valid must be"),
    Row("verify-failed-gates-int", "verify", edit(failed_gates=5), says="failed_gates"),
    Row("verify-audit-string", "verify", edit(audit="xy"), says="audit"),
    Row("verify-trusted-string", "verify", edit(**{"audit.trusted": "no"}), says="trusted"),
    Row(
        "verify-audit-flags-string",
        "verify",
        edit(**{"audit.audit_flags": "nondeterministic"}),
        says="audit_flags",
    ),
    Row(
        "verify-partial-score-out-of-range",
        "verify",
        edit(**{"audit.partial_score": 3}),
        says="partial_score",
    ),
    Row(
        "verify-unknown-verdict", "verify", edit(verdict="lucky"), gate=None, verdict="env_failure"
    ),
    Row("verify-trickle", "verify", trickle(), gate=TIMEOUT, says="within the timeout"),
    Row("verify-500", "verify", js({"error": "down"}, 500), gate=REACH, says="host error 500"),
]


def test_the_table_has_rows_for_every_request():
    assert len(ROWS) >= 30 and len({r.id for r in ROWS}) == len(ROWS)
    assert {r.stage for r in ROWS} == {"create", "step", "observe", "fork", "verify"}


def check_invalid(outcome, row: Row) -> None:
    """An invalid attempt: no score, the row's gate, the reason kept in one short line."""
    gates = (row.gate,)
    if isinstance(outcome, Observation):
        assert (outcome.valid, outcome.failed_gates, outcome.screenshot) == (False, gates, None)
    else:
        assert (outcome.valid, outcome.score, outcome.reward) == (False, None, None)
        assert outcome.failed_gates == gates
        reason = outcome.audit["error"]
        assert row.says in reason and len(reason.splitlines()) == 1
        assert len(reason) <= LINE + 60  # the request's route and the line
        if row.gate == HA:
            assert outcome.audit["host_answer_error"] == reason
        assert outcome.trusted is False


def training_goes_on(backend) -> None:
    with backend.create(TASK) as session:
        assert session.valid and session.observation.screenshot.size == (8, 8)
        obs = session.step(CLICK)
        assert (obs.valid, obs.generation) == (True, 1)
        v = session.verify()
        assert (v.valid, v.score, v.trusted) == (True, 1.0, True)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_malformed_answer_is_an_invalid_attempt_and_training_goes_on(hosts, backend, row):
    host, elsewhere = hosts
    answer = row.answer
    if answer is None:  # a redirect to another host: never followed, the token never sent there
        location = f"{elsewhere.url}/v1/envs"
        answer = js({"error": "moved"}, 307, {"Location": location})
    host.script = {row.stage: (answer, row.times)}
    t0, creates = time.monotonic(), host.hits["create"]
    try:
        if row.refused is not None:
            with pytest.raises(row.refused) as refused:
                session = backend.create(TASK)
                session.step(CLICK)
            message = str(refused.value)
            assert len(message.splitlines()) == 1 and len(message) <= LINE + 60, message
            return
        session = backend.create(TASK)
        if row.stage == "create":
            outcome = session.observation
        elif row.stage == "step":
            outcome = session.step(CLICK)
        elif row.stage == "observe":
            outcome = session.observe()
        elif row.stage == "fork":
            children = session.fork(2)
            assert len(children) == 2
            if row.gate is not None:
                if row.id == "fork-child-valid-string":  # only the first child is malformed
                    assert children[1].valid
                    children[1].close()
                    children = children[:1]
                for child in children:
                    check_invalid(child.observation, row)
                    check_invalid(child.verify(), row)
                    child.close()
                outcome = None
        else:
            outcome = session.verify()
        if outcome is not None and row.gate is not None:
            check_invalid(outcome, row)
            if isinstance(outcome, Observation):
                assert session.step(CLICK) is outcome  # quarantined: no more steps
                check_invalid(session.verify(), row)
        elif row.id == "create-full-then-room":
            assert session.valid and host.hits["create"] - creates == 3  # full, full, room
        elif row.id == "verify-score-half-partial-credit":
            assert (outcome.valid, outcome.score, outcome.audit["partial_score"]) == (
                True,
                0.0,
                0.5,
            )
        elif row.verdict is not None:
            assert (outcome.valid, outcome.score, outcome.verdict) == (False, None, row.verdict)
        session.close()
    finally:
        host.script = {}
    # Every row ends within its deadlines: a trickle is cut off, never waited out.
    assert time.monotonic() - t0 < 4 * CREATE_S
    assert elsewhere.hits.total() == 0 and host.tokens == {f"Bearer {TOKEN}"}
    training_goes_on(backend)


def test_health_is_typed_too(hosts):
    host = hosts[0]
    host.script = {"health": (edit(can_fork="false"), None)}
    try:
        with (
            DrumsBackend(host.url, token=TOKEN) as backend,
            pytest.raises(DrumsError, match="can_fork must be a JSON bool"),
        ):
            backend.can_fork  # noqa: B018 - the property asks the host
    finally:
        host.script = {}


# --- a seeded fuzz: any field of any answer set to any hostile value ------------------------------

HOSTILE = [
    None, True, False, 0, 1, -1, 0.5, 2, 1e308, "", "false", "true", "x" * 300, "a b", "../x",
    "\n", [], [1], ["a b"], [None], {}, {"a": 1}, [[]], "valid",
]  # fmt: skip


def test_any_field_set_to_any_hostile_value_is_well_formed_or_invalid():
    """400 seeded mutations through the client (in memory): never an exception, and every
    outcome is a valid episode of well-typed values or an invalid one without a score."""
    rng = random.Random(20260801)
    for case in range(400):
        kind = rng.choice(["create", "step", "verify"])
        probe = {"generation": 0}
        fields = list(well_formed(kind, probe, 1)[1])
        if kind == "verify":
            fields += ["audit.trusted", "audit.audit_flags", "audit.partial_credit"]
        field, value = rng.choice(fields), rng.choice(HOSTILE)

        def host(request: httpx.Request, kind=kind, field=field, value=value) -> httpx.Response:
            path = request.url.path
            this = "create" if path == "/v1/envs" else path.rsplit("/", 1)[-1]
            if request.method == "DELETE":
                return httpx.Response(200, json={"closed": True})
            status, body = well_formed(this, json.loads(request.content or b"{}"), 1)
            if this == kind:
                target = body["audit"] if field.startswith("audit.") else body
                target[field.removeprefix("audit.")] = value
            return httpx.Response(status, json=body)

        mock = httpx.MockTransport(host)
        with DrumsBackend("http://drums.invalid", token=TOKEN, transport=mock) as backend:
            session = backend.create(TASK)
            obs = session.step(CLICK)
            v = session.verify()
            session.close()
        for o in (session.observation, obs):
            if o.valid:
                assert isinstance(o.screenshot, Image.Image) and type(o.generation) is int
                assert o.generation >= 0 and isinstance(o.done, bool)
            else:
                assert o.screenshot is None and all(isinstance(g, str) for g in o.failed_gates)
        assert isinstance(v, Verification), (case, kind, field, value)
        if v.valid:
            assert v.score in (0.0, 1.0) and v.trusted in (True, False, None)
        else:
            # (no failed gate where the host contradicted itself: protocol.reported)
            assert v.score is None and v.verdict != "valid", (case, kind, field, value)
        if not v.valid and str(Gate.HOST_ANSWER) in v.failed_gates:
            assert len(v.audit["host_answer_error"].splitlines()) == 1
