"""The in-guest desktop agent: the embedded Desktop on /dev/fb0, driven by the virtual devices.

Runs inside the VM (Debian's python3 with the host's Pillow wheel), started by systemd. It holds
one prepared blank Desktop, which is what the warm snapshot captures. Everything an action says
arrives through the virtual tablet and keyboard (evdev): pointer position, button presses, wheel
notches, key presses. The host's control channel (virtio-serial, one JSON object per line) only
frames them: "the next action is a CLICK made of 2 clicks" or "TYPING of 5 keys", because one
computer_13 action (TYPING "abc") is several input events, and the desktop's clock ticks once
per action, not per key.

Every drawing also writes its frame number, 32 bits as white or black pixels in the row below the
desktop, as a display's frame counter: the host can tell a screen that stopped updating from one
whose picture did not change.

Requests, each with an "id" that the reply repeats:
    hello                       -> state_sha256, screen, fb, frame_sha256, frame, pid, boot_id
    setup {config}              -> state_sha256, frame_sha256, frame
    act {kind, n[, at]}         -> state_sha256, frame_sha256, frame, status | rejected
    state                       -> state, state_sha256
    settle                      -> ok (sync and drop caches: a smaller warm snapshot)
Any failure answers {"error": "..."}.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # /opt/envab (the envab package) and this folder

import evdev  # noqa: E402
from evdev import ecodes  # noqa: E402
from keymap import LINUX_TO_CHAR, LINUX_TO_PRESS, SHIFT_KEYS  # noqa: E402

from envab.envs.desktop import Desktop  # noqa: E402

PORT_NAME = "org.envab.desktop.0"
SCREEN = (128, 128)  # the embedded desktop's default screen
DEVICE_WAIT_S = 120.0
INPUT_WAIT_S = 5.0  # how long an action's input events may take to arrive after its frame
KDSETMODE, KD_GRAPHICS = 0x4B3A, 0x01


def log(message: str) -> None:
    print(f"envab-agent: {message}", file=sys.stderr, flush=True)


def wait_for(what: str, find):
    deadline = time.monotonic() + DEVICE_WAIT_S
    while (found := find()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"envab-agent: no {what} after {DEVICE_WAIT_S:.0f} s")
        time.sleep(0.2)
    return found


def find_port() -> str | None:
    for name in Path("/sys/class/virtio-ports").glob("*/name"):
        if name.read_text().strip() == PORT_NAME:
            return f"/dev/{name.parent.name}"
    return None


class Framebuffer:
    """/dev/fb0 at 32 bits per pixel (XRGB8888); the desktop is drawn at its top-left corner."""

    def __init__(self):
        sys_fb = Path("/sys/class/graphics/fb0")
        self.width, self.height = map(int, (sys_fb / "virtual_size").read_text().split(","))
        bpp = int((sys_fb / "bits_per_pixel").read_text())
        if bpp != 32:
            raise SystemExit(f"envab-agent: /dev/fb0 has {bpp} bits per pixel, 32 needed")
        self.stride = int((sys_fb / "stride").read_text())
        self.fd = os.open("/dev/fb0", os.O_RDWR)
        os.pwrite(self.fd, bytes(self.stride * self.height), 0)  # black around the desktop
        self.frames = 0  # drawings so far: the frame counter under the desktop

    def draw(self, image) -> str:
        """Write the image's rows and the next frame number under them; return the sha256 of the
        image's RGB bytes (what the host must see)."""
        rgb = image.convert("RGB")
        w, h = rgb.size
        bgrx = rgb.tobytes("raw", "BGRX")
        row = 4 * w
        for y in range(h):
            os.pwrite(self.fd, bgrx[y * row : (y + 1) * row], y * self.stride)
        self.frames += 1
        bits = b"".join(b"\xff" * 4 if self.frames >> i & 1 else bytes(4) for i in range(32))
        os.pwrite(self.fd, bits, h * self.stride)
        return hashlib.sha256(rgb.tobytes()).hexdigest()


