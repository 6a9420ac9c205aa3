#!/usr/bin/env python3
"""The in-environment server of the real X desktop: it runs *inside* the environment (the gVisor
sandbox's root, later the QEMU guest), with the image's own Python, so it imports nothing of
env-ab and only what the image holds (Pillow, python3-xlib, pyautogui).

It starts the display (Xvfb, the openbox window manager, Ctrl+Alt+T bound to a terminal) and
answers the requests OSWorld's task configs, its controllers and its getters make
(`desktop_env/controllers/python.py`), on the same routes: GET /screenshot, POST /execute (a
command list or string, e.g. a pyautogui one-liner), /run_python, /run_bash_script, /file,
/list_directory, /screen_size, GET /platform, and the set-up steps under /setup/ (launch,
execute, open_file, upload, activate_window, close_window). Routes a getter may ask for but this
desktop does not provide (/terminal; /accessibility where the image carries no AT-SPI) answer
501.

Two ways in, one set of handlers:
- `--http PORT --token-file F`: an HTTP server on loopback (`--bind` for a forwarded port) that
  answers only callers sending F's bearer token: whoever reaches it runs commands here;
- `--stdio`: the env-ab host's channel over standard input and output (a gVisor sandbox has no
  network): length-prefixed JSON frames, the same operations as the Pillow desktop's worker
  (prepare, hello, init, arm, step, observe, state, close) plus `http`, which carries one raw
  request to the handlers above (the host relays OSWorld's getters through it);
- `--port NAME`: the same channel over a virtio-serial port (a QEMU guest, started by systemd).

Every screenshot carries its frame number (the environment's step count), as the host's gates
expect; the fault switches are the worker's (kill, stall, blank, stale, corrupt restore).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import email.parser
import hashlib
import hmac
import http.client
import io
import json
import os
import random
import re
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

DISPLAY = ":0"
HOME = Path(os.environ.get("HOME", "/root"))
SETTLE_S = 1.0  # the longest a step waits for the screen to stop changing
# The longest a set-up step waits for a window: Mousepad takes 5 s in a gVisor sandbox here, and
# 30 to 90 s in a QEMU guest under TCG (more when the machine is busy).
WINDOW_WAIT_S = 300.0
_HEADER = struct.Struct("!I")
MAX_FRAME = 64 * 2**20  # as envs/channel.py: an answer past it is refused, not sent
# What a getter may read back: a file whose bytes fit a frame, a listing a metric can walk.
MAX_FILE = 32 * 2**20
MAX_LISTED, MAX_DEPTH = 10_000, 32
# Where the host's frozen files wait for the set-up step that places them (`op_stage`): outside
# HOME, so the state hash reads only what set-up placed; emptied after each set-up.
STAGE = Path("/tmp/envab-files")
# The browser's remote-debugging port, OSWorld's (Chromium's launcher adds it where a task names
# none): the one port a checker's byte stream (`op_browser`) may open, inside this environment.
DEBUGGING_PORT = 1337
BROWSER_STREAMS = 8  # open at once: a getter holds one WebSocket, plus its HTTP look-ups
BROWSER_CHUNK = 2**20  # the most one answer carries back; the rest waits for the next ask
BROWSER_WAIT_S = 1.0  # the longest an ask waits for the browser's first byte
BROWSER_UP_S = 120.0  # a set-up step's wait for the browser's port (OSWorld's: 15 tries, 5 s apart)
# The accessibility tree (AT-SPI), where OSWorld's getters read what an application shows (the
# address bar of Chrome's window): an image that carries AT-SPI (the full one) starts its bus
# beside the display, on a session bus every application started here joins.
ACCESSIBILITY_BUS = Path("/usr/libexec/at-spi-bus-launcher")
SESSION_BUS = Path("/tmp/envab-session-bus")
# The namespaces of OSWorld's tree on Linux, which desktop-env's metrics select with
# (metrics/general.py; tests/test_accessibility.py holds the two to each other).
TREE_NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
TREE_DEPTH, TREE_WIDTH = 50, 1024  # OSWorld's bounds on one walk: deeper or wider is not read
# This one's: past it the tree is refused, not cut short (a cut tree reads as an element that
# is not there, a wrong score rather than a named failure).
TREE_NODES = 200_000
TREE_CALL_MS = 20_000  # the longest one application's answer to one question is waited for
# The image's Google Chrome is Debian's Chromium behind OSWorld's launcher name (image.py), and
# its windows and its node in the tree say "Chromium". OSWorld's name -> the image's: a set-up
# step that looks for a window by OSWorld's name (`activate_window` "Google Chrome", or its
# class) finds the image's, and the tree names the application as on OSWorld's x86 machine,
# where its getters look for the address bar ("application[name=Google Chrome] entry[...]").
STAND_INS = {"Google Chrome": "Chromium", "google-chrome": "chromium"}
APPLICATION_NAMES = {"Chromium": "Google Chrome"}  # the image's -> OSWorld's, in the tree
# Ubuntu's desktop opens a terminal on Ctrl+Alt+T, and OSWorld's set-ups press it and then look
# for the window `Terminal`. The server binds the key rather than openbox: openbox starts a
# command with GLib's spawn, which fails in a gVisor sandbox ("Failed to close file descriptor
# for child process": its close_range refuses CLOSE_RANGE_CLOEXEC with EINVAL).
TERMINAL = ["st", "-t", "Terminal"]
# The folders a home on OSWorld's Ubuntu machine starts with (xdg-user-dirs), which its set-ups
# write into without making them (`mkdir ~/Desktop/todo_list_Jan_1`).
USER_DIRS = ("Desktop", "Documents", "Downloads", "Music", "Pictures", "Public", "Templates",
             "Videos")  # fmt: skip


def encode(message) -> bytes:
    """envs/channel.py's frame payload (this server runs without the env-ab package, so it
    keeps its own copy; tests/test_channel.py holds the two to each other)."""

    def tagged(value):
        if isinstance(value, bytes | bytearray):
            return {"$bytes": base64.b64encode(value).decode("ascii")}
        raise TypeError(f"a channel message cannot carry {type(value).__name__}")

    return json.dumps(message, default=tagged, separators=(",", ":"), allow_nan=False).encode()


def decode(data: bytes):
    def untagged(obj: dict):
        if set(obj) == {"$bytes"}:
            return base64.b64decode(obj["$bytes"], validate=True)
        return obj

    return json.loads(data, object_hook=untagged)


class SetupError(RuntimeError):
    """A set-up step that cannot run here (the host fails the environment's set-up gate)."""


# --- the display -------------------------------------------------------------------------------


class Display:
    def __init__(self):
        self.size: tuple[int, int] | None = None
        self.children: list[subprocess.Popen] = []  # X server, window manager, applications
        self.woken = 0.0  # when the window manager was last woken
        self.waking: subprocess.Popen | None = None  # the last wake-up, until it has exited
        self.tree = False  # AT-SPI's bus is up: the accessibility tree can be walked

    def start(self, width: int, height: int) -> None:
        if self.size is not None:
            if self.size != (width, height):
                raise SetupError(f"display is {self.size}, asked for {(width, height)}")
            return
        os.environ["DISPLAY"] = DISPLAY
        for folder in USER_DIRS:
            (HOME / folder).mkdir(parents=True, exist_ok=True)
        self.spawn(["Xvfb", DISPLAY, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp",
                    "-noreset", "-nocursor"])  # fmt: skip
        wait_for(lambda: Path("/tmp/.X11-unix/X0").exists(), 20, "the X server")
        wait_for(lambda: run(["xdpyinfo"], timeout=5).returncode == 0, 20, "the X server")
        write_xauthority(HOME / ".Xauthority")
        self.spawn(["openbox"])
        wait_for(lambda: _wm_running(), 20, "the window manager")
        self.bind_terminal_key()
        self.start_accessibility()
        self.size = (width, height)

    def bind_terminal_key(self) -> None:
        """Ctrl+Alt+T (whatever Caps or Num Lock say) opens TERMINAL in the home folder: grabbed
        here, then served by a thread of the server on a connection of its own. A thread, not
        a process: a second interpreter took over 20 s to start in a QEMU guest under TCG on a
        loaded host."""
        from Xlib import XK, X, error
        from Xlib import display as xdisplay

        shown = xdisplay.Display(DISPLAY)
        root = shown.screen().root
        code = shown.keysym_to_keycode(XK.string_to_keysym("t"))
        held = error.CatchError(error.BadAccess)
        for locks in (0, X.LockMask, X.Mod2Mask, X.LockMask | X.Mod2Mask):
            root.grab_key(code, X.ControlMask | X.Mod1Mask | locks, True, X.GrabModeAsync,
                          X.GrabModeAsync, onerror=held)  # fmt: skip
        shown.sync()
        if held.get_error():
            raise SetupError("Ctrl+Alt+T is held by another client of the display")

        def serve() -> None:
            while True:
                if shown.next_event().type == X.KeyPress:
                    self.spawn(TERMINAL, cwd=HOME)

        threading.Thread(target=serve, name="terminal-key", daemon=True).start()

    def start_accessibility(self) -> None:
        """A session bus for everything started from here on, and AT-SPI's bus, which the
        applications' bridges (GTK's, Chromium's) find on the display and join: the tree
        `/accessibility` walks. Nothing where the image carries no AT-SPI (the base)."""
        if not ACCESSIBILITY_BUS.exists():
            return
        address = f"unix:path={SESSION_BUS}"
        self.spawn(["dbus-daemon", "--session", "--nofork", "--nopidfile",
                    f"--address={address}"])  # fmt: skip
        wait_for(SESSION_BUS.exists, 20, "the session bus")
        os.environ["DBUS_SESSION_BUS_ADDRESS"] = address
        os.environ["ACCESSIBILITY_ENABLED"] = "1"  # Chromium joins the bus only when asked
        self.spawn([str(ACCESSIBILITY_BUS), "--launch-immediately"])
        wait_for(lambda: "AT_SPI_BUS(" in run(["xprop", "-root", "AT_SPI_BUS"], timeout=5).stdout,
                 20, "the accessibility bus")  # fmt: skip
        self.tree = True

    def wake(self) -> None:
        """After a restore, send the window manager an event. In a gVisor copy, openbox leaves
        the first window mapped after the restore unmanaged (never shown) until another X event
        reaches it: measured, a terminal launched first hung 2 creates in 5, none with this.

        Sent, not waited for: in a QEMU guest under TCG on a loaded host, the command took over
        10 s to exit after a restore and failed every create of a batch that waited on it; the
        nudge is an X event, and nothing after it needs openbox to have handled it yet."""
        if self.size is None or (self.waking is not None and self.waking.poll() is None):
            return  # no display yet, or the last wake-up is still on its way
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
                 "stderr": subprocess.DEVNULL}  # fmt: skip
        self.waking = subprocess.Popen(["openbox", "--reconfigure"], start_new_session=True,
                                       cwd=HOME, **quiet)  # fmt: skip
        self.woken = time.monotonic()

    def shown(self, name: str, by_class: bool = False) -> list[str]:
        """The windows named `name` that are shown. One that exists but is not shown may be
        waiting on the same lost wake-up (after the restore's wake, a terminal's first window
        still went unshown past the create's timeout in 3 of 17 runs of its test): wake the
        window manager again, at most once a second."""
        found = _window(name, by_class)
        if not found and time.monotonic() - self.woken > 1.0 and _window(name, by_class, False):
            self.wake()
        return found

    def spawn(self, argv, **kw) -> subprocess.Popen:
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
                 "stderr": subprocess.DEVNULL}  # fmt: skip
        proc = subprocess.Popen(argv, start_new_session=True, **quiet, **kw)
        self.children.append(proc)
        return proc

    def grab(self):
        from PIL import ImageGrab

        return ImageGrab.grab(xdisplay=DISPLAY)


