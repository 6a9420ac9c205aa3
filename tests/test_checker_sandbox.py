"""The X desktop's checker runs in a confined process of its own (envs/xdesktop/checker.py): a
real child process scores with desktop-env's real getters and metrics, reading files a fake
environment serves, and probes run inside it (tests/checker_probes.py) show what it cannot do:
write where root owns, reach the host's network, stay root, outlive its deadline, or crash the
host with what it writes back. Each probe is run in this process too, where it succeeds, so a
confinement that stopped working would fail these tests."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import ordinary_user
import pytest

from envab.envs.protocol import Gate, checked
from envab.envs.xdesktop import checker, evaluate
from envab.envs.xdesktop.checker import CheckerFailed
from envab.envs.xdesktop.confine import CHECKER_IDS, Limits

PROBES = str(Path(__file__).with_name("checker_probes.py"))
ROOT = os.geteuid() == 0


def _why_not() -> str | None:
    """Why this machine cannot confine a checker: it needs network and process namespaces (root,
    or an unprivileged user namespace), tried in a throw-away child."""
    if sys.platform != "linux":
        return "the checker's confinement is Linux's (namespaces, prctl)"
    flags = 0x60000000 if ROOT else 0x70000000  # CLONE_NEWNET|NEWPID, with NEWUSER if not root
    code = f"import ctypes,sys; sys.exit(ctypes.CDLL(None).unshare({flags}))"
    if subprocess.run([sys.executable, "-c", code]).returncode != 0:
        return "no network or process namespace here (not root and no user namespaces)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


class Environment:
    """A fake environment's `http` (the in-environment server's /file and /execute), recording
    every request that reaches it."""

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.requests: list[tuple[str, str, bytes]] = []

    def http(self, method: str, path: str, content_type: str, body: bytes) -> dict:
        self.requests.append((method, path, body))
        if path == "/file" and content_type.startswith("application/x-www-form-urlencoded"):
            name = urllib.parse.parse_qs(body.decode()).get("file_path", [""])[0]
            if name in self.files:
                return {"status": 200, "content_type": "application/octet-stream",
                        "body": self.files[name]}  # fmt: skip
            return {"status": 404, "content_type": "text/plain", "body": b"no such file"}
        if path == "/execute":
            command = json.loads(body)["command"]
            output = self.files.get(command[-1], b"").decode() if command[0] == "cat" else ""
            reply = {"status": "success", "output": output, "error": "", "returncode": 0}
            return {"status": 200, "content_type": "application/json",
                    "body": json.dumps(reply).encode()}  # fmt: skip
        return {"status": 200, "content_type": "text/plain", "body": b""}


def _probe(probe: str, env: Environment | None = None, limits: Limits | None = None, **params):
    env = env or Environment({})
    return checker.run({"probe": probe, **params}, env.http, evaluate.ROUTES, limits, PROBES)


def _failure(probe: str, limits: Limits | None = None, **params) -> CheckerFailed:
    with pytest.raises(CheckerFailed) as failed:
        _probe(probe, limits=limits, **params)
    return failed.value


# --- a real desktop-env metric, scored in the checker process ---------------------------------

DIFF = {
    "func": "diff_text_file",
    "result": {"type": "vm_file", "path": "/root/todo.txt", "dest": "todo.txt"},
    "expected": {"type": "vm_file", "path": "/gold/todo.txt", "dest": "gold.txt"},
}


class Access:
    """What the pool hands the X desktop's checker (envs/host/pool.py, _Access)."""

    def __init__(self, env: Environment):
        self.http = env.http
        self.browser = None  # no browser here (tests/test_browser_port.py has a stand-in)
        self.postconfig_steps: list = []

    def postconfig(self, steps: list) -> None:
        self.postconfig_steps.append(steps)


def test_a_real_metric_scores_the_files_the_environment_serves():
    env = Environment(
        {"/root/todo.txt": b"water the plants\n", "/gold/todo.txt": b"water the plants\n"}
    )
    assert evaluate.evaluate(DIFF, env.http, lambda steps: None) == 1.0
    assert [path for _, path, _ in env.requests] == ["/file", "/file"]
    env.files["/root/todo.txt"] = b"feed the cat\n"
    assert evaluate.evaluate(DIFF, env.http, lambda steps: None) == 0.0