class Input:
    """The virtual tablet and keyboard, read as atoms: clicks, key presses, wheel notches."""

    def __init__(self):
        self.devices = wait_for("virtual tablet and keyboard", self._find)
        names = {*(k for k, _ in LINUX_TO_CHAR), *LINUX_TO_PRESS}
        self.codes = {ecodes.ecodes[k]: k for k in names}
        self.shift_codes = {ecodes.ecodes[k] for k in SHIFT_KEYS}
        self.shift = set()
        self.abs = {ecodes.ABS_X: 0, ecodes.ABS_Y: 0}
        self.range = {}
        for dev in self.devices:
            caps = dev.capabilities()
            for code, info in caps.get(ecodes.EV_ABS, []):
                if code in self.abs:
                    self.range[code] = (info.min, info.max)
        self.atoms: list[tuple] = []

    @staticmethod
    def _find():
        tablet = keyboard = False
        chosen = []
        for path in evdev.list_devices():
            dev = evdev.InputDevice(path)
            caps = dev.capabilities()
            has_abs = any(c == ecodes.ABS_X for c, _ in caps.get(ecodes.EV_ABS, []))
            has_keys = ecodes.KEY_A in caps.get(ecodes.EV_KEY, [])
            if has_abs or has_keys:
                chosen.append(dev)
                tablet |= has_abs
                keyboard |= has_keys and "virtio" in dev.name.lower()  # not only the AT one
            else:
                dev.close()
        if tablet and keyboard:
            return chosen
        for dev in chosen:
            dev.close()
        return None

    def fds(self) -> dict[int, object]:
        return {dev.fd: dev for dev in self.devices}

    def pointer(self, fb: Framebuffer) -> tuple[int, int]:
        """The pointer in framebuffer pixels: the tablet's absolute range spans the screen."""
        (x0, x1), (y0, y1) = self.range[ecodes.ABS_X], self.range[ecodes.ABS_Y]
        x = (self.abs[ecodes.ABS_X] - x0) * fb.width // (x1 - x0 + 1)
        y = (self.abs[ecodes.ABS_Y] - y0) * fb.height // (y1 - y0 + 1)
        return x, y

    def read(self, dev, fb: Framebuffer) -> None:
        try:
            events = list(dev.read())
        except BlockingIOError:
            return
        for ev in events:
            if ev.type == ecodes.EV_ABS and ev.code in self.abs:
                self.abs[ev.code] = ev.value
            elif ev.type == ecodes.EV_REL and ev.code == ecodes.REL_WHEEL:
                for _ in range(abs(ev.value)):
                    self.atoms.append(("wheel", 1 if ev.value > 0 else -1, *self.pointer(fb)))
            elif ev.type == ecodes.EV_KEY:
                self._key(ev.code, ev.value, fb)

    def _key(self, code: int, value: int, fb: Framebuffer) -> None:
        if code in self.shift_codes:
            (self.shift.add if value else self.shift.discard)(code)
        elif code == ecodes.BTN_LEFT and value == 0:  # a click completes on release
            self.atoms.append(("click", *self.pointer(fb)))
        elif code == ecodes.BTN_GEAR_UP and value == 1:  # a tablet without a wheel axis
            self.atoms.append(("wheel", 1, *self.pointer(fb)))
        elif code == ecodes.BTN_GEAR_DOWN and value == 1:
            self.atoms.append(("wheel", -1, *self.pointer(fb)))
        elif code in self.codes and value == 1:
            self.atoms.append(("key", self.codes[code], bool(self.shift)))


def to_action(kind: str, atoms: list[tuple], at: bool) -> dict:
    """The computer_13 action that these input atoms spell, given the frame's kind."""
    if kind in ("DONE", "FAIL"):
        return {"action_type": kind, "parameters": {}}
    if kind == "CLICK":
        if not atoms or any(a[0] != "click" or a[1:] != atoms[0][1:] for a in atoms):
            raise ValueError(f"CLICK expects clicks at one point, read {atoms}")
        _, x, y = atoms[0]
        return {"action_type": "CLICK", "parameters": {"x": x, "y": y, "num_clicks": len(atoms)}}
    if kind == "TYPING":
        try:
            text = "".join(LINUX_TO_CHAR[(a[1], a[2])] for a in atoms if a[0] == "key")
        except KeyError as e:
            raise ValueError(f"TYPING read a key that types nothing: {e}") from None
        if len(text) != len(atoms):
            raise ValueError(f"TYPING expects key presses only, read {atoms}")
        return {"action_type": "TYPING", "parameters": {"text": text}}
    if kind == "PRESS":
        if len(atoms) != 1 or atoms[0][0] != "key" or atoms[0][1] not in LINUX_TO_PRESS:
            raise ValueError(f"PRESS expects one named key, read {atoms}")
        return {"action_type": "PRESS", "parameters": {"key": LINUX_TO_PRESS[atoms[0][1]]}}
    if kind == "SCROLL":
        if any(a[0] != "wheel" for a in atoms):
            raise ValueError(f"SCROLL expects wheel notches only, read {atoms}")
        params = {"dy": sum(a[1] for a in atoms)}
        if at and atoms:
            params["x"], params["y"] = atoms[0][2], atoms[0][3]
        return {"action_type": "SCROLL", "parameters": params}
    raise ValueError(f"unknown action kind {kind!r}")