def write_xauthority(path: Path) -> None:
    """One entry for this display, as a login session leaves it. Xvfb here is started without
    `-auth` and asks no cookie, so the cookie is never checked and a fixed one keeps the home's
    bytes the same in every environment. Not an empty file: python-xlib (pyautogui) prints
    "Xlib.xauth: warning, no xauthority details available" *to stdout* on reading one, and a
    getter that prints a path through `python -c "import pyautogui; ..."` (OSWorld's
    `execute_python_command`: `vlc_config`, the browser's profile) then reads that warning as
    the first line of its path."""

    def field(b: bytes) -> bytes:
        return struct.pack(">H", len(b)) + b

    family_local = 256  # X's FamilyLocal: a connection over the display's Unix socket
    entry = (struct.pack(">H", family_local) + field(socket.gethostname().encode())
             + field(DISPLAY.lstrip(":").encode()) + field(b"MIT-MAGIC-COOKIE-1")
             + field(bytes(16)))  # fmt: skip
    path.write_bytes(entry)


def _wm_running() -> bool:
    out = run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], timeout=5)
    return out.returncode == 0 and "window id" in out.stdout


def run(argv, timeout: float = 30, shell: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, shell=shell,
                          cwd=HOME, check=False)  # fmt: skip


def wait_for(ok, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(0.05)
    raise SetupError(f"{what} did not come up within {timeout_s} s")


def png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


# --- the OSWorld routes ------------------------------------------------------------------------


def _command(body: dict):
    command, shell = body.get("command"), bool(body.get("shell", False))
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    if not command:
        raise ValueError("no command")
    return command, shell


class Routes:
    def __init__(self, display: Display):
        self.display = display

    def handle(self, method: str, path: str, content_type: str, body: bytes):
        """(status, content type, body bytes) for one request."""
        route = urlsplit(path).path.rstrip("/") or "/"
        name = "r_" + route.strip("/").replace("/", "_")
        handler = getattr(self, name, None)
        if handler is None:
            return 404, "application/json", json.dumps({"error": f"no route {route}"}).encode()
        try:
            data = parse_body(content_type, body)
            status, kind, out = handler(method, data)
        except NotImplementedError as e:
            return 501, "application/json", json.dumps({"error": str(e)}).encode()
        except (ValueError, KeyError, TypeError, OSError, SetupError) as e:
            error = {"error": f"{type(e).__name__}: {e}"}
            return 400, "application/json", json.dumps(error).encode()
        if isinstance(out, (dict, list)):
            return status, "application/json", json.dumps(out).encode()
        if isinstance(out, str):
            return status, kind, out.encode()
        return status, kind, out

    # Observation
    def r_screenshot(self, method, data):
        return 200, "image/png", png(self.display.grab())

    def r_screen_size(self, method, data):
        w, h = self.display.size or (0, 0)
        return 200, "application/json", {"width": w, "height": h}

    def r_platform(self, method, data):
        return 200, "text/plain", "Linux"

    def r_terminal(self, method, data):
        raise NotImplementedError("this desktop provides no terminal getter")

    def r_accessibility(self, method, data):
        if self.display is None or not self.display.tree:  # AT-SPI aborts with no bus to join
            raise NotImplementedError("this desktop has no accessibility bus (its image carries "
                                      "no AT-SPI, or its display has not started)")  # fmt: skip
        return 200, "", {"AT": accessibility_tree()}

    # Commands
    def r_execute(self, method, data):
        command, shell = _command(data)
        done = run(command, timeout=float(data.get("timeout", 120)), shell=shell)
        return 200, "", {"status": "success" if done.returncode == 0 else "error",
                         "output": done.stdout, "error": done.stderr,
                         "returncode": done.returncode}  # fmt: skip

    r_setup_execute = r_execute

    def r_run_python(self, method, data):
        done = run([sys.executable, "-c", data["code"]], timeout=float(data.get("timeout", 30)))
        return 200, "", {"status": "success" if done.returncode == 0 else "error",
                         "message": "", "output": done.stdout, "error": done.stderr,
                         "return_code": done.returncode}  # fmt: skip

    def r_run_bash_script(self, method, data):
        done = subprocess.run(["bash", "-c", data["script"]], capture_output=True, text=True,
                              timeout=float(data.get("timeout", 30)),
                              cwd=data.get("working_dir") or HOME, check=False)  # fmt: skip
        return 200, "", {"status": "success" if done.returncode == 0 else "error",
                         "output": done.stdout, "error": done.stderr,
                         "returncode": done.returncode}  # fmt: skip

    def r_setup_launch(self, method, data):
        command, shell = _command(data)
        self.display.spawn(command, shell=shell, cwd=HOME)
        return 200, "text/plain", "launched"

    def r_setup_open_file(self, method, data):
        path = Path(data["path"]).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"no file {path}")
        self.display.spawn(["xdg-open", str(path)], cwd=HOME)
        wait_for(lambda: self.display.shown(path.name), WINDOW_WAIT_S, f"a window for {path.name}")
        return 200, "text/plain", "opened"

    def r_setup_activate_window(self, method, data):
        # A window a set-up step just launched may take seconds to map: wait for it.
        # The window found is the one activated: a second search can miss it while a wake-up
        # has the window manager remap its windows.
        name, by_class = data["window_name"], bool(data.get("by_class"))
        found: list[str] = []
        try:
            wait_for(lambda: found.extend(self.display.shown(name, by_class)) or found,
                     WINDOW_WAIT_S, f"window {name!r}")  # fmt: skip
        except SetupError:
            raise ValueError(f"no window {name!r} within {WINDOW_WAIT_S} s") from None
        run(["xdotool", "windowactivate", "--sync", found[0]], timeout=10)
        return 200, "text/plain", "activated"

    def r_setup_close_window(self, method, data):
        for window in _window(data["window_name"], by_class=bool(data.get("by_class"))):
            run(["xdotool", "windowclose", window], timeout=10)
        return 200, "text/plain", "closed"

    def r_setup_upload(self, method, data):
        path = Path(data["file_path"]).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        content = data["file_data"]
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return 200, "text/plain", "uploaded"

    # Files
    def r_file(self, method, data):
        path = Path(data["file_path"]).expanduser()
        if not path.is_file():
            return 404, "application/json", {"error": f"no file {path}"}
        with path.open("rb") as f:  # read at most one byte past the limit, whatever the file
            content = f.read(MAX_FILE + 1)
        if len(content) > MAX_FILE:
            return 413, "application/json", {"error": f"{path} is over {MAX_FILE} bytes"}
        return 200, "application/octet-stream", content

    def r_list_directory(self, method, data):
        root = Path(data["path"]).expanduser()
        seen = 0

        def tree(p: Path, depth: int) -> dict:
            nonlocal seen
            seen += 1
            if seen > MAX_LISTED or depth > MAX_DEPTH:  # a link loop or a huge tree
                raise ValueError(f"{root} lists over {MAX_LISTED} entries or {MAX_DEPTH} levels")
            node = {"name": p.name, "type": "directory" if p.is_dir() else "file"}
            if p.is_dir() and not p.is_symlink():
                node["children"] = [tree(c, depth + 1) for c in sorted(p.iterdir())]
            return node

        return 200, "", tree(root, 0)


