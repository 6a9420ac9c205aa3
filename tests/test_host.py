"""The embedded host over real HTTP on loopback: protocol, gates, faults, fork, token handling,
with each environment in a gVisor sandbox (real runsc, where it runs) and as a plain process."""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from envab.envs.host import serve_embedded
from envab.envs.host.gvisor import gvisor_problem
from envab.envs.tasks.build import build

STEP_TIMEOUT_S = 1.0  # short, so the stall fault costs about a second


@pytest.fixture(scope="module")
def taskset():
    tasks, solutions = build(seed=1, per_family=1)
    return {t["id"]: t for t in tasks}, {s["id"]: s for s in solutions}


@pytest.fixture(scope="module")
def token(tmp_path_factory):
    value = "tok-" + secrets.token_hex(16)
    path = tmp_path_factory.mktemp("secret") / "token"
    path.write_text(value + "\n")
    return value, path


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("logs")


def needs_gvisor(sandbox: str) -> None:
    if sandbox == "gvisor" and gvisor_problem():
        pytest.skip(f"gVisor sandbox: {gvisor_problem()}")


@pytest.fixture(scope="module", params=["gvisor", "process"])
def sandbox(request):
    needs_gvisor(request.param)
    return request.param


@pytest.fixture(scope="module")
def fork_host(token, logs, sandbox):
    _, path = token
    with serve_embedded(
        "fork",
        path,
        allow_faults=True,
        step_timeout_s=STEP_TIMEOUT_S,
        log_path=logs / f"fork-{sandbox}.log",
        extra_args=["--access-log"],
        sandbox=sandbox,
    ) as url:
        yield url


@pytest.fixture(scope="module")
def restore_host(token, logs, sandbox):
    _, path = token
    with serve_embedded(
        "restore",
        path,
        log_path=logs / f"restore-{sandbox}.log",
        extra_args=["--access-log"],
        sandbox=sandbox,
    ) as url:
        yield url


def api(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@pytest.fixture
def fork_api(fork_host, token):
    with api(fork_host, token[0]) as client:
        yield client


@pytest.fixture
def restore_api(restore_host, token):
    with api(restore_host, token[0]) as client:
        yield client


def create(client, task, faults=None) -> dict:
    body = {"task": task} | ({"faults": faults} if faults else {})
    r = client.post("/v1/envs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def step(client, env: dict, action: dict, generation: int | None = None) -> dict:
    gen = env["generation"] if generation is None else generation
    r = client.post(f"/v1/envs/{env['env_id']}/step", json={"action": action, "generation": gen})
    assert r.status_code == 200, r.text
    return r.json()


def play(client, env: dict, actions: list[dict]) -> dict:
    for action in actions:
        env = step(client, env, action)
    return env


def verify(client, env: dict) -> dict:
    r = client.post(f"/v1/envs/{env['env_id']}/verify")
    assert r.status_code == 200, r.text
    return r.json()


def screenshot(body: dict) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(body["screenshot_png"])))


CLICK_CORNER = {"action_type": "CLICK", "parameters": {"x": 1, "y": 1}}


# --- the protocol ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fork", "restore"])
def test_create_step_verify_separates_oracle_from_noop(mode, fork_api, restore_api, taskset):
    client = fork_api if mode == "fork" else restore_api
    tasks, solutions = taskset
    task_id = "form_two-s1-000"
    task = tasks[task_id]
    env = create(client, task)
    assert env["valid"] and env["generation"] == 0
    assert env["state_sha256"] == task["evaluator"]["initial_state_sha256"]
    assert screenshot(env).size == (128, 128)

    noop = create(client, task)
    v = verify(client, noop)
    assert (v["valid"], v["score"], v["verdict"]) == (True, 0.0, "valid")

    oracle = solutions[task_id]["oracle"]
    end = play(client, env, oracle)
    assert end["valid"] and end["generation"] == len(oracle)
    assert end["state_sha256"] != env["state_sha256"]
    v = verify(client, end)
    assert (v["valid"], v["score"], v["failed_gates"]) == (True, 1.0, [])
    assert v["audit"]["trusted"] is True and v["audit"]["steps"] == len(oracle)
    for e in (env, noop):
        assert client.delete(f"/v1/envs/{e['env_id']}").json()["closed"] is True
    assert client.delete(f"/v1/envs/{env['env_id']}").json()["closed"] is False  # twice: harmless


