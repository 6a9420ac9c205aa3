"""The files an OSWorld task downloads are frozen by content (issue 38, item 2): fetched once at
freeze from a loopback HTTP server standing in for the file hosts, stored as files/<sha256> with
the URL map files.json, which the tasks job's report (a receipt subject) carries; a changed,
missing, oversize or non-http(s) file is refused, naming the task and the URL; a mirror folder
freezes the same map without the network; and at run time the environment (the in-environment
server's set-up, without a display) and the checker (cloud_file) get the stored bytes, with the
file hosts gone."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import threading
import types
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envab.envs.host.pool import _Access
from envab.envs.osworld import source as osworld
from envab.envs.tasks import staging as host_files
from envab.envs.tasks.fetch import private_host
from envab.envs.tasks.filestore import FileNotFrozen, FrozenFiles
from envab.envs.xdesktop import server
from envab.envs.xdesktop.evaluate import Relay, blockers

CHECK = {  # served by the X desktop; the expectation is a cloud file
    "func": "exact_match",
    "result": {"type": "vm_file", "path": "/root/out.txt", "dest": "out.txt"},
}


class Hosts:
    """A loopback HTTP server standing in for the file hosts: path -> bytes (404 otherwise),
    every GET counted; `/moved` redirects to `location`."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.gets: list[str] = []
        self.location = "file:///etc/passwd"
        hosts = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hosts.gets.append(self.path)
                if self.path == "/moved":
                    self.send_response(302)
                    self.send_header("Location", hosts.location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = hosts.files.get(self.path)
                self.send_response(200 if data is not None else 404)
                body = data if data is not None else b"not found"
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hosts():
    h = Hosts()
    yield h
    h.stop()


def download(url: str, path: str) -> dict:
    return {"type": "download", "parameters": {"files": [{"url": url, "path": path}]}}


def one_download(tid: str, url: str) -> dict:
    expected = {"type": "rule", "rules": {"expected": "x"}}
    return {"id": tid, "instruction": "Open it.", "config": [download(url, "/root/x")],
            "evaluator": {**CHECK, "expected": expected}}  # fmt: skip


def write_set(root: Path, url: str, extra: dict | None = None) -> Path:
    """Three tasks: a set-up download, a postconfig download with a cloud_file expectation, and
    a multi cloud_file; the first two share a URL (fetched once)."""
    tasks = {
        "os": [
            {
                "id": "setup-1",
                "instruction": "Open it.",
                "config": [download(f"{url}/a.txt", "/root/a.txt")],
                "evaluator": {**CHECK, "expected": {"type": "rule", "rules": {"expected": "a"}}},
            },
            {
                "id": "post-1",
                "instruction": "Edit it.",
                "config": [],
                "evaluator": {
                    **CHECK,
                    "postconfig": [download(f"{url}/a.txt", "/root/b.txt")],
                    "expected": {"type": "cloud_file", "path": f"{url}/b.txt", "dest": "b.txt"},
                },
            },
            {
                "id": "multi-1",
                "instruction": "Both.",
                "config": [],
                "evaluator": {
                    **CHECK,
                    "expected": {
                        "type": "cloud_file",
                        "multi": True,
                        "path": [f"{url}/b.txt", f"{url}/c.bin"],
                        "dest": ["b.txt", "c.bin"],
                    },
                },
            },
        ],  # fmt: skip
        **(extra or {}),
    }
    for domain, items in tasks.items():
        for t in items:
            path = root / "examples" / domain / f"{t['id']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(t))
    return root


def serve_set(hosts: Hosts) -> dict[str, bytes]:
    hosts.files.update({"/a.txt": b"alpha\n", "/b.txt": b"beta\n", "/c.bin": bytes(range(256))})
    return {f"{hosts.url}{p}": data for p, data in hosts.files.items()}


LOOPBACK = {"allow_private_hosts": True}  # the file hosts here are a loopback server


def freeze(root: Path, out: Path, *extra: str, files_config: dict | None = None) -> int:
    extra, given = list(extra), {}
    if "--files-config" in extra:  # merged with LOOPBACK: argparse keeps only the last one
        at = extra.index("--files-config")
        given = json.loads(extra[at + 1])
        del extra[at : at + 2]
    config = json.dumps({**LOOPBACK, **given, **(files_config or {})})
    return osworld.main(
        ["--dir", str(root), "--tasks", str(out / "tasks.jsonl"), "--report",
         str(out / "index.json"), "--runnable", "xdesktop", "--files", str(out),
         "--files-config", config, *extra]
    )  # fmt: skip


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_freeze_fetches_each_url_once_and_stores_it_by_content_with_the_map(tmp_path, hosts):
    served = serve_set(hosts)
    root = write_set(tmp_path / "set", hosts.url)
    out = tmp_path / "out"
    assert freeze(root, out) == 0
    mapped = json.loads((out / "files.json").read_text())
    assert mapped["files"] == {url: {"sha256": sha(d), "size": len(d)} for url, d in served.items()}
    assert mapped["tasks"] == {
        "multi-1": [f"{hosts.url}/b.txt", f"{hosts.url}/c.bin"],
        "post-1": [f"{hosts.url}/a.txt", f"{hosts.url}/b.txt"],
        "setup-1": [f"{hosts.url}/a.txt"],
    }
    assert sorted(hosts.gets) == ["/a.txt", "/b.txt", "/c.bin"]  # a shared URL: once
    for data in served.values():
        assert (out / "files" / sha(data)).read_bytes() == data
    assert sorted(p.name for p in (out / "files").iterdir()) == sorted(map(sha, served.values()))
    # the report (a subject of the split receipt) carries the map; the tasks run on the X desktop
    report = json.loads((out / "index.json").read_text())
    assert report["files"] == mapped["files"] and report["tasks"] == 3


def test_a_file_changed_behind_its_url_is_refused_naming_task_url_and_both_digests(
    tmp_path, hosts, capsys
):
    serve_set(hosts)
    root = write_set(tmp_path / "set", hosts.url)
    assert freeze(root, tmp_path / "first") == 0
    registered = tmp_path / "registered.json"
    shutil.copy(tmp_path / "first" / "files.json", registered)
    expect = json.dumps({"expect": str(registered)})
    assert freeze(root, tmp_path / "same", "--files-config", expect) == 0  # unchanged: accepted
    capsys.readouterr()
    hosts.files["/a.txt"] = b"alpha, edited\n"
    out = tmp_path / "second"
    assert freeze(root, out, "--files-config", expect) == 2
    err = capsys.readouterr().err
    assert f"task post-1: {hosts.url}/a.txt" in err or f"task setup-1: {hosts.url}/a.txt" in err
    assert sha(b"alpha, edited\n") in err and sha(b"alpha\n") in err
    assert "nothing written" in err
    assert not (out / "tasks.jsonl").exists() and not (out / "files.json").exists()
    assert not list(out.glob("*files*"))  # the partial store went too


def test_a_missing_file_is_refused_with_task_and_url_or_left_out_by_the_rule(
    tmp_path, hosts, capsys
):
    serve_set(hosts)
    gone = one_download("gone-1", f"{hosts.url}/gone.txt")
    root = write_set(tmp_path / "set", hosts.url, {"vlc": [gone]})
    assert freeze(root, tmp_path / "refused") == 2
    err = capsys.readouterr().err
    assert f"task gone-1: config[0].parameters.files[0]: {hosts.url}/gone.txt: HTTP 404" in err
    assert not (tmp_path / "refused" / "tasks.jsonl").exists()

    out = tmp_path / "ruled"
    assert freeze(root, out, "--select", '{"runnable": true}') == 0
    report = json.loads((out / "index.json").read_text())
    row = report["per_task"]["vlc/gone-1"]
    assert row["reasons"]["xdesktop"] == ["file:missing"] and not row["selected"]
    assert report["reasons"]["xdesktop"] == {"file:missing": 1}
    assert report["tasks"] == 3
    assert f"{hosts.url}/gone.txt" not in json.loads((out / "files.json").read_text())["files"]


def test_a_mirror_folder_without_the_network_freezes_the_same_map_byte_for_byte(tmp_path, hosts):
    serve_set(hosts)
    root = write_set(tmp_path / "set", hosts.url)
    assert freeze(root, tmp_path / "online") == 0
    mirror = tmp_path / "mirror"  # what a machine without network is given: a freeze's folder
    shutil.copytree(tmp_path / "online", mirror)
    hosts.stop()  # no file host from here on
    out = tmp_path / "offline"
    assert freeze(root, out, "--files-config", json.dumps({"mirror": str(mirror)})) == 0
    for name in ("files.json", "tasks.jsonl", "index.json"):
        assert (out / name).read_bytes() == (tmp_path / "online" / name).read_bytes(), name
    assert sorted(p.name for p in (out / "files").iterdir()) == sorted(
        p.name for p in (mirror / "files").iterdir()
    )
    # a mirror whose bytes are not their digest is not taken
    victim = next((mirror / "files").iterdir())
    victim.write_bytes(b"tampered")
    assert (
        freeze(root, tmp_path / "bad", "--files-config", json.dumps({"mirror": str(mirror)})) == 2
    )


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "ftp://127.0.0.1/a.txt", "FILE:///etc/hostname", "http:///nohost"],
)
def test_a_url_that_is_not_http_or_https_is_refused_before_anything_is_fetched(
    tmp_path, hosts, capsys, url
):
    serve_set(hosts)
    bad = one_download("bad-1", url)
    root = write_set(tmp_path / "set", hosts.url, {"os2": [bad]})
    assert freeze(root, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "task bad-1" in err and repr(url) in err
    assert "only http and https URLs are fetched" in err or "names no host" in err


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1/a.txt"])
def test_a_redirect_to_another_scheme_is_refused(tmp_path, hosts, capsys, location):
    serve_set(hosts)
    hosts.location = location
    moved = one_download("moved-1", f"{hosts.url}/moved")
    root = write_set(tmp_path / "set", hosts.url, {"os2": [moved]})
    assert freeze(root, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"task moved-1: config[0].parameters.files[0]: {hosts.url}/moved" in err
    assert f"{location}' is not allowed" in err or f"redirected to {location!r}" in err


def test_a_url_on_this_machines_network_is_refused_unless_the_config_allows_it(
    tmp_path, hosts, capsys
):
    """A task file is untrusted: its URL (here the loopback server; a cloud's metadata address
    alike) may not copy what this machine's network holds into every environment."""
    serve_set(hosts)
    root = write_set(tmp_path / "set", hosts.url)
    assert freeze(root, tmp_path / "out", files_config={"allow_private_hosts": False}) == 2
    err = capsys.readouterr().err
    assert "resolves to 127.0.0.1, not a public address" in err
    assert "tasks.osworld.files.allow_private_hosts" in err
    assert not (tmp_path / "out" / "tasks.jsonl").exists()
    assert freeze(root, tmp_path / "allowed") == 0  # LOOPBACK allows it


def test_an_oversize_file_is_refused(tmp_path, hosts, capsys):
    serve_set(hosts)
    hosts.files["/c.bin"] = b"\0" * (2**20 + 1)  # one byte over a 1 MiB cap
    root = write_set(tmp_path / "set", hosts.url)
    assert freeze(root, tmp_path / "out", files_config={"max_file_mb": 1}) == 2
    err = capsys.readouterr().err
    assert f"task multi-1: evaluator.expected.path[1]: {hosts.url}/c.bin" in err
    assert f"over the {2**20} a file may have" in err
    # the set's cap: every file fits, the three together do not
    hosts.files["/c.bin"] = b"\0" * (2**20 - 8)
    assert freeze(root, tmp_path / "out", "--files-config", '{"max_total_mb": 1}') == 2
    assert "over the 1048576 bytes a set may hold" in capsys.readouterr().err


def test_downloads_and_cloud_files_no_longer_block_the_x_desktop(tmp_path, hosts):
    serve_set(hosts)
    root = write_set(tmp_path / "set", hosts.url)
    for t in osworld.load_dir(root).tasks:
        assert blockers(t.task) == [], t.task["id"]


# --- run time: the stored bytes reach the environment and the checker, with no network --------


@pytest.fixture
def frozen(tmp_path, hosts) -> tuple[FrozenFiles, dict[str, bytes]]:
    served = serve_set(hosts)
    root = write_set(tmp_path / "set", hosts.url)
    assert freeze(root, tmp_path / "out") == 0
    hosts.stop()  # the file hosts are gone at run time
    return FrozenFiles(tmp_path / "out" / "files.json"), served


def test_the_environment_gets_each_download_from_the_store_in_parts(tmp_path, frozen, monkeypatch):
    files, served = frozen
    url = next(u for u in served if u.endswith("/c.bin"))
    monkeypatch.setattr(server, "STAGE", tmp_path / "stage")
    monkeypatch.setattr(server, "HOME", tmp_path / "home")  # what the state hash reads
    monkeypatch.setattr(host_files, "PART", 100)  # 256 bytes: three parts
    dest = tmp_path / "home" / "Desktop" / "c.bin"
    steps = [download(url, str(dest))]
    messages = list(host_files.stage_messages(steps, files))
    assert [m[3] for m in messages] == [0, 100, 200]
    env = server.Environment(display=None)  # set-up steps and staging need no display
    for op, *args in messages:
        getattr(env, f"op_{op}")(*args)
    env.op_postconfig(steps)  # the set-up step copies the delivered file to its path
    assert dest.read_bytes() == served[url]
    assert not list((tmp_path / "stage").iterdir())  # staged files go after the set-up

    # not delivered: named, never fetched; delivered with other bytes: refused by digest
    with pytest.raises(server.SetupError, match="not delivered from the host's frozen files"):
        env.setup(steps)
    op, u, digest, offset, part, size = messages[0]
    with pytest.raises(ValueError, match="hash to"):
        env.op_stage(u, digest, 0, b"x" * size, size)


def test_a_store_whose_bytes_are_not_their_digest_delivers_nothing(frozen):
    files, served = frozen
    url = next(iter(served))
    files.path(url).write_bytes(b"changed on disk")
    with pytest.raises(FileNotFrozen, match="missing or not|does not hash"):
        list(host_files.stage_messages([download(url, "/root/x")], files))
    with pytest.raises(FileNotFrozen, match="no frozen files"):
        list(host_files.stage_messages([download(url, "/root/x")], None))
    with pytest.raises(FileNotFrozen, match="not among the frozen files"):
        list(host_files.stage_messages([download("http://elsewhere/x", "/root/x")], files))


def test_a_cloud_file_expectation_is_served_from_the_store_to_the_getter(tmp_path, frozen):
    """The host answers the checker's /cloud_file from the store (never the environment), and
    desktop-env's own get_cloud_file, behind the checker's relay, returns the stored bytes."""
    files, served = frozen
    b_url, c_url = sorted(u for u in served if u.endswith(("/b.txt", "/c.bin")))
    other = next(u for u in sorted(served) if u not in (b_url, c_url))  # another task's file
    config = {"type": "cloud_file", "multi": True, "path": [b_url, c_url],
              "dest": ["b.txt", "c.bin"], "gives": [0, 1]}  # fmt: skip
    task = {"evaluator": {"func": "compare", "result": {"type": "vm_file"}, "expected": config}}
    pool = types.SimpleNamespace(files=files, config=None)
    access = _Access(pool, types.SimpleNamespace(channel=None, task=task))  # no env to reach
    from urllib.parse import urlencode

    ask = lambda url: access.http("GET", f"/cloud_file?{urlencode({'url': url})}", "", b"")  # noqa: E731
    reply = ask(b_url)
    assert reply["status"] == 200 and reply["body"] == served[b_url]
    # a frozen file this task's evaluator does not name: refused, though the store has it
    assert other in served and ask(other)["status"] == 403
    assert ask("http://x/y")["status"] == 403
    wide = {"evaluator": {**task["evaluator"], "expected": {**config, "path": [*config["path"],
            "http://x/y"]}}}  # fmt: skip
    assert (
        _Access(pool, types.SimpleNamespace(channel=None, task=wide)).http(
            "GET", "/cloud_file?url=http%3A%2F%2Fx%2Fy", "", b""
        )["status"]
        == 404
    )  # named, but not frozen

    from envab.envs.xdesktop.cloud_files import get_cloud_file
    from envab.envs.xdesktop.evaluate import load

    with Relay(access.http) as relay:
        env = types.SimpleNamespace(
            http_server=f"http://127.0.0.1:{relay.port}", cache_dir=str(tmp_path / "cache")
        )
        (tmp_path / "cache").mkdir()
        got = get_cloud_file(load("getters", "get_cloud_file"), env, config)
    assert [Path(p).read_bytes() for p in got] == [served[b_url], served[c_url]]


def test_the_workflow_freezes_the_files_and_the_split_receipt_covers_their_map(workflow, hosts):
    """Integration (a real Snakemake run): with an arm on the X desktop, the tasks job writes
    files/ and files.json beside the task set, and the report that carries the map is a subject
    of the split receipt."""
    served = serve_set(hosts)
    write_set(workflow.root / "osworld", hosts.url)

    def config(c):
        c["tasks"] = {
            "osworld": {"dir": "osworld", "select": {"runnable": True}, "files": LOOPBACK}
        }
        c["split"].update(stratify="domain", heldout_fraction=0.34)
        c["arms"]["drums"]["world"] = "xdesktop"
        c["training"]["sft"]["enabled"] = False  # no oracle demonstrations in this set

    workflow.edit_config(config)
    result = workflow.snakemake("--until", "split")
    assert result.returncode == 0, result.stderr[-3000:]
    tasks = next((workflow.root / "results").glob("*/tasks"))
    mapped = json.loads((tasks / "files.json").read_text())
    assert mapped["files"] == {u: {"sha256": sha(d), "size": len(d)} for u, d in served.items()}
    for data in served.values():
        assert (tasks / "files" / sha(data)).read_bytes() == data
    receipt = json.loads(next((workflow.root / "receipts").glob("*/split.json")).read_text())
    report = next(s for s in receipt["subject"] if s["name"].endswith("tasks/index.json"))
    assert report["digest"]["sha256"] == sha((tasks / "index.json").read_bytes())
    assert json.loads((tasks / "index.json").read_text())["files"] == mapped["files"]


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:127.0.0.1",  # IPv4-mapped
        "64:ff9b::7f00:1",  # NAT64's well-known prefix over 127.0.0.1
        "64:ff9b::a00:1",  # ... over 10.0.0.1
        "2002:c0a8:101::1",  # 6to4 over 192.168.1.1
        "2002:7f00:1::1",  # 6to4 over 127.0.0.1
    ],
)
def test_private_addresses_in_ipv6_forms_are_private(monkeypatch, address):
    # A name that resolves only to such a form reaches a private host: refused as one.
    answer = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, 0, 0, 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answer)
    assert "not a public address" in (private_host("http://files.example/a.xlsx") or "")