def _window(name: str, by_class: bool = False, visible: bool = True) -> list[str]:
    """The windows whose title (or class) matches `name`, else its stand-in's (STAND_INS)."""
    only = ["--onlyvisible"] if visible else []
    for each in (name, STAND_INS.get(name)):
        if each is not None:
            found = run(["xdotool", "search", *only, "--class" if by_class else "--name", each],
                        timeout=10).stdout.split()  # fmt: skip
            if found:
                return found
    return []


def parse_body(content_type: str, body: bytes) -> dict:
    if not body:
        return {}
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "application/json":
        return json.loads(body)
    if kind == "application/x-www-form-urlencoded":
        return {k: v[0] for k, v in parse_qs(body.decode()).items()}
    if kind == "multipart/form-data":
        message = email.parser.BytesParser().parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
        )
        out = {}
        for part in message.get_payload():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            out[name] = payload if part.get_filename() else payload.decode()
        return out
    try:
        return json.loads(body)
    except ValueError:
        return {}


# --- the accessibility tree --------------------------------------------------------------------


def accessibility_tree() -> str:
    """The desktop's accessibility tree as OSWorld's server answers it on Linux: under a
    `desktop-frame`, an element per node named by its role ("push button": `push-button`), with
    its name, states (`st:`), attributes (`attr:`), extents on the screen (`cp:`), value
    (`val:`) and actions (`act:`) as attributes and its text as text. Walked with AT-SPI's own
    bindings (OSWorld's pyatspi is a layer over them); NotImplementedError where the image
    carries none."""
    try:
        import gi

        gi.require_version("Atspi", "2.0")
        from gi.repository import Atspi, GLib
    except (ImportError, ValueError):
        raise NotImplementedError("this desktop's image carries no accessibility tree") from None
    import warnings
    from xml.etree import ElementTree

    for prefix, uri in TREE_NS.items():
        ElementTree.register_namespace(prefix, uri)
    # An application's answer may take seconds in a QEMU guest under TCG; AT-SPI's default wait
    # (under a second) would leave a slow browser out of the tree, which reads as a wrong score.
    Atspi.set_timeout(TREE_CALL_MS, TREE_CALL_MS)
    walk = _TreeWalk(Atspi, GLib.Error)
    root = ElementTree.Element("desktop-frame")
    with warnings.catch_warnings():
        # the bindings flag the `*_iface` getters, pyatspi's own way in, as deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        desktop = Atspi.get_desktop(0)
        for i in range(min(desktop.get_child_count(), TREE_WIDTH)):
            app = walk.read(lambda i=i: desktop.get_child_at_index(i), None)
            if app is not None and (element := walk.element(app, 1)) is not None:
                root.append(element)
    return ElementTree.tostring(root, encoding="unicode")