def test_fork_into_8_children_in_the_parents_exact_state(fork_api, taskset):
    tasks, solutions = taskset
    task_id = "sequence3-s1-000"
    oracle = solutions[task_id]["oracle"]
    assert len(oracle) >= 2
    parent = play(fork_api, create(fork_api, tasks[task_id]), oracle[:1])

    r = fork_api.post(f"/v1/envs/{parent['env_id']}/fork", json={"n": 8})
    assert r.status_code == 200, r.text
    children = r.json()["children"]
    assert len(children) == 8 and len({c["env_id"] for c in children}) == 8
    for c in children:
        assert c["valid"], c
        assert c["state_sha256"] == parent["state_sha256"]
        assert c["generation"] == parent["generation"]

    # Children are independent copies, each in its own process (and sandbox): half finish the
    # task, half do something else.
    pids, containers = set(), set()
    for i, c in enumerate(children):
        end = play(fork_api, c, oracle[1:] if i % 2 == 0 else [CLICK_CORNER])
        v = verify(fork_api, end)
        assert v["score"] == (1.0 if i % 2 == 0 else 0.0)
        pids.add(v["audit"]["worker_pid"])
        containers.add(v["audit"]["sandbox"].get("container"))
    v = verify(fork_api, parent)  # the parent was not touched by its children
    assert v["valid"] and v["audit"]["state_sha256"] == parent["state_sha256"]
    assert len(pids | {v["audit"]["worker_pid"]}) == 9
    if v["audit"]["sandbox"]["runtime"] == "gvisor":  # woken, the parent runs in a copy
        assert len(containers | {v["audit"]["sandbox"]["container"]}) == 9
        assert v["audit"]["sandbox"]["network"] == "none" and v["audit"]["sandbox"]["memory_mib"]


def test_restore_host_cannot_fork(restore_api, taskset):
    env = create(restore_api, next(iter(taskset[0].values())))
    r = restore_api.post(f"/v1/envs/{env['env_id']}/fork", json={"n": 2})
    assert r.status_code == 501 and "restore mode" in r.json()["error"]


def test_stale_generation_is_invalid_and_quarantines(fork_api, taskset):
    tasks, solutions = taskset
    task_id = "click_button-s1-000"
    env = step(fork_api, create(fork_api, tasks[task_id]), CLICK_CORNER)
    assert env["generation"] == 1
    stale = step(fork_api, env, solutions[task_id]["oracle"][0], generation=0)
    assert (stale["valid"], stale["verdict"], stale["failed_gates"]) == (
        False,
        "stale_generation",
        ["generation"],
    )
    assert stale["screenshot_png"] is None
    again = step(fork_api, env, CLICK_CORNER, generation=1)  # quarantined: nothing runs
    assert again["verdict"] == "stale_generation" and again["generation"] == 1
    v = verify(fork_api, env)
    assert (v["valid"], v["score"], v["verdict"]) == (False, None, "stale_generation")


@pytest.mark.parametrize(
    ("faults", "verdict", "gate", "at_create"),
    [
        ({"corrupt_restore": True}, "state_mismatch", "state_hash", True),
        ({"kill_at_step": 1}, "env_failure", "worker_alive", False),
        ({"stall_at_step": 1}, "timeout", "step_timeout", False),
        ({"blank_at_step": 1}, "blank_screen", "screen_not_blank", False),
        ({"stale_at_step": 1}, "stale_generation", "screen_current", False),
        ({"verifier_unavailable": True}, "verifier_unavailable", "verifier_available", None),
        ({"unknown_gate_at_step": 1}, "env_failure", "display_compositor", False),
    ],
)
def test_each_fault_gives_its_verdict_and_gate(fork_api, taskset, faults, verdict, gate, at_create):
    tasks, solutions = taskset
    task_id = "click_button-s1-000"
    env = create(fork_api, tasks[task_id], faults)
    if at_create:
        assert (env["valid"], env["verdict"], env["failed_gates"]) == (False, verdict, [gate])
    else:
        assert env["valid"]
        env = step(fork_api, env, solutions[task_id]["oracle"][0])
        if at_create is False:
            assert (env["valid"], env["verdict"], env["failed_gates"]) == (False, verdict, [gate])
            r = fork_api.post(f"/v1/envs/{env['env_id']}/fork", json={"n": 2})
            assert r.status_code == 409  # a quarantined environment is never copied
            assert r.json()["failed_gates"] == [gate]  # and the refusal says by which gate
    v = verify(fork_api, env)
    # The oracle ran (or would have), yet no score: an invalid episode is never a 0 or a 1.
    assert (v["valid"], v["score"], v["verdict"], v["failed_gates"]) == (
        False,
        None,
        verdict,
        [gate],
    )
    assert v["audit"]["trusted"] is False