def test_a_metric_that_prints_still_answers_one_frame():
    # exact_match and the vm_command_line getter print to standard output; the frames do not
    # travel there
    env = Environment({"/root/plants.txt": b"water the plants\n"})
    ev = {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": ["cat", "/root/plants.txt"]},
        "expected": {"type": "rule", "rules": {"expected": "water the plants\n"}},
    }
    assert evaluate.evaluate(ev, env.http, lambda steps: None) == 1.0


def test_a_table_metric_reads_a_spreadsheet_after_the_uid_change():
    # compare_table opens the .xlsx with openpyxl, whose zip reader imports a codec lazily: on a
    # host whose interpreter the checker's uid cannot read (under /root), that import would fail
    # and desktop-env would swallow it as a 0, a wrong valid score (confine._reachable)
    openpyxl = pytest.importorskip("openpyxl")
    book = openpyxl.Workbook()
    for row in (["item", "count"], ["apples", 7], ["pears", 4]):
        book.active.append(row)
    data = io.BytesIO()
    book.save(data)
    env = Environment({"/root/stock.xlsx": data.getvalue()})
    cell = {"type": "check_cell", "sheet_idx": 0, "coordinate": "B2"}
    ev = {
        "func": "compare_table",
        "result": {"type": "vm_file", "path": "/root/stock.xlsx", "dest": "stock.xlsx"},
        "options": {"rules": [{**cell, "props": {"value": {"method": "eq", "ref": 7}}}]},
    }
    assert evaluate.evaluate(ev, env.http, lambda steps: None) == 1.0
    ev["options"]["rules"][0]["props"]["value"]["ref"] = 8
    assert evaluate.evaluate(ev, env.http, lambda steps: None) == 0.0


def test_postconfig_runs_on_the_host_through_the_environment_and_failures_are_invalid():
    env = Environment({"/root/todo.txt": b"a\n", "/gold/todo.txt": b"a\n"})
    access = Access(env)
    steps = [{"type": "execute", "parameters": {"command": ["true"]}}]
    audit: dict = {}
    v = checked(evaluate.check, {**DIFF, "postconfig": steps}, access, audit)
    assert v.valid and v.score == 1.0 and access.postconfig_steps == [steps]
    # a getter this desktop does not serve: the checker raises, the attempt is invalid, named
    audit = {}
    v = checked(evaluate.check, {**DIFF, "result": {"type": "googledrive_file"}}, access, audit)
    assert not v.valid and v.failed_gates == (Gate.VERIFIER_AVAILABLE,)
    assert audit["checker_failure"] == "crash" and "Unavailable" in audit["checker_error"]


# --- what the checker process is --------------------------------------------------------------


def test_the_checker_is_unprivileged_with_no_network_and_nothing_of_the_hosts():
    env = Environment({})
    limits = Limits(cpu_s=77, open_files=99, processes=55)
    assert _probe("facts", env, limits) == 1.0
    ((_, path, body),) = env.requests
    facts = json.loads(body)
    # as root: a uid and gid of its own (CHECKER_IDS), never root, nobody's, or the host's
    uid = facts["resuid"][0] if ROOT else os.getuid()
    assert facts["resuid"] == [uid] * 3 and facts["groups"] == []
    if ROOT:
        assert uid in CHECKER_IDS and facts["resgid"] == [uid] * 3
    assert facts["no_new_privs"] == "1" and int(facts["cap_eff"], 16) == 0
    assert facts["interfaces"] == ["lo"]  # a namespace of its own: none of the host's
    # LC_CTYPE: the interpreter's own C-locale coercion (PEP 538), not the host's
    assert set(facts["environ"]) - {"LC_CTYPE"} == {"HOME", "TMPDIR"}
    assert facts["environ"]["HOME"] == facts["cwd"] and facts["cwd_owner"] == uid
    assert facts["cwd"] != os.getcwd() and not os.path.exists(facts["cwd"])  # removed after
    assert facts["rlimits"]["RLIMIT_CPU"] == 77 and facts["rlimits"]["RLIMIT_NOFILE"] == 99
    assert facts["rlimits"]["RLIMIT_NPROC"] == 55
    assert facts["rlimits"]["RLIMIT_AS"] == limits.memory_bytes
    assert facts["rlimits"]["RLIMIT_FSIZE"] == limits.file_bytes