class _TreeWalk:
    """One walk of the tree. An application answers for each node over D-Bus, and may fail to
    (it went away, or a node was removed mid-walk): a node whose role or name it cannot give is
    left out with what is under it, and a detail it cannot give (its states, text, value...)
    is left off the node, as OSWorld's walk leaves out what raises."""

    def __init__(self, atspi, error):
        self.atspi, self.error = atspi, error
        self.nodes = 0

    def element(self, node, depth: int):
        from xml.etree import ElementTree

        self.nodes += 1
        if self.nodes > TREE_NODES:
            raise ValueError(f"the accessibility tree has more than {TREE_NODES} nodes")
        try:
            role = _xml_text(node.get_role_name() or "").strip()
            name = _xml_text(node.get_name() or "")
        except self.error:
            return None
        if role == "application":
            name = APPLICATION_NAMES.get(name, name)
        attrib = {"name": name}
        for state in self.read(lambda: node.get_state_set().get_states(), []):
            attrib[_ns("st", state.value_name.removeprefix("ATSPI_STATE_").lower())] = "true"
        for key, value in (self.read(node.get_attributes, None) or {}).items():
            if _XML_NAME(key):
                attrib[_ns("attr", key)] = _xml_text(value)
        attrib.update(self.interfaces(node, attrib))
        # a role the application names itself, where AT-SPI has none, may be no XML name
        tag = role.replace(" ", "-")
        element = ElementTree.Element(tag if _XML_NAME(tag) else "unknown", attrib)
        text = self.read(lambda: self.text(node), "")
        if text:
            element.text = text
        if depth < TREE_DEPTH:
            for i in range(min(self.read(node.get_child_count, 0), TREE_WIDTH)):
                child = self.read(lambda i=i: node.get_child_at_index(i), None)
                if child is not None and (sub := self.element(child, depth + 1)) is not None:
                    element.append(sub)
        return element

    def read(self, get, default):
        try:
            return get()
        except self.error:
            return default

    def interfaces(self, node, attrib: dict) -> dict:
        """The node's extents (showing nodes only, as OSWorld's), image, selection, value and
        actions, each read on its own: one an application fails to give leaves the others."""
        atspi, out = self.atspi, {}
        showing = attrib.get(_ns("st", "visible")) == attrib.get(_ns("st", "showing")) == "true"
        if showing:
            out |= self.read(lambda: self.extents(node), {})
        if node.get_image_iface() is not None:
            out["image"] = "true"
        if node.get_selection_iface() is not None:
            out["selection"] = "true"
        value = node.get_value_iface()
        if value is not None:
            for key, read in (("value", atspi.Value.get_current_value),
                              ("min", atspi.Value.get_minimum_value),
                              ("max", atspi.Value.get_maximum_value),
                              ("step", atspi.Value.get_minimum_increment)):  # fmt: skip
                got = self.read(lambda read=read: read(value), None)
                if got is not None:
                    out[_ns("val", key)] = str(got)
        action = node.get_action_iface()
        if action is not None:
            out |= self.read(lambda: self.actions(action), {})
        return out

    def extents(self, node) -> dict:
        component = node.get_component_iface()
        if component is None:
            return {}
        box = self.atspi.Component.get_extents(component, self.atspi.CoordType.SCREEN)
        return {_ns("cp", "screencoord"): str((box.x, box.y)),
                _ns("cp", "size"): str((box.width, box.height))}  # fmt: skip

    def actions(self, action) -> dict:
        act, out = self.atspi.Action, {}
        for i in range(min(act.get_n_actions(action), TREE_WIDTH)):
            verb = (act.get_action_name(action, i) or "").replace(" ", "-")
            if _XML_NAME(verb):
                out[_ns("act", f"{verb}_desc")] = _xml_text(
                    act.get_action_description(action, i) or "")  # fmt: skip
                out[_ns("act", f"{verb}_kb")] = _xml_text(act.get_key_binding(action, i) or "")
        return out

    def text(self, node) -> str:
        text = node.get_text_iface()
        if text is None:
            return ""
        count = self.atspi.Text.get_character_count(text)
        got = self.atspi.Text.get_text(text, 0, count) or ""
        return _xml_text(got.replace("\ufffc", "").replace("\ufffd", ""))