def test_a_lost_zygote_is_replaced(restore_api, taskset, sandbox):
    if sandbox == "gvisor":
        pytest.skip("a gVisor host has no zygote: each environment restores a checkpoint")
    before = restore_api.get("/v1/health").json()["zygote_pid"]
    os.kill(before, signal.SIGKILL)
    env = create(restore_api, next(iter(taskset[0].values())))
    assert env["valid"]
    assert restore_api.get("/v1/health").json()["zygote_pid"] not in (None, before)


def test_checker_that_cannot_run_is_verifier_unavailable(fork_api, taskset):
    task = dict(next(iter(taskset[0].values())))
    task["evaluator"] = {**task["evaluator"], "func": "no_such_checker"}
    v = verify(fork_api, create(fork_api, task))
    assert (v["valid"], v["score"], v["verdict"]) == (False, None, "verifier_unavailable")
    assert "checker_crash" in v["audit"]["flags"]


def test_bad_requests_get_one_clear_line(fork_api, restore_api, taskset):
    task = dict(next(iter(taskset[0].values())))
    del task["evaluator"]
    r = fork_api.post("/v1/envs", json={"task": task})
    assert r.status_code == 400 and "evaluator" in r.json()["error"]
    env = create(fork_api, next(iter(taskset[0].values())))
    r = fork_api.post(
        f"/v1/envs/{env['env_id']}/step", json={"action": {"action_type": "JUMP"}, "generation": 0}
    )
    assert r.status_code == 400 and "JUMP" in r.json()["error"]
    r = fork_api.post(
        f"/v1/envs/{env['env_id']}/step",
        json={
            "action": {"action_type": "CLICK", "parameters": {"x": 999, "y": 1}},
            "generation": 0,
        },
    )
    assert r.status_code == 422 and "outside" in r.json()["error"]  # the desktop refused it
    assert step(fork_api, env, CLICK_CORNER)["valid"]  # and the environment lives on
    assert fork_api.post("/v1/envs/nope/verify").status_code == 404
    tiny = json.loads(json.dumps(next(iter(taskset[0].values()))))
    tiny["config"][0]["parameters"] = {"width": 8, "height": 8}
    r = fork_api.post("/v1/envs", json={"task": tiny})
    assert r.status_code == 400 and "screen 8x8 is not whole pixels" in r.json()["error"]
    assert create(fork_api, next(iter(taskset[0].values())))["valid"]  # the host lives on
    # Fault switches are refused by a host started without --allow-faults.
    r = restore_api.post(
        "/v1/envs", json={"task": next(iter(taskset[0].values())), "faults": {"kill_at_step": 1}}
    )
    assert r.status_code == 403


# --- the token ---------------------------------------------------------------------------------


def test_every_route_refuses_a_request_without_the_token(fork_host, token, taskset):
    task = next(iter(taskset[0].values()))
    calls = [
        ("GET", "/v1/health", None),
        ("POST", "/v1/envs", {"task": task}),
        ("POST", "/v1/envs/x/step", {"action": CLICK_CORNER, "generation": 0}),
        ("POST", "/v1/envs/x/fork", {"n": 1}),
        ("POST", "/v1/envs/x/verify", None),
        ("DELETE", "/v1/envs/x", None),
        ("GET", "/docs", None),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token[0]}):
        with httpx.Client(base_url=fork_host, headers=headers) as client:
            for method, path, body in calls:
                r = client.request(method, path, json=body)
                assert r.status_code == 401, (method, path, headers)
    with api(fork_host, token[0]) as client:
        before = client.get("/v1/health").json()["environments"]
    with httpx.Client(base_url=fork_host) as client:
        client.post("/v1/envs", json={"task": task})
    with api(fork_host, token[0]) as client:  # the refused create made nothing
        assert client.get("/v1/health").json()["environments"] == before