def test_a_public_address_in_ipv6_forms_is_public(monkeypatch):
    answer = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("64:ff9b::808:808", 0, 0, 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answer)
    assert private_host("http://files.example/a.xlsx") is None


def test_a_name_that_rebinds_to_loopback_after_its_check_reaches_nothing(tmp_path, monkeypatch):
    # DNS rebinding: the name resolves to a public address when vetted, to this machine's
    # loopback when connecting. The connection goes to an address vetted in its own resolution,
    # so the loopback server's secret is never fetched.
    from envab.envs.tasks.fetch import Limits, Unfetchable, fetch_url

    got = []

    class Secret(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            got.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"the machine's secret")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Secret)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    real = socket.getaddrinfo
    calls = []

    def rebinding(host, *args, **kwargs):
        if host != "files.example":
            return real(host, *args, **kwargs)
        calls.append(host)
        address = "8.8.8.8" if len(calls) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    try:
        with pytest.raises(Unfetchable) as refused:
            fetch_url(f"http://files.example:{port}/secret", tmp_path, Limits())
    finally:
        server.shutdown()
    assert refused.value.reason == "file:private_host"
    assert "127.0.0.1 when connecting" in str(refused.value)
    assert len(calls) >= 2 and got == []


class DriveShaped(BaseHTTPRequestHandler):
    """A loopback host answering as Google Drive does: a small file directly; a large one with
    its virus-scan page, whose form confirms the download; a file that is gone with a page
    that confirms nothing."""

    files = {"small": b"a small file\n", "large": b"a large file, past the scan\n"}

    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        name = query.get("id")
        if url.path == "/uc" and name == "small":
            return self._send(200, "application/octet-stream", self.files["small"])
        if url.path == "/uc" and name == "large":
            page = (
                "<html><body><p>Google Drive can't scan this file for viruses.</p>"
                '<form id="download-form" action="/download" method="get">'
                '<input type="hidden" name="id" value="large">'
                '<input type="hidden" name="export" value="download">'
                '<input type="hidden" name="confirm" value="t">'
                '<input type="hidden" name="uuid" value="0f1e2d3c">'
                '<input type="submit" value="Download anyway"></form></body></html>'
            )
            return self._send(200, "text/html; charset=utf-8", page.encode())
        if url.path == "/download" and query.get("confirm") == "t" and name == "large":
            return self._send(200, "application/octet-stream", self.files["large"])
        return self._send(200, "text/html", b"<html><body>Sign in to continue</body></html>")

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("host", ["drive.google.com", "drive.usercontent.google.com"])
def test_google_drive_is_followed_past_its_scan_page_and_a_page_is_never_a_file(
    tmp_path, monkeypatch, host
):
    from envab.envs.tasks.fetch import Limits, Unfetchable, fetch_url

    server = ThreadingHTTPServer(("127.0.0.1", 0), DriveShaped)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    real = socket.getaddrinfo

    def drive_here(name, *args, **kwargs):  # the Drive host, answered on loopback
        if name == host:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(name, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", drive_here)
    limits = Limits(allow_private_hosts=True)  # the stand-in host is on loopback
    base = f"http://{host}:{port}/uc?export=download&id="
    try:
        small = fetch_url(base + "small", tmp_path, limits)
        large = fetch_url(base + "large", tmp_path, limits)
        with pytest.raises(Unfetchable) as gone:
            fetch_url(base + "gone", tmp_path, limits)
    finally:
        server.shutdown()
    assert small["sha256"] == hashlib.sha256(DriveShaped.files["small"]).hexdigest()
    assert large["sha256"] == hashlib.sha256(DriveShaped.files["large"]).hexdigest()
    assert gone.value.reason == "file:drive_page"
    # what was stored is the two files, never a page
    stored = {p.name for p in tmp_path.iterdir()}
    assert stored == {small["sha256"], large["sha256"]}