def _ns(prefix: str, name: str) -> str:
    return f"{{{TREE_NS[prefix]}}}{name}"


# What XML 1.0 can carry: an application may name an attribute or hold text it cannot (a
# control character), which would make the whole tree unreadable; such a name is left out and
# such a character dropped.
_XML_NAME = re.compile(r"[A-Za-z_][\w.\-]*\Z").match
_XML_BAD = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(value) -> str:
    return _XML_BAD.sub("", str(value))


# --- the environment: set-up steps, actions, state, faults -------------------------------------

SETUP_STEPS = ("launch", "execute", "command", "sleep", "open", "activate_window", "close_window",
               "download", "chrome_open_tabs")  # fmt: skip
KEYS = {"enter", "tab", "backspace", "escape", "space", "up", "down", "left", "right", "delete",
        "home", "end", "pageup", "pagedown", "f2", "ctrl", "shift", "alt"}  # fmt: skip


class Environment:
    def __init__(self, display: Display):
        self.display = display
        self.routes = Routes(display)
        self.steps = 0
        self.faults: dict = {}
        self.shown: tuple[bytes, int] | None = None
        self.machine = False  # the environment is a whole machine (a QEMU guest), not a process
        self.staged: dict[str, Path] = {}  # url -> its file, delivered by the host (op_stage)
        self.streams: dict[int, socket.socket] = {}  # a checker's byte streams (op_browser)
        self.debugging_port = DEBUGGING_PORT

    def setup(self, config: list) -> dict[str, bytes]:
        """OSWorld set-up steps, in order; anything else is refused (the host's set-up gate).
        What a command step prints under a name (its `stdout`, `stderr`), by that name: OSWorld
        keeps it in its cache folder for an evaluation's `cache_file` getter. OSWorld fails no
        command step on its exit; here a step without such a name still fails the set-up when
        its command exits non-zero (a set-up that did not happen), and one with a name does not
        (`diff`, `grep`: the answer is what it printed)."""
        printed: dict[str, bytes] = {}
        for step in config:
            kind, params = step.get("type"), step.get("parameters", {}) or {}
            if kind == "screen":
                continue  # the display's size, already made by prepare
            if kind not in SETUP_STEPS:
                raise SetupError(f"set-up step {kind!r} is not one of {SETUP_STEPS}")
            if kind == "sleep":
                time.sleep(float(params.get("seconds", 1)))
                continue
            if kind == "download":
                self.download(params.get("files"))
                continue
            if kind == "chrome_open_tabs":
                self.chrome_open_tabs(params.get("urls_to_open"))
                continue
            route = {"launch": "setup/launch", "execute": "setup/execute",
                     "command": "setup/execute", "open": "setup/open_file",
                     "activate_window": "setup/activate_window",
                     "close_window": "setup/close_window"}[kind]  # fmt: skip
            status, _, out = self.routes.handle("POST", "/" + route, "application/json",
                                                json.dumps(params).encode())  # fmt: skip
            if status != 200:
                raise SetupError(f"set-up step {kind}: {out.decode(errors='replace')[:200]}")
            if kind not in ("execute", "command"):
                continue
            done = json.loads(out)
            names = {k: params.get(k) for k in ("stdout", "stderr") if params.get(k)}
            for key, name in names.items():
                printed[str(name)] = (done["output"] if key == "stdout" else done["error"]).encode()
            if done["returncode"] != 0 and not names:
                raise SetupError(f"set-up step {kind} exited {done['returncode']}")
        return printed

    def download(self, files) -> None:
        """OSWorld's `download` step, its bytes from the host's store: each file was delivered
        by `op_stage` before the set-up began. Nothing here reaches the network (a gVisor
        sandbox has none), so a file the host did not deliver fails the set-up, named."""
        if not isinstance(files, list) or not files:
            raise SetupError("a download step's parameters.files must be a non-empty list")
        for f in files:
            url, path = f.get("url"), f.get("path")
            if url not in self.staged:
                raise SetupError(f"download {url}: not delivered from the host's frozen files "
                                 "(this environment fetches nothing from the network)")  # fmt: skip
            dest = Path(path).expanduser()
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.staged[url], dest)

    def chrome_open_tabs(self, urls) -> None:
        """OSWorld's `chrome_open_tabs` step: each URL in a new tab of the running browser, and
        the tab it started with closed after the first opens. OSWorld's controller does this
        from outside with Playwright over the debugging port; here the environment asks its own
        browser on that port (DevTools' HTTP endpoints), so nothing of the task's runs on the
        host. A page that does not load (this environment has no network) stays an error tab,
        as OSWorld's step ignores a load that times out."""
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise SetupError("a chrome_open_tabs step's urls_to_open must be a list of URLs")
        wait_for(lambda: self._devtools("GET", "/json/version") is not None, BROWSER_UP_S,
                 f"the browser's debugging port {self.debugging_port}")  # fmt: skip
        first = [t for t in self._devtools("GET", "/json/list") if t.get("type") == "page"]
        for i, url in enumerate(urls):
            self._devtools("PUT", "/json/new?" + quote(url, safe=""))
            if i == 0 and first:  # Playwright's context.pages[0]: the tab it started with
                self._devtools("GET", "/json/close/" + quote(str(first[0].get("id")), safe=""))

    def _devtools(self, method: str, path: str):
        """One request to the browser's DevTools HTTP endpoints: its JSON, or its text."""
        conn = http.client.HTTPConnection("127.0.0.1", self.debugging_port, timeout=30)
        try:
            conn.request(method, path)
            reply = conn.getresponse()
            body = reply.read(MAX_FILE)
        except (OSError, http.client.HTTPException) as e:
            raise OSError(f"the browser's debugging port: {e}") from None
        finally:
            conn.close()
        if reply.status != 200:
            raise SetupError(f"{method} {path}: the browser answered {reply.status}")
        try:
            return json.loads(body)
        except ValueError:
            return body.decode(errors="replace")

    def unstage(self) -> None:
        for path in self.staged.values():
            path.unlink(missing_ok=True)
        self.staged.clear()

    def act(self, action: dict) -> None:
        import pyautogui

        pyautogui.FAILSAFE = False  # a click in a corner is an action, not an emergency
        pyautogui.PAUSE = 0
        kind, p = action["action_type"], action.get("parameters") or {}
        w, h = self.display.size
        if kind in ("CLICK", "DOUBLE_CLICK", "MOVE_TO"):
            x, y = p["x"], p["y"]
            if not (0 <= x < w and 0 <= y < h):
                raise ValueError(f"{kind} at ({x}, {y}) lies outside the {w}x{h} screen")
            if kind == "MOVE_TO":
                pyautogui.moveTo(x, y)
            else:
                pyautogui.click(x, y, clicks=2 if kind == "DOUBLE_CLICK" else 1, interval=0.05)
        elif kind == "TYPING":
            pyautogui.write(p["text"], interval=0.01)
        elif kind == "PRESS":
            if p["key"].lower() not in KEYS:
                raise ValueError(f"PRESS key {p['key']!r} is not one of {sorted(KEYS)}")
            pyautogui.press(p["key"].lower())
        elif kind == "HOTKEY":
            keys = [k.lower() for k in p["keys"]]
            if not keys or any(len(k) != 1 and k not in KEYS for k in keys):
                raise ValueError(f"HOTKEY keys {p['keys']!r}: letters, digits or {sorted(KEYS)}")
            pyautogui.hotkey(*keys)
        elif kind == "SCROLL":
            pyautogui.scroll(int(p["dy"]))
        elif kind == "WAIT":
            time.sleep(min(float(p.get("seconds", 1)), 5.0))
        elif kind in ("DONE", "FAIL"):
            pass
        else:
            raise ValueError(f"action_type {kind!r} is not supported by this desktop")

    def settled(self):
        """The screen once two looks 50 ms apart agree, or after SETTLE_S."""
        deadline = time.monotonic() + SETTLE_S
        last = self.display.grab()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.display.grab()
            if now.tobytes() == last.tobytes():
                return now
            last = now
        return last

    def state_hash(self) -> str:
        """sha256 over the home folder (names and contents): what the task's checks read."""
        h = hashlib.sha256()
        for path in sorted(p for p in HOME.rglob("*") if p.is_file()):
            h.update(str(path.relative_to(HOME)).encode() + b"\0")
            try:
                h.update(hashlib.sha256(path.read_bytes()).digest())
            except OSError:
                h.update(b"?")
        return h.hexdigest()

    # operations (the host's channel)
    def op_prepare(self, size):
        self.display.start(*size)
        return {"pid": os.getpid()}

    def op_hello(self):
        random.seed()
        self.display.wake()
        return {"pid": os.getpid(), "state_sha256": self.state_hash()}

    def op_init(self, size, config, faults):
        t0 = time.perf_counter()
        self.display.start(*size)
        self.op_arm(faults)
        try:
            self.setup(config)
        finally:
            self.unstage()
        image = self.settled()
        self.shown = (png(image), self.steps)
        return {"state_sha256": self.state_hash(), "screenshot": self.shown[0],
                "timings": {"restore_s": 0.0, "setup_s": time.perf_counter() - t0}}  # fmt: skip

    def op_arm(self, faults):
        self.faults = dict(faults or {})
        if self.faults.get("corrupt_restore"):  # a restore that kept an earlier episode's file
            (HOME / ".envab-leftover").write_text("left by an earlier episode\n")
        return {"state_sha256": self.state_hash()}

    def op_step(self, action):
        try:
            self.act(action)
        except (ValueError, KeyError, TypeError) as e:
            return {"rejected": str(e).splitlines()[0]}
        self.steps += 1
        if self.faults.get("kill_at_step") == self.steps:
            if self.machine:  # a guest's environment dies with its machine: power off at once
                Path("/proc/sysrq-trigger").write_text("o")
            os._exit(137)  # a sandbox's init ignores its own SIGKILL: die as abruptly
        if self.faults.get("stall_at_step") == self.steps:
            time.sleep(float(self.faults.get("stall_s", 3600)))
        state = self.state_hash()
        if self.faults.get("stale_at_step") == self.steps and self.shown is not None:
            shot, frame = self.shown
            return {"screenshot": shot, "frame": frame, "state_sha256": state}
        image = self.settled()
        if self.faults.get("blank_at_step") == self.steps:
            from PIL import Image

            image = Image.new("RGB", image.size)
        self.shown = (png(image), self.steps)
        return {"screenshot": self.shown[0], "frame": self.steps, "state_sha256": state}

    def op_observe(self):
        self.shown = (png(self.display.grab()), self.steps)
        return {"screenshot": self.shown[0], "frame": self.steps,
                "state_sha256": self.state_hash()}  # fmt: skip

    def op_postconfig(self, config):
        try:
            printed = self.setup(config)
        finally:
            self.unstage()
        return {"state_sha256": self.state_hash(), "cache": printed}

    def op_stage(self, url, sha256, offset, data, size):
        """One part of a file the next set-up downloads, from the host's store, in order:
        `data` is its bytes from `offset` of `size`; the last part is checked against `sha256`
        (the digest the freeze recorded for `url`) before the file counts as delivered."""
        if not (
            isinstance(sha256, str) and len(sha256) == 64 and set(sha256) <= set("0123456789abcdef")
        ):
            raise ValueError(f"{sha256!r} is not a sha256")
        if not isinstance(data, bytes) or offset + len(data) > size:
            raise ValueError(f"{url}: a part past its file's {size} bytes")
        part = STAGE / f"{sha256}.part"
        STAGE.mkdir(parents=True, exist_ok=True)
        if offset == 0:
            part.write_bytes(b"")
        elif not part.exists() or part.stat().st_size != offset:
            raise ValueError(f"{url}: a part at {offset} out of order")
        with part.open("ab") as f:
            f.write(data)
        if offset + len(data) < size:
            return {"staged": False}
        digest = hashlib.sha256()
        with part.open("rb") as f:
            while chunk := f.read(2**20):
                digest.update(chunk)
        if digest.hexdigest() != sha256:
            part.unlink()
            raise ValueError(f"{url}: delivered bytes hash to {digest.hexdigest()}, not {sha256}")
        self.staged[url] = part.replace(STAGE / sha256)
        return {"staged": True}

    def op_state(self):
        return {"state": {"steps": self.steps}, "state_sha256": self.state_hash()}

    def op_http(self, method, path, content_type, body):
        status, kind, out = self.routes.handle(method, path, content_type, body)
        return {"status": status, "content_type": kind, "body": out}

    def op_browser(self, stream, data, close, wait):
        """One turn of a byte stream to the browser's debugging port (`debugging_port`, nothing
        else), for the host's checker: open `stream` on first use, send `data`, then answer
        what the browser sent back within `wait` seconds (as soon as a first byte comes, what
        else is ready with it). `open` false: the stream ended (closed by either end, or the
        browser refused it)."""
        if not (type(stream) is int and 0 <= stream < BROWSER_STREAMS):
            raise ValueError(f"stream {str(stream)[:20]!r} is not one of 0..{BROWSER_STREAMS - 1}")
        if close:
            with contextlib.suppress(KeyError):
                self.streams.pop(stream).close()
            return {"data": b"", "open": False}
        sock = self.streams.get(stream)
        if sock is None:
            try:
                sock = socket.create_connection(("127.0.0.1", self.debugging_port), timeout=5)
            except OSError:
                return {"data": b"", "open": False}
            self.streams[stream] = sock
        out, ended = bytearray(), False
        try:
            if data:
                sock.sendall(data)
            ready = select.select([sock], [], [], min(max(float(wait), 0.0), BROWSER_WAIT_S))[0]
            while ready and len(out) < BROWSER_CHUNK:
                chunk = sock.recv(BROWSER_CHUNK - len(out))
                if not chunk:
                    ended = True
                    break
                out += chunk
                ready = select.select([sock], [], [], 0)[0]
        except OSError:
            ended = True
        if ended:
            sock.close()
            del self.streams[stream]
        return {"data": bytes(out), "open": not ended}