def test_the_host_binds_loopback_unless_told_otherwise(fork_host):
    from envab.envs.host.__main__ import parse_args

    assert fork_host.startswith("http://127.0.0.1:")  # the embedded host, as jobs start it
    assert parse_args(["--mode", "fork", "--port", "0", "--token-file", "t"]).bind == "127.0.0.1"


def test_tokens_are_compared_in_constant_time(monkeypatch):
    """Every request's token goes through hmac.compare_digest (a == would leak, byte by byte,
    how much of a guess was right through its timing)."""
    import hmac

    from envab.envs.host import app as host_app

    compared, original = [], hmac.compare_digest

    def compare(a, b):
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(host_app.hmac, "compare_digest", compare)
    from fastapi.testclient import TestClient

    from envab.envs.host.pool import HostConfig

    app = host_app.build_app(HostConfig(mode="fork"), "s3cret")
    client = TestClient(app)  # no lifespan: nothing here needs the pool to be running
    guess, right = {"Authorization": "Bearer guess"}, {"Authorization": "Bearer s3cret"}
    assert client.get("/v1/health", headers=guess).status_code == 401
    assert client.delete("/v1/envs/x", headers=right).status_code == 200  # closing is idempotent
    assert compared == [(b"Bearer guess", b"Bearer s3cret"), (b"Bearer s3cret", b"Bearer s3cret")]


def test_a_task_cannot_reach_outside_the_desktop(fork_api, tmp_path):
    """OSWorld set-up steps that would run commands or write files (execute, download, open) are
    no step of this desktop: the environment fails its set-up gate and nothing is written."""
    escaped = tmp_path / "escaped"
    for step in (
        {"type": "execute", "parameters": {"command": ["touch", str(escaped)]}},
        {"type": "download", "parameters": {"files": [{"path": str(escaped), "url": "x"}]}},
        {"type": "open", "parameters": {"path": str(escaped)}},
    ):
        task = {
            "id": "escape",
            "instruction": "Click OK.",
            "config": [{"type": "screen", "parameters": {"width": 128, "height": 128}}, step],
            "evaluator": {"func": "check_click", "initial_state_sha256": "0" * 64},
        }
        env = create(fork_api, task)
        assert (env["valid"], env["failed_gates"]) == (False, ["setup"]), step["type"]
    assert not escaped.exists()
    # The same task without that step sets up (it fails only its made-up state hash).
    task["config"] = task["config"][:1]
    assert create(fork_api, task)["failed_gates"] == ["state_hash"]


@pytest.mark.parametrize("content", [None, " \n"])
def test_a_host_without_a_usable_token_file_exits_with_one_line(tmp_path, content):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "envab.envs.host",
            "--mode",
            "fork",
            "--port",
            "0",
            "--token-file",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    reason = "No such file or directory" if content is None else None
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"token file {path}: {reason}" if reason else f"token file {path} is empty"
    ]


def test_the_token_appears_in_no_log(fork_host, restore_host, token, logs):
    # Runs last in this module: the logs hold every request made above (access log is on).
    texts = {p.name: p.read_text() for p in logs.iterdir()}
    fork = "".join(text for name, text in texts.items() if name.startswith("fork-"))
    assert "POST /v1/envs" in fork and "quarantined" in fork
    for name, text in texts.items():
        assert token[0] not in text, name


