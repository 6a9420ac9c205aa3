"""Build the real X desktop's root file system, cached by a digest of its inputs.

    python -m envab.envs.xdesktop.image [--cache build/xdesktop]

debootstrap (Debian bookworm, minbase) with an X server (Xvfb), a window manager (openbox), real
applications (the Mousepad text editor, the st terminal, the Gnumeric spreadsheet), the tools
the in-environment server drives them with (xdotool, x11-utils), the host's exact Pillow and
pyautogui (wheels, pinned), and the in-environment server (`envs/xdesktop/server.py`) at
/opt/envab/xdesktop/server.py. The folder is the root of every gVisor sandbox of the X desktop,
mounted read-only (each sandbox writes to its own memory), so every environment starts from the
same files; and, as an ext4 disk with its own kernel, the QEMU arm's guest
(envs/xdesktop/qemu.py), where systemd starts the same server on a virtio-serial port: both
arms run the same files.

Two stages under the cache folder: `base/<digest>` (debootstrap and wheels; keyed by the suite,
the package list, the wheels, which application opens what, and RECIPE) and `image.json` beside
it (the base plus the server; keyed by the base digest and the sha256 of the server and its
systemd unit), whose digest names the image in receipts.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import PIL

from envab.envs.qemu.image import (
    MASKED,
    MIRROR,
    SUITE,
    BuildError,
    _dpkg_versions,
    _pillow_wheel,
    _run,
    _unmount_under,
)
from envab.envs.qemu.tools import require
from envab.errors import Refusal, refused
from envab.hashing import sha256_file, sha256_json
from envab.io import atomic_write_json

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("server.py")
UNIT = Path(__file__).with_name("envab-xdesktop.service")
GUEST_PACKAGES = (
    "linux-image-amd64",
    "initramfs-tools",
    "systemd-sysv",
    "udev",
    "kmod",
    "qemu-guest-agent",
)
# A QEMU guest's writable folders, in its memory as a gVisor sandbox's are (envs/host/gvisor.py):
# the root disk stays read-only and shared by every VM.
FSTAB = """tmpfs /tmp tmpfs mode=1777 0 0
tmpfs /root tmpfs mode=0700 0 0
"""
PACKAGES = (
    "python3",
    "python3-tk",  # pyautogui imports mouseinfo, which exits without tkinter
    "xvfb",
    "x11-utils",  # xdpyinfo, xprop: the server waits on them
    "xdotool",
    "openbox",
    "mousepad",
    # The terminal is st: xterm and VTE terminals wait for the kernel to make the pty they open
    # their shell's controlling terminal, which gVisor does only on an explicit TIOCSCTTY.
    "stterm",
    "gnumeric",  # the spreadsheet: saves .xlsx, which OSWorld's table metrics read
    "xdg-utils",
    "libfile-mimeinfo-perl",  # xdg-open types a file by its name (mimetype), as desktops do:
    "shared-mime-info",  # with `file` alone an empty notes.txt is inode/x-empty, opened by nothing
    "dbus-x11",  # the session bus GTK's settings (dconf) ask for; debootstrap picks no virtuals
    "fonts-dejavu-core",
    "procps",
    # The same folder is the QEMU arm's guest (envs/xdesktop/qemu.py): a kernel, and the init
    # that starts the server on its virtio-serial port. A gVisor sandbox runs none of them.
    *GUEST_PACKAGES,
)
# pyautogui and what it imports on Linux, pure-Python wheels (pip wheel), pinned.
WHEELS = (
    "pyautogui==0.9.54",
    "mouseinfo==0.1.3",
    "pygetwindow==0.0.9",
    "pymsgbox==2.0.1",
    "pyperclip==1.11.0",
    "pyrect==0.2.0",
    "pyscreeze==1.0.1",
    "python3-xlib==0.15",
    "pytweening==1.2.0",
)
RECIPE = 3  # 2: the QEMU guest's packages, masked units and tmpfs mounts; 3: mimeapps in inputs
SITE = "usr/local/lib/python3.11/dist-packages"
# GTK's text caret blinks (on and off every 0.6 s for its first 10 s): a screenshot would show it
# or not by chance. A desktop whose screens are compared across arms keeps it steady.
GTK_SETTINGS = """[Settings]
gtk-cursor-blink = false
"""
# Which application opens what (xdg-open of a text file opens Mousepad).
MIMEAPPS = """[Default Applications]
text/plain=org.xfce.mousepad.desktop
application/vnd.openxmlformats-officedocument.spreadsheetml.sheet=gnumeric.desktop
"""


@dataclass(frozen=True)
class Built:
    digest: str
    rootfs: Path
    record: dict


def base_inputs() -> dict:
    return {
        "recipe": RECIPE,
        "suite": SUITE,
        "packages": sorted(PACKAGES),
        "wheels": sorted(WHEELS),
        "pillow": PIL.__version__,
        "masked": sorted(MASKED),
        "fstab": FSTAB,
        "mimeapps": MIMEAPPS,
    }


def _wheels(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), *WHEELS],
         "pip wheel pyautogui")  # fmt: skip
    names = {w.split("==")[0].replace("-", "_").lower() for w in WHEELS}
    found = [w for w in folder.glob("*.whl") if w.name.split("-")[0].lower() in names]
    if len(found) != len(WHEELS):
        raise BuildError(f"expected {len(WHEELS)} wheels in {folder}, found {len(found)}")
    return sorted(found)


def build_base(cache: Path, rootfs: Path) -> dict:
    require("debootstrap")
    if rootfs.exists():
        _unmount_under(rootfs)
        shutil.rmtree(rootfs)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    debs = (cache / "debs").resolve()
    debs.mkdir(parents=True, exist_ok=True)
    _run(
        [require("debootstrap"), "--variant=minbase", f"--include={','.join(PACKAGES)}",
         f"--cache-dir={debs}", SUITE, str(rootfs), MIRROR],
        "debootstrap",
    )  # fmt: skip
    site = rootfs / SITE
    site.mkdir(parents=True, exist_ok=True)
    wheels = [_pillow_wheel(cache / "wheels"), *_wheels(cache / "wheels")]
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:  # a wheel is a zip laid out as site-packages
            zf.extractall(site)
    apps = rootfs / "usr/share/applications"
    apps.mkdir(parents=True, exist_ok=True)
    (apps / "mimeapps.list").write_text(MIMEAPPS)
    (rootfs / "etc/hostname").write_text("env\n")  # a gVisor sandbox's hostname
    (rootfs / "etc/fstab").write_text(FSTAB)
    for unit in MASKED:  # services a restored guest does not need, as the QEMU arm's Pillow guest
        link = rootfs / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (rootfs / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    for cache_dir in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                      "usr/share/man"):  # fmt: skip
        shutil.rmtree(rootfs / cache_dir, ignore_errors=True)
        (rootfs / cache_dir).mkdir(parents=True, exist_ok=True)
    return {
        "wheels": {w.name: sha256_file(w) for w in wheels},
        "dpkg": _dpkg_versions(rootfs),
    }


def ensure_desktop(cache: Path = REPO / "build" / "xdesktop", log=print) -> Built:
    """The X desktop's root file system, building whatever is not cached; one builder at a time."""
    cache = cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another X desktop build under {cache}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        base_digest = sha256_json(base_inputs())
        base_dir = cache / "base" / base_digest[:16]
        rootfs = base_dir / "rootfs"
        base_record = base_dir / "base.json"
        if not base_record.is_file():
            log(f"X desktop base {base_digest[:16]}: debootstrap {SUITE} (minutes)")
            t0 = time.monotonic()
            built = build_base(cache, rootfs)
            built["build_s"] = round(time.monotonic() - t0, 1)
            record = {"digest": base_digest, "inputs": base_inputs(), **built}
            atomic_write_json(base_record, record)
        files = {
            "server": {"path": "opt/envab/xdesktop/server.py", "sha256": sha256_file(SERVER)},
            "unit": {"path": f"etc/systemd/system/{UNIT.name}", "sha256": sha256_file(UNIT)},
            "gtk": {"path": "etc/gtk-3.0/settings.ini", "sha256": sha256_json(GTK_SETTINGS)},
        }
        digest = sha256_json({"base": base_digest, **files})
        record_path = base_dir / "image.json"
        if not record_path.is_file() or _load(record_path).get("digest") != digest:
            for name, source in (("server", SERVER), ("unit", UNIT)):
                target = rootfs / files[name]["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
            (rootfs / files["gtk"]["path"]).write_text(GTK_SETTINGS)
            wants = rootfs / "etc/systemd/system/multi-user.target.wants" / UNIT.name
            wants.parent.mkdir(parents=True, exist_ok=True)
            wants.unlink(missing_ok=True)
            wants.symlink_to(f"/etc/systemd/system/{UNIT.name}")
            atomic_write_json(record_path, {"digest": digest, "base": base_digest, **files})
        return Built(digest, rootfs, _load(record_path))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=REPO / "build" / "xdesktop")
    args = p.parse_args(argv)
    try:
        built = ensure_desktop(args.cache, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (Refusal, BuildError, subprocess.SubprocessError) as e:
        return refused(e, prefix="envab.envs.xdesktop.image", code=1)
    print(f"{built.digest[:16]} {built.rootfs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