# --- transports --------------------------------------------------------------------------------


def serve_stdio(env: Environment) -> None:
    """The host's channel over fds 0 and 1 (a gVisor sandbox's standard input and output)."""
    # Both ends move to fds no child inherits (os.dup's are not inheritable), and fds 0 and 1
    # become /dev/null and stderr: a command the agent runs, or a task's set-up, must not read
    # the host's requests or write frames of its own.
    into, out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)  # a stray print must not land in the channel
    sys.stdout = sys.stderr
    serve_frames(env, into, out, on_eof=lambda: os._exit(0))  # the host closed us


def serve_port(env: Environment, name: str) -> None:
    """The host's channel over a virtio-serial port (a QEMU guest): the same frames. A read of
    nothing means the host end is not connected (between a restore and the host's connect):
    wait for it rather than exit."""

    def found() -> str | None:  # the device by its name in sysfs: no wait for udev's symlink
        for named in Path("/sys/class/virtio-ports").glob("*/name"):
            if named.read_text().strip() == name:
                return f"/dev/{named.parent.name}"
        return None

    wait_for(found, 120, f"virtio-serial port {name}")
    fd = os.open(found(), os.O_RDWR)
    serve_frames(env, fd, fd, on_eof=lambda: time.sleep(0.05))


def serve_frames(env: Environment, rfd: int, wfd: int, on_eof) -> None:
    """Length-prefixed JSON frames (envs/channel.py), one operation each."""

    def read(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            select.select([rfd], [], [])
            chunk = os.read(rfd, n - len(buf))
            if not chunk:
                on_eof()
                continue
            buf += chunk
        return buf

    def send(message) -> None:
        data = encode(message)
        if len(data) > MAX_FRAME:
            data = encode({"error": f"an answer of {len(data)} bytes is over the frame limit"})
        view = memoryview(_HEADER.pack(len(data)) + data)
        while view:
            view = view[os.write(wfd, view) :]

    # A port whose host end is not connected yet takes no hello: the host asks for one itself.
    with contextlib.suppress(BrokenPipeError):
        send({"pid": os.getpid()})
    while True:
        (size,) = _HEADER.unpack(read(_HEADER.size))
        op, *args = decode(read(size))
        if op == "close":
            os._exit(0)
        try:
            reply = getattr(env, f"op_{op}")(*args)
        except Exception as e:  # the host turns it into a gate
            reply = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
        send(reply)


def request_handler(handle, token: str | None = None):
    """An HTTP handler class that answers every GET and POST with `handle(method, path,
    content type, body) -> (status, content type, body)` (this server; the host's relay).
    With `token`, a request without `Authorization: Bearer <token>` is answered 401 unread;
    a body over MAX_FRAME, 413."""

    class Handler(BaseHTTPRequestHandler):
        def _refuse(self, status: int, error: str) -> None:
            out = json.dumps({"error": error}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(out)
            self.close_connection = True

        def _any(self):
            given = self.headers.get("Authorization", "")
            wanted = f"Bearer {token}".encode()  # bytes: a non-ASCII header is just wrong
            if token is not None and not hmac.compare_digest(
                given.encode(errors="replace"), wanted
            ):
                return self._refuse(401, "no or wrong bearer token")
            try:
                size = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                return self._refuse(400, "Content-Length is not a number")
            if not 0 <= size <= MAX_FRAME:
                return self._refuse(413, f"a body of {size} bytes is over {MAX_FRAME}")
            body = self.rfile.read(size)
            status, kind, out = handle(
                self.command, self.path, self.headers.get("Content-Type", ""), body
            )
            self.send_response(status)
            self.send_header("Content-Type", kind or "application/octet-stream")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = _any

        def log_message(self, *args):
            pass

    return Handler


def serve_http(env: Environment, port: int, token: str, bind: str = "127.0.0.1") -> None:
    """The routes over HTTP, to callers that hold `token` only: whoever reaches this port can
    run commands in the environment. Loopback unless a forwarded port needs another `bind`."""
    handler = request_handler(env.routes.handle, token=token)
    ThreadingHTTPServer((bind, port), handler).serve_forever()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="env-ab's in-environment server (real X desktop)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--stdio", action="store_true")
    where.add_argument("--http", type=int, metavar="PORT")
    where.add_argument("--port", metavar="NAME", help="a virtio-serial port (a QEMU guest)")
    p.add_argument("--size", help="start the display at WxH (HTTP mode)")
    p.add_argument("--token-file", help="HTTP mode: the bearer token callers must send")
    p.add_argument("--bind", default="127.0.0.1", help="HTTP mode: the address to listen on")
    args = p.parse_args(argv)
    if args.http is not None and not args.token_file:
        p.error("--http needs --token-file: whoever reaches the port runs commands here")
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    env = Environment(Display())
    if args.stdio:
        serve_stdio(env)
    elif args.port:
        env.machine = True
        serve_port(env, args.port)
    else:
        if args.size:
            env.display.start(*(int(v) for v in args.size.split("x")))
        token = Path(args.token_file).read_text().strip()
        if len(token) < 16:
            p.error(f"{args.token_file}: a token of at least 16 characters is needed")
        serve_http(env, args.http, token, args.bind)


if __name__ == "__main__":
    main()
