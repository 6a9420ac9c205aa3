"""The X desktop's in-environment server reads back what a getter asks for within bounds: a file
past MAX_FILE or a listing past MAX_LISTED entries (a link loop, a huge tree) is a named error
answer, not a whole-disk read or a crash; its HTTP mode answers only a caller with its token.
Its routes run here on real files, without a display."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from envab.envs.xdesktop import server


def ask(route: str, **data):
    routes = server.Routes(display=None)  # /file and /list_directory never touch the display
    status, kind, body = routes.handle("POST", route, "application/json", json.dumps(data).encode())
    return status, body


def test_a_file_within_the_limit_is_read_back_whole(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"x" * 1000)
    assert ask("/file", file_path=str(path)) == (200, b"x" * 1000)


def test_a_file_over_the_limit_is_refused_by_name(tmp_path):
    path = tmp_path / "big.bin"
    with path.open("wb") as f:  # sparse: its size, not its bytes, is what the server must check
        f.truncate(server.MAX_FILE + 1)
    status, body = ask("/file", file_path=str(path))
    assert status == 413
    assert f"over {server.MAX_FILE} bytes" in json.loads(body)["error"]


def test_a_listing_follows_no_link_and_stops_at_its_bound(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("1")
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d")  # a walk that follows it never ends
    status, body = ask("/list_directory", path=str(tmp_path / "d"))
    assert status == 200
    listed = json.loads(body)
    assert [c["name"] for c in listed["children"]] == ["f", "loop"]
    assert "children" not in listed["children"][1]

    for i in range(5):
        (tmp_path / "d" / f"g{i}").write_text("")
    monkeypatch.setattr(server, "MAX_LISTED", 4)
    status, body = ask("/list_directory", path=str(tmp_path / "d"))
    assert status == 400 and "over 4 entries" in json.loads(body)["error"]


TOKEN = "t" * 32


@pytest.fixture
def http_mode():
    handler = server.request_handler(server.Routes(display=None).handle, token=TOKEN)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def post(port: int, body: bytes, headers: dict) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/file", body=body, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def test_the_http_mode_answers_only_a_caller_with_its_token(http_mode, tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("contents")
    body = json.dumps({"file_path": str(path)}).encode()
    kind = {"Content-Type": "application/json"}
    assert post(http_mode, body, kind)[0] == 401
    assert post(http_mode, body, {**kind, "Authorization": "Bearer wrong"})[0] == 401
    assert post(http_mode, body, {**kind, "Authorization": f"Bearer {TOKEN}"}) == (200, b"contents")


def test_the_http_mode_refuses_a_body_over_its_frame_unread(http_mode):
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", http_mode, timeout=10)
    try:  # announces 1 GiB and sends none of it: the answer comes without waiting for it
        conn.putrequest("POST", "/file")
        for k, v in {**auth, "Content-Length": str(2**30)}.items():
            conn.putheader(k, v)
        conn.endheaders()
        assert conn.getresponse().status == 413
    finally:
        conn.close()


def test_the_http_mode_does_not_start_without_a_token(capsys):
    with pytest.raises(SystemExit):
        server.main(["--http", "8000"])
    assert "--http needs --token-file" in capsys.readouterr().err


def test_the_homes_xauthority_gives_xlib_an_entry_and_prints_nothing(tmp_path, capsys):
    """An empty .Xauthority made python-xlib (pyautogui's) print a warning to stdout in every
    `python -c "import pyautogui; ..."`, which OSWorld's `execute_python_command` getters read
    as the first line of the path they print (`vlc_config`, a browser profile's file)."""
    from Xlib import xauth

    from envab.envs.xdesktop.image import WHEELS

    assert "python3-xlib==0.15" in WHEELS  # the version read here is the image's
    path = tmp_path / ".Xauthority"
    server.write_xauthority(path)
    entries = list(xauth.Xauthority(str(path)))
    assert capsys.readouterr().out == ""
    family, _, number, name, cookie = entries[0]
    assert (family, number, name, len(cookie)) == (256, b"0", b"MIT-MAGIC-COOKIE-1", 16)
    path.write_bytes(b"")  # what the server wrote before: the warning, on stdout
    xauth.Xauthority(str(path))
    assert "no xauthority details" in capsys.readouterr().out