class Agent:
    def __init__(self):
        self.fb = wait_for(
            "framebuffer", lambda: Framebuffer() if Path("/dev/fb0").exists() else None
        )
        self.input = Input()
        path = wait_for(f"virtio-serial port {PORT_NAME}", find_port)
        self.port = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self.buffer = b""
        self.desktop = Desktop(*SCREEN)
        self._quiet_console()
        self.frame = self.fb.draw(self.desktop.screenshot())
        log(f"ready: fb {self.fb.width}x{self.fb.height}, port {path}")

    @staticmethod
    def _quiet_console() -> None:
        """Stop the text console drawing over the desktop (cursor blink, kernel messages)."""
        import fcntl

        try:
            with open("/dev/tty1", "wb") as tty:
                fcntl.ioctl(tty.fileno(), KDSETMODE, KD_GRAPHICS)
        except OSError as e:
            log(f"console stays in text mode: {e}")

    def serve(self) -> None:
        while True:
            fds = [self.port, *self.input.fds()]
            ready, _, _ = select.select(fds, [], [])
            for fd in ready:
                if fd == self.port:
                    self._read_port()
                else:
                    self.input.read(self.input.fds()[fd], self.fb)

    def _read_port(self) -> None:
        try:
            chunk = os.read(self.port, 65536)
        except BlockingIOError:
            return
        if not chunk:  # the host end is not connected: wait instead of spinning
            time.sleep(0.05)
            return
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if line.strip():
                self._answer(line)

    def _answer(self, line: bytes) -> None:
        request = {}
        try:
            request = json.loads(line)
            reply = getattr(self, f"op_{request['op']}")(request)
        except Exception as e:  # reported to the host, which turns it into a failed gate
            reply = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
        reply["id"] = request.get("id") if isinstance(request, dict) else None
        self._send(reply)

    def _send(self, reply: dict) -> None:
        data = (json.dumps(reply, separators=(",", ":")) + "\n").encode()
        while data:
            try:
                data = data[os.write(self.port, data) :]
            except BlockingIOError:
                select.select([], [self.port], [], 1.0)

    # --- operations -------------------------------------------------------------------------

    def op_hello(self, request: dict) -> dict:
        return {
            "state_sha256": self.desktop.state_hash(),
            "screen": list(SCREEN),
            "fb": [self.fb.width, self.fb.height],
            "frame_sha256": self.frame,
            "frame": self.fb.frames,
            "pid": os.getpid(),
            "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        }

    def op_setup(self, request: dict) -> dict:
        self.desktop.setup(request["config"])
        self.frame = self.fb.draw(self.desktop.screenshot())
        return {
            "state_sha256": self.desktop.state_hash(),
            "frame_sha256": self.frame,
            "frame": self.fb.frames,
        }

    def op_act(self, request: dict) -> dict:
        n = int(request["n"])
        deadline = time.monotonic() + INPUT_WAIT_S
        while len(self.input.atoms) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                got, self.input.atoms = self.input.atoms, []
                raise TimeoutError(f"input: read {len(got)} of {n} events for {request['kind']}")
            ready, _, _ = select.select(list(self.input.fds()), [], [], left)
            for fd in ready:
                self.input.read(self.input.fds()[fd], self.fb)
        atoms, self.input.atoms = self.input.atoms[:n], self.input.atoms[n:]
        action = to_action(request["kind"], atoms, bool(request.get("at")))
        try:
            self.desktop.apply(action)
        except ValueError as e:  # the desktop refused it (off screen, after DONE): no change
            return {"rejected": str(e).splitlines()[0], "action": action}
        self.frame = self.fb.draw(self.desktop.screenshot())
        return {
            "state_sha256": self.desktop.state_hash(),
            "frame_sha256": self.frame,
            "frame": self.fb.frames,
            "status": self.desktop.state()["status"],
            "action": action,
        }

    def op_state(self, request: dict) -> dict:
        return {"state": self.desktop.state(), "state_sha256": self.desktop.state_hash()}

    def op_settle(self, request: dict) -> dict:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return {"ok": True}


if __name__ == "__main__":
    Agent().serve()
