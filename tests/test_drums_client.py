"""The Drums client against the real embedded host on loopback (and its retry rule in isolation)."""

from __future__ import annotations

import base64
import io
import json
import logging
import secrets
from collections import Counter

import httpx
import pytest
from PIL import Image

from envab.envs import auth
from envab.envs.auth import TokenError
from envab.envs.drums import EMBEDDED, DrumsBackend, DrumsError, DrumsSession, connect, read_token
from envab.envs.host import serve_embedded
from envab.envs.protocol import ActionRejected, ForkUnsupported, Verification
from envab.envs.tasks.build import build
from envab.envs.validate import validate
from envab.hashing import sha256_json

CLICK_CORNER = {"action_type": "CLICK", "parameters": {"x": 1, "y": 1}}


@pytest.fixture(scope="module")
def taskset():
    tasks, solutions = build(seed=2, per_family=1)
    return tasks, {s["id"]: s for s in solutions}


@pytest.fixture(scope="module")
def token(tmp_path_factory):
    value = "tok-" + secrets.token_hex(16)
    path = tmp_path_factory.mktemp("secret") / "token"
    path.write_text(value)
    return value, path


@pytest.fixture(scope="module")
def fork_backend(token, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "fork.log"
    with (
        serve_embedded(
            "fork", token[1], allow_faults=True, step_timeout_s=1.0, log_path=log
        ) as url,
        DrumsBackend(url, token_file=token[1]) as backend,
    ):
        yield backend


@pytest.fixture(scope="module")
def restore_backend():
    # How the pipeline opens an arm that says `url: embedded` (a fresh token of its own).
    with connect(EMBEDDED, mode="restore") as backend:
        yield backend


def task_named(taskset, family: str) -> tuple[dict, list[dict]]:
    tasks, solutions = taskset
    task = next(t for t in tasks if t["family"] == family)
    return task, solutions[task["id"]]["oracle"]


def test_oracle_scores_one_and_noop_zero(fork_backend, taskset):
    task, oracle = task_named(taskset, "check_group")
    with fork_backend.create(task) as noop, fork_backend.create(task) as session:
        first = session.observation
        assert first.valid and first.generation == 0
        assert isinstance(first.screenshot, Image.Image) and first.screenshot.size == (128, 128)
        for action in oracle:
            obs = session.step(action)
        assert obs.valid and obs.generation == len(oracle)
        assert obs.screenshot.tobytes() != first.screenshot.tobytes()
        v = session.verify()
        assert isinstance(v, Verification)
        assert (v["score"], v.reward, v.valid, v.verdict) == (1.0, 1.0, True, "valid")
        assert noop.verify()["score"] == 0.0


def test_fork_children_start_in_the_parents_state(fork_backend, taskset):
    task, oracle = task_named(taskset, "sequence3")
    parent = fork_backend.create(task)
    parent.step(oracle[0])
    children = parent.fork(8)
    assert len(children) == 8 and all(isinstance(c, DrumsSession) for c in children)
    for child in children:
        assert child.valid and child.parent == parent.env_id
        assert child.observation.state_sha256 == parent.observation.state_sha256
        assert child.generation == parent.generation
        for action in oracle[1:]:
            child.step(action)
        assert child.verify()["score"] == 1.0
        child.close()
    assert parent.verify()["score"] == 0.0  # the children's progress is theirs alone
    parent.close()


def test_validator_accepts_the_tasks_over_http(fork_backend, taskset):
    tasks, solutions = taskset
    results = validate(fork_backend.create, tasks, solutions.values())
    assert len(results) == 8 and [r.reasons for r in results if not r.accepted] == []
    assert all(p.valid for r in results for p in r.plays)


def test_only_a_fork_host_forks(fork_backend, restore_backend, taskset):
    assert fork_backend.can_fork is True and restore_backend.can_fork is False
    task, oracle = task_named(taskset, "click_button")
    with restore_backend.create(task) as session:
        with pytest.raises(ForkUnsupported):
            session.fork(2)
        session.step(oracle[0])
        assert session.verify()["score"] == 1.0


def test_stale_generation_is_invalid(fork_backend, taskset):
    task, oracle = task_named(taskset, "type_field")
    with fork_backend.create(task) as session:
        session.step(CLICK_CORNER)
        obs = session.step(oracle[0], generation=0)
        assert (obs.valid, obs.verdict, obs.failed_gates) == (
            False,
            "stale_generation",
            ("generation",),
        )
        v = session.verify()
        assert (v.valid, v.score, v.verdict) == (False, None, "stale_generation")


@pytest.mark.parametrize(
    ("faults", "verdict", "gate"),
    [
        ({"corrupt_restore": True}, "state_mismatch", "state_hash"),
        ({"kill_at_step": 1}, "env_failure", "worker_alive"),
        ({"blank_at_step": 1}, "blank_screen", "screen_not_blank"),
        ({"stale_at_step": 1}, "stale_generation", "screen_current"),
        ({"verifier_unavailable": True}, "verifier_unavailable", "verifier_available"),
        # A gate this client has never heard of: an environment failure under its own name.
        ({"unknown_gate_at_step": 1}, "env_failure", "display_compositor"),
    ],
)
def test_gate_failures_reach_the_caller_as_invalid_never_zero(
    fork_backend, taskset, faults, verdict, gate
):
    task, oracle = task_named(taskset, "click_button")
    with fork_backend.create(task, faults=faults) as session:
        obs = session.observation
        if obs.valid:
            obs = session.step(oracle[0])
        if gate != "verifier_available":
            assert (obs.valid, obs.verdict, obs.failed_gates, obs.screenshot) == (
                False,
                verdict,
                (gate,),
                None,
            )
            assert session.step(CLICK_CORNER) is obs  # quarantined: no more steps
            children = session.fork(3)
            assert {(c.observation.verdict, c.observation.failed_gates) for c in children} == {
                (verdict, (gate,))
            }
        v = session.verify()
        assert (v.valid, v.score, v.reward, v.verdict, v.failed_gates) == (
            False,
            None,
            None,
            verdict,
            (gate,),
        )


def test_a_client_side_timeout_is_invalid_and_not_retried(fork_backend, token, taskset):
    task, oracle = task_named(taskset, "click_button")
    with DrumsBackend(fork_backend.url, token_file=token[1], step_timeout_s=0.3) as impatient:
        session = impatient.create(task, faults={"stall_at_step": 1})
        obs = session.step(oracle[0])
        assert (obs.valid, obs.verdict, obs.failed_gates) == (False, "timeout", ("step_timeout",))
        assert session.verify().verdict == "timeout"
        session.close()


def created() -> dict:
    """A host's answer to create: a valid environment with a 4x4 screenshot."""
    png = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(png, "PNG")
    return {
        "env_id": "e1",
        "generation": 0,
        "valid": True,
        "verdict": "valid",
        "failed_gates": [],
        "state_sha256": "0" * 64,
        "timings": {},
        "screenshot_png": base64.b64encode(png.getvalue()).decode(),
    }


def test_a_quarantine_and_an_unknown_answer_keep_the_hosts_gate_names():
    """409 names the gate that quarantined the environment; an answer with a verdict or gate
    the client does not know is an environment failure that keeps what the host said."""
    new = created()

    def host(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/envs":
            return httpx.Response(201, json=new)
        if path.endswith("/fork"):
            body = {"error": "environment e1 failed", "failed_gates": ["state_hash"]}
            return httpx.Response(409, json=body)
        if path.endswith("/step"):
            body = {**new, "valid": False, "verdict": "sandbox_oom", "failed_gates": ["oom"]}
            return httpx.Response(200, json={**body, "screenshot_png": None, "done": False})
        if path.endswith("/verify"):
            body = {"score": 1.0, "valid": True, "verdict": "lucky", "failed_gates": []}
            return httpx.Response(200, json=body)
        return httpx.Response(204)

    backend = DrumsBackend("http://drums.invalid", token="t", transport=httpx.MockTransport(host))
    children = backend.create({"id": "t1"}).fork(2)
    assert [(c.valid, c.observation.verdict, c.observation.failed_gates) for c in children] == [
        (False, "state_mismatch", ("state_hash",))
    ] * 2
    obs = backend.create({"id": "t1"}).step(CLICK_CORNER)
    assert (obs.valid, obs.verdict, obs.failed_gates) == (False, "env_failure", ("oom",))
    v = backend.create({"id": "t1"}).verify()
    assert (v.valid, v.score, v.verdict) == (False, None, "env_failure")
    assert v.audit["host_answer"] == {"verdict": "lucky", "valid": True}


@pytest.mark.parametrize(
    ("audit", "trusted", "flags"),
    [
        (None, None, ()),  # an older drumsd sends no audit: unknown, never True by default
        ({"trusted": True, "audit_flags": []}, True, ()),
        ({"trusted": True, "audit_flags": ["nondeterministic"]}, False, ("nondeterministic",)),
        ({"trusted": False, "audit_flags": ["redundant_disagree"]}, False, ("redundant_disagree",)),
        ({"trusted": None, "audit_flags": ["scope_unchecked"]}, None, ("scope_unchecked",)),
    ],
)
def test_the_audit_says_trusted_or_unknown_and_never_changes_the_score(audit, trusted, flags):
    """drums-verifiers: trusted is True only for a valid, scored episode with no audit flag, and
    None when the host sent no audit; the score and validity stay the host's."""

    def host(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/envs":
            return httpx.Response(201, json=created())
        body = {"score": 1.0, "valid": True, "verdict": "valid", "failed_gates": []}
        return httpx.Response(200, json={**body, **({"audit": audit} if audit else {})})

    backend = DrumsBackend("http://drums.invalid", token="t", transport=httpx.MockTransport(host))
    v = backend.create({"id": "t1"}).verify()
    assert (v.valid, v.score, v.trusted, v.audit_flags) == (True, 1.0, trusted, flags)


def test_retries_only_idempotent_calls():
    calls: Counter = Counter()
    new = created()

    def host(request: httpx.Request) -> httpx.Response:
        key = (request.method, request.url.path)
        calls[key] += 1
        if key == ("POST", "/v1/envs"):
            return httpx.Response(201, json=new)
        raise httpx.ReadError("connection dropped mid-answer", request=request)

    backend = DrumsBackend(
        "http://drums.invalid",
        token="t",
        retries=2,
        backoff_s=0,
        transport=httpx.MockTransport(host),
    )
    stepping, verifying = backend.create({"id": "t1"}), backend.create({"id": "t1"})
    obs = stepping.step(CLICK_CORNER)
    assert (obs.valid, obs.verdict, obs.failed_gates) == (False, "env_failure", ("host_reachable",))
    v = verifying.verify()
    assert (v.valid, v.score, v.verdict) == (False, None, "env_failure")
    verifying.close()
    assert calls == {
        ("POST", "/v1/envs"): 2,
        ("POST", "/v1/envs/e1/step"): 1,
        ("POST", "/v1/envs/e1/verify"): 3,
        ("DELETE", "/v1/envs/e1"): 3,
    }

    calls.clear()

    def refused(request: httpx.Request) -> httpx.Response:
        calls[request.method] += 1
        raise httpx.ConnectError("connection refused", request=request)

    backend = DrumsBackend(
        "http://drums.invalid",
        token="t",
        retries=2,
        backoff_s=0,
        transport=httpx.MockTransport(refused),
    )
    session = backend.create({"id": "t1"})  # never reached the host: safe to retry
    assert calls["POST"] == 3
    assert (session.valid, session.observation.verdict, session.env_id) == (
        False,
        "env_failure",
        None,
    )
    assert session.verify().failed_gates == ("host_reachable",)


def test_a_dead_host_gives_invalid_verdicts(token, taskset):
    task, oracle = task_named(taskset, "click_button")
    with serve_embedded("restore", token[1]) as url:
        backend = DrumsBackend(url, token_file=token[1], retries=1, backoff_s=0.01)
        session = backend.create(task)
        assert session.valid
    obs = session.step(oracle[0])
    assert (obs.valid, obs.verdict, obs.failed_gates) == (False, "env_failure", ("host_reachable",))
    v = session.verify()
    assert (v.valid, v.score, v.verdict) == (False, None, "env_failure")
    session.close()  # harmless
    late = backend.create(task)
    assert (late.valid, late.observation.failed_gates) == (False, ("host_reachable",))


@pytest.mark.parametrize("mode", ["restore", "fork"])
def test_a_host_that_restarts_mid_step_loses_its_environments_and_comes_back(
    token, taskset, tmp_path, mode
):
    """The host dies during one environment's step (as on a crash or reboot) and its supervisor
    starts it again on the same socket: that step is host_reachable, every other environment it
    held is session_known (the new host never heard of it), both env_failure; the next create is
    served as if nothing happened."""
    task, oracle = task_named(taskset, "click_button")
    log = tmp_path / "host.log"
    with (
        serve_embedded(mode, token[1], allow_faults=True, log_path=log) as url,
        DrumsBackend(url, token_file=token[1]) as backend,
    ):
        dying = backend.create(task, faults={"restart_host_at_step": 1})
        bystander = backend.create(task)
        assert dying.valid and bystander.valid
        obs = dying.step(oracle[0])
        assert (obs.valid, obs.verdict, obs.failed_gates) == (
            False,
            "env_failure",
            ("host_reachable",),
        )
        obs = bystander.step(oracle[0])
        assert (obs.valid, obs.verdict, obs.failed_gates) == (
            False,
            "env_failure",
            ("session_known",),
        )
        for session in (dying, bystander):
            v = session.verify()
            assert (v.valid, v.score, v.verdict) == (False, None, "env_failure")
        with backend.create(task) as fresh:
            assert fresh.step(oracle[0]).valid and fresh.verify().score == 1.0
    lines = log.read_text()
    assert "2 environments lost" in lines and "starting it again (restart 1)" in lines


def test_a_task_is_created_by_id_from_the_tasks_the_host_serves(token, taskset, tmp_path):
    """drums-verifiers creates an environment from a task or by its id (drumsd serves OSWorld's
    tasks from its pinned checkout): the embedded host serves a tasks.jsonl by id, and says by a
    digest which task it set up, so a caller can hold it to its frozen copy."""
    tasks, _ = taskset
    served = tmp_path / "tasks.jsonl"
    served.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    task, oracle = task_named(taskset, "click_button")
    with (
        serve_embedded("fork", token[1], extra_args=["--tasks", str(served)]) as url,
        DrumsBackend(url, token_file=token[1]) as backend,
    ):
        with backend.create_by_id(task["id"]) as session:
            assert session.valid and session.task_sha256 == sha256_json(task)
            for action in oracle:
                session.step(action)
            assert session.verify().score == 1.0
        with backend.create(task) as whole:  # sent whole: the same task, the same digest
            assert whole.task_sha256 == sha256_json(task)
        with pytest.raises(DrumsError, match="unknown task_id 'nope': this host serves"):
            backend.create_by_id("nope")


def test_a_refused_action_is_the_protocols_action_rejected_with_the_hosts_line(
    fork_backend, taskset
):
    task, oracle = task_named(taskset, "click_button")
    session = fork_backend.create(task)
    off_screen = {"action_type": "CLICK", "parameters": {"x": 999, "y": 1}}
    with pytest.raises(ActionRejected) as refused:  # the host answered 422
        session.step(off_screen)
    assert isinstance(refused.value, ValueError)
    assert len(str(refused.value).splitlines()) == 1 and "outside" in str(refused.value)
    for action in oracle:  # nothing changed: the episode goes on and succeeds
        session.step(action)
    assert session.verify().score == 1.0
    session.close()


def test_token_sources_and_secrecy(fork_backend, token, taskset, monkeypatch, caplog):
    value, path = token
    monkeypatch.delenv("DRUMS_TOKEN", raising=False)
    monkeypatch.setenv("DRUMS_TOKEN_FILE", str(path))
    assert read_token() == value
    monkeypatch.delenv("DRUMS_TOKEN_FILE")
    monkeypatch.setenv("DRUMS_TOKEN", "from-env")
    assert read_token() == "from-env"
    # Neither variable: the host's default file, /etc/drums/token, as drumsd keeps it.
    default = path.parent / "etc-drums-token"
    monkeypatch.setattr(auth, "DEFAULT_TOKEN_FILE", str(default))
    assert read_token() == "from-env"  # a variable beats the default file
    monkeypatch.delenv("DRUMS_TOKEN")
    default.write_text("from-default\n")
    assert read_token() == "from-default"
    default.unlink()
    with pytest.raises(TokenError, match="^no Drums token: set DRUMS_TOKEN_FILE or DRUMS_TOKEN"):
        read_token()
    with pytest.raises(DrumsError, match="^no Drums token"):  # the backend's own error, as before
        DrumsBackend(fork_backend.url)
    with pytest.raises(DrumsError, match=f"^token file {path.parent / 'nope'}: No such file"):
        DrumsBackend(fork_backend.url, token_file=path.parent / "nope")

    caplog.set_level(logging.DEBUG)  # httpx and httpcore included
    task, oracle = task_named(taskset, "click_button")
    session = fork_backend.create(task, faults={"kill_at_step": 1})
    session.step(oracle[0])
    texts = [repr(fork_backend), repr(session), str(session.verify().to_dict())]
    session.close()
    with (
        DrumsBackend(fork_backend.url, token=value + "x") as wrong,
        pytest.raises(DrumsError, match="refused the token") as refused,
    ):
        wrong.health()
    texts.append(str(refused.value))
    texts.append(caplog.text)
    assert "HTTP Request" in caplog.text  # the capture saw the client's traffic
    for text in texts:
        assert value not in text