def test_a_fork_arms_each_child_with_its_own_faults(fork_api, taskset):
    """Faults are armed per child: one child clean, one starting corrupted, one that
    dies at its first step; the parent's own faults never pass to a child."""
    tasks, solutions = taskset
    task_id = "click_button-s1-000"
    parent = create(fork_api, tasks[task_id], {"verifier_unavailable": True})
    faults = [{}, {"corrupt_restore": True}, {"kill_at_step": 1}]
    r = fork_api.post(f"/v1/envs/{parent['env_id']}/fork", json={"n": 3, "faults": faults})
    assert r.status_code == 200, r.text
    clean, corrupt, doomed = r.json()["children"]
    assert (clean["valid"], corrupt["verdict"], corrupt["failed_gates"]) == (
        True,
        "state_mismatch",
        ["state_hash"],
    )
    oracle = solutions[task_id]["oracle"][0]
    assert step(fork_api, doomed, oracle)["failed_gates"] == ["worker_alive"]
    assert verify(fork_api, step(fork_api, clean, oracle))["score"] == 1.0  # not the parent's
    bad = fork_api.post(f"/v1/envs/{parent['env_id']}/fork", json={"n": 2, "faults": [{}]})
    assert bad.status_code == 400 and "one per child" in bad.json()["error"]


def test_a_task_that_names_no_initial_state_is_served_and_a_wrong_one_refused(fork_api, taskset):
    """A task the project did not draw itself may name no initial state: the host serves it
    from its own set-up (no state-hash gate at create; fork children still match their parent).
    A value that is not a sha256 is the request's mistake."""
    tasks, solutions = taskset
    task_id = "click_button-s1-000"
    task = dict(tasks[task_id])
    task["evaluator"] = {k: v for k, v in task["evaluator"].items() if k != "initial_state_sha256"}
    env = create(fork_api, task)
    assert (
        env["valid"] and env["state_sha256"] == tasks[task_id]["evaluator"]["initial_state_sha256"]
    )
    children = fork_api.post(f"/v1/envs/{env['env_id']}/fork", json={"n": 2}).json()["children"]
    assert [c["valid"] for c in children] == [True, True]
    done = play(fork_api, children[0], solutions[task_id]["oracle"])
    assert verify(fork_api, done)["score"] == 1.0
    task["evaluator"]["initial_state_sha256"] = "not-a-digest"
    r = fork_api.post("/v1/envs", json={"task": task})
    assert r.status_code == 400 and "initial_state_sha256 is not a sha256" in r.json()["error"]


def _processes_naming(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and str(os.getpid()) != proc.name:
            found.append(f"{proc.name}: {cmdline[:120]}")
    return found


@pytest.mark.parametrize("sandbox", ["gvisor", "process"])
def test_a_killed_job_takes_its_host_and_workers_with_it(token, taskset, tmp_path, sandbox):
    """kill -9 of a job that started the embedded host: the host gets the parent-death signal
    (envs/lifetime.py); a process host's zygote and workers exit when their channels close, a
    gVisor host's sandboxes die with their runsc processes, which get the same signal."""
    needs_gvisor(sandbox)
    value, path = token
    where = tmp_path / "sandboxes"
    task = json.dumps(next(iter(taskset[0].values())))
    script = (
        "import json, time, httpx\n"
        "from envab.envs.host import serve_embedded\n"
        f"with serve_embedded('fork', {str(path)!r}, sandbox={sandbox!r},\n"
        f"                    extra_args=['--sandbox-dir', {str(where)!r}]) as url:\n"
        f"    auth = {{'Authorization': 'Bearer {value}'}}\n"
        f"    env = httpx.post(url + '/v1/envs', json={{'task': json.loads({task!r})}},\n"
        "                     headers=auth, timeout=60).json()\n"
        "    assert env['valid'], env\n"
        "    health = httpx.get(url + '/v1/health', headers=auth)\n"
        "    print(url, health.json()['zygote_pid'], flush=True)\n"
        "    time.sleep(600)\n"
    )
    job = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        url, zygote = job.stdout.readline().split()
    finally:
        job.kill()
        job.wait()
    deadline = time.monotonic() + 15
    if sandbox == "process":
        while Path(f"/proc/{zygote}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{zygote}").exists(), "the host's zygote outlived the job"
    else:
        while _processes_naming(str(where)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _processes_naming(str(where)), "a sandbox outlived the job"
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/v1/health", timeout=2)