def test_a_checker_reaches_none_of_the_kernels_facilities_a_plain_process_reaches():
    # The control first, in a plain process of the same uid kind: each call is one the kernel
    # grants here, so a refusal in the checker is the filter's, not the machine's.
    tried = "import json, checker_probes as p; print(json.dumps(p.try_kernel_calls()))"
    control = subprocess.run(
        [sys.executable, "-c", tried],
        cwd=Path(__file__).parent, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert control.returncode == 0, control.stderr
    outside = json.loads(control.stdout)
    granted = {call for call, answer in outside.items() if answer == "ok"}
    assert {"unshare_user", "keyctl", "name_to_handle_at"} <= granted, outside
    env = Environment({})
    assert _probe("kernel_calls", env) == 1.0, env.requests
    ((_, _, body),) = env.requests
    inside = json.loads(body)
    assert inside == {call: "EPERM" for call in outside}, inside


@pytest.mark.skipif(not ROOT, reason="a host that is not root keeps its uid in every checker")
def test_a_checker_cannot_forge_the_job_or_cache_of_checkers_beside_it():
    # One hostile checker polls the host's temporary folder for the other checkers' folders
    # and rewrites every job it finds to an always-true one; five honest checkers, whose job
    # scores 0, start beside it. Each must score its own job.
    from concurrent.futures import ThreadPoolExecutor

    hostile_env = Environment({})
    with ThreadPoolExecutor(max_workers=6) as pool:
        hostile = pool.submit(_probe, "forge", hostile_env, seconds=12.0, tmp=tempfile.gettempdir())
        time.sleep(2.0)  # the hostile one is polling before the others start
        honest = [pool.submit(_probe, "answer", value=0.0) for _ in range(5)]
        scores = [f.result(timeout=300) for f in honest]
        assert hostile.result(timeout=300) == 1.0, hostile_env.requests
    assert scores == [0.0] * 5
    ((_, _, reached),) = hostile_env.requests
    assert reached == b"0"


def test_two_checkers_side_by_side_hold_two_ids():
    from envab.envs.xdesktop.confine import checker_ids

    folder = tempfile.mkdtemp()
    try:
        with checker_ids(folder) as first, checker_ids(folder) as second:
            assert first != second and {first, second} <= set(CHECKER_IDS)
        with checker_ids(folder) as again:
            assert again == first  # given back when its checker ended
    finally:
        import shutil

        shutil.rmtree(folder)


def test_a_checker_cannot_write_into_a_folder_of_the_hosts():
    """A folder of the host's in /tmp (not in the checker's root at all) and the checkout's
    tests folder (shown read-only, as the interpreter's code is): the checker writes into
    neither, whatever its uid."""
    folder = tempfile.mkdtemp(prefix="envab-host-owned-")
    try:
        os.chmod(folder, 0o755)
        for where in (folder, str(Path(PROBES).parent)):
            assert _probe("write_marker", folder=where) == 1.0, where
        assert os.listdir(folder) == []
        assert not Path(PROBES).with_name("marker").exists()
        # the same code in the host's process writes it
        assert _module().write_marker({"folder": folder}, None) == 0.0
        assert os.listdir(folder) == ["marker"]
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def host_secrets(root: Path) -> tuple[list[str], list[str], socket.socket]:
    """Files a compromised checker would want, as a run lays them out: the checkout's results
    and receipts, a key in the host's home, another checker's folder and a VM's monitor socket
    in /tmp; and a listener on that socket. Each open to every uid (a host that is not root
    shares its uid with the checker anyway), so that only the checker's root can hide them."""
    root.chmod(0o755)
    paths = []
    for name in ("results/exp/drums/seed1/run.json", "receipts/exp/code.json"):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        paths.append(str(path))
    home_key = Path.home() / f".envab-test-key-{os.getpid()}"
    home_key.write_text("not a real key")
    other = Path(tempfile.mkdtemp(prefix="envab-checker-other-")) / "job.json"
    other.write_text("{}")
    other.parent.chmod(0o755)
    paths += [str(home_key), str(other)]
    sock = str(Path(tempfile.mkdtemp(prefix="envab-vm-")) / "qmp.sock")
    Path(sock).parent.chmod(0o755)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(sock)
    os.chmod(sock, 0o777)
    listener.listen()
    return paths, [sock], listener


def test_a_checker_sees_none_of_the_hosts_files_results_keys_or_sockets():
    """The checker's root (confine.private_root) shows the system's folders, the interpreter's
    and its own home: the checkout's results and receipts, the host's home, other checkers'
    folders and the VMs' sockets are not there, though the host's own process reaches each
    (the control). The checkout lies under the repository here, as a run's does."""
    repo = Path(PROBES).parent.parent
    root = Path(
        tempfile.mkdtemp(prefix="checkout-", dir=repo if os.access(repo, os.W_OK) else None)
    )
    paths, sockets, listener = host_secrets(root)
    try:
        env = Environment({})
        assert _probe("host_files", env, paths=paths, sockets=sockets) == 1.0
        assert json.loads(env.requests[0][2]) == []
        control = Environment({})
        assert _module().host_files({"paths": paths, "sockets": sockets}, control.http) == 0.0
        assert json.loads(control.requests[0][2]) == paths + sockets
    finally:
        listener.close()
        for path in (*paths, *sockets):
            Path(path).unlink(missing_ok=True)
        for folder in (root, Path(paths[-1]).parent, Path(sockets[0]).parent):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(
    ordinary_user.why_not_here() is not None, reason=str(ordinary_user.why_not_here())
)
def test_an_ordinary_users_checker_is_confined_as_roots_is():
    """The confinement tests again as an ordinary user (tests/ordinary_user.py), whose checker
    keeps the user's uid: a user namespace makes its network, process and mount namespaces, and
    its root of its own is what hides the user's checkout, home, other checkers' folders and
    sockets from it."""
    chosen = "sees_none or write_into or outlives or routes or listener or kernel or hangs"
    done = ordinary_user.pytest_as_user(__file__, chosen)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    ran = re.search(r"(\d+) passed", out)
    assert ran and int(ran.group(1)) >= 7 and "skipped" not in out, out[-2000:]


def test_a_checker_cannot_reach_a_listener_on_the_host():
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        port = listener.getsockname()[1]
        hosts = ["127.0.0.1", *_addresses()]
        assert _probe("connect", hosts=hosts, port=port) == 1.0
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody came
        assert _module().connect({"hosts": hosts, "port": port}, None) == 0.0  # the control


def _running(marker: str) -> list[int]:
    """The host's processes whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_nothing_a_checker_starts_outlives_it():
    marker = f"3600.{os.getpid()}{time.monotonic_ns() % 10**6}"
    env = Environment({})
    assert _probe("orphan", env, marker=marker) == 1.0
    assert env.requests[0][2] == marker.encode()  # it was started
    for _ in range(50):  # the namespace's end is the kernel's, an instant after the checker's
        if not _running(marker):
            return
        time.sleep(0.1)
    for pid in _running(marker):
        os.kill(pid, 9)
    pytest.fail(f"sleep {marker}, started by the checker, outlived it")


def test_a_checker_gets_only_the_routes_the_getters_read():
    env = Environment({})
    assert _probe("other_route", env) == 1.0
    assert env.requests == []  # the environment never saw it


def test_an_allocation_past_the_memory_limit_fails_in_the_checker():
    failed = _failure("allocate", Limits(memory_bytes=2 * 2**30), bytes=3 * 2**30)
    assert failed.failure == "crash" and "MemoryError" in str(failed)


# --- what the host does with a checker that misbehaves ----------------------------------------


def test_a_checker_that_hangs_is_killed_at_its_deadline():
    start = time.monotonic()
    failed = _failure("hang", Limits(deadline_s=4))
    assert failed.failure == "timeout"
    assert time.monotonic() - start < 4 + 10  # its start, the deadline, and the kill


def test_what_one_evaluation_relays_is_bounded_in_requests_and_bytes():
    """The host relays a checker's requests and the environment's answers up to a budget per
    evaluation (confine.Limits: requests, relayed_bytes), whatever the deadline leaves time for;
    past it, the evaluation is invalid (`oversize`). Under both budgets the same probe scores."""
    env = Environment({"big": b"x" * 2**20})
    assert _probe("many_requests", env, Limits(requests=10), requests=8) == 1.0
    failed = _failure("many_requests", Limits(requests=10), requests=11)
    assert failed.failure == "oversize" and "more than 10 requests" in str(failed)
    with pytest.raises(CheckerFailed) as failed:
        _probe("many_requests", env, Limits(relayed_bytes=4 * 2**20), requests=5)
    assert failed.value.failure == "oversize" and "passed 4194304 bytes" in str(failed.value)
    assert len(env.requests) == 8 + 5  # the fifth 1 MiB answer was the one past the budget


def test_a_checker_that_exits_without_a_score_is_a_crash():
    failed = _failure("exit_early")
    assert failed.failure == "crash" and "exit 3" in str(failed)


@pytest.mark.parametrize(
    ("frame", "size", "failure"),
    [
        ("this is not json", None, "garbage"),
        ('{"verdict": "valid"}', None, "garbage"),
        ('{"score": 1, "also": 2}', None, "garbage"),
        ('{"http": ["GET", "/file"]}', None, "garbage"),
        ('{"score": "1"}', None, "bad_score"),
        ('{"score": true}', None, "bad_score"),
        ('{"score": 1.5}', None, "bad_score"),
        ('{"score": -0.5}', None, "bad_score"),
        ('{"score": 1e999}', None, "bad_score"),
        ('{"score": NaN}', None, "garbage"),
        ('{"score": 1}', checker.REQUEST_MAX + 1, "oversize"),
    ],
)
def test_what_a_checker_writes_back_is_a_named_failure_never_a_crash(frame, size, failure):
    params = {"frame": frame} if size is None else {"frame": frame, "size": size}
    assert _failure("raw_frame", Limits(deadline_s=20), **params).failure == failure


def test_bytes_that_are_no_frame_at_all_are_a_named_failure():
    failed = _failure("raw_bytes", bytes="Traceback (most recent call last): oops\n")
    assert failed.failure == "oversize"  # its first four bytes read as a size past the cap
    assert _failure("raw_bytes", bytes="ab").failure == "crash"  # then the end of the stream


@pytest.mark.parametrize("value", [0.25, 1])
def test_a_valid_fraction_comes_back_as_a_float(value):
    assert _probe("answer", value=value) == float(value)


def test_a_checker_failure_is_an_invalid_attempt_with_its_name():
    class Hanging:
        def __call__(self, evaluator, state):
            return checker.run(evaluator, state.http, evaluate.ROUTES, Limits(deadline_s=3), PROBES)

    audit: dict = {}
    v = checked(Hanging(), {"probe": "hang"}, Access(Environment({})), audit)
    assert not v.valid and v.score is None and v.failed_gates == (Gate.VERIFIER_AVAILABLE,)
    assert audit["checker_failure"] == "timeout" and "CheckerFailed" in audit["checker_error"]


def _module():
    """The probes, imported into this process (the controls)."""
    sys.path.insert(0, str(Path(PROBES).parent))
    try:
        import checker_probes
    finally:
        sys.path.pop(0)
    return checker_probes


def _addresses() -> list[str]:
    """This host's addresses besides loopback (a route out would reach them)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return []
    return sorted({info[4][0] for info in infos} - {"127.0.0.1"})


def _docx(*paragraphs: str) -> bytes:
    from docx import Document

    document = Document()
    for text in paragraphs:
        document.add_paragraph(text)
    data = io.BytesIO()
    document.save(data)
    return data.getvalue()


def _pptx(*titles: str) -> bytes:
    from pptx import Presentation

    deck = Presentation()
    for title in titles:
        slide = deck.slides.add_slide(deck.slide_layouts[5])  # title only
        slide.shapes.title.text = title
    data = io.BytesIO()
    deck.save(data)
    return data.getvalue()


@pytest.mark.parametrize(
    "func, make, suffix",
    [("compare_docx_files", _docx, "docx"), ("compare_pptx_files", _pptx, "pptx")],
    ids=["writer", "impress"],
)
def test_the_office_metrics_score_documents_in_the_checker(func, make, suffix):
    # docs.py imports easyocr (one OCR metric of its many reads a screenshot) and slides.py
    # python-pptx: with their dependencies pinned, OSWorld's Writer and Impress metrics load and
    # score in the confined checker (the OCR models are not here, and no task here uses OCR)
    env = Environment(
        {
            f"/root/report.{suffix}": make("Quarterly report", "Sales rose"),
            f"/gold/report.{suffix}": make("Quarterly report", "Sales rose"),
        }
    )
    ev = {
        "func": func,
        "result": {"type": "vm_file", "path": f"/root/report.{suffix}", "dest": f"a.{suffix}"},
        "expected": {"type": "vm_file", "path": f"/gold/report.{suffix}", "dest": f"b.{suffix}"},
    }
    assert evaluate.evaluate(ev, env.http, lambda steps: None) == 1.0
    env.files[f"/root/report.{suffix}"] = make("Quarterly report", "Sales fell")
    assert evaluate.evaluate(ev, env.http, lambda steps: None) == 0.0
