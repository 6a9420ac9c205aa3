"""Build the real X desktop's root file system, cached by a digest of its inputs.

    python -m envab.envs.xdesktop.image [--cache build/xdesktop] [--image base|full]

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

Two images (envs/xdesktop/apps.py says which applications each has). `base`, above, is the one
CI builds and the default everywhere. `full` is built on request only (`--image full`, or an
arm's `image: full`): the base's folder copied and the applications OSWorld's domains need
installed into it by apt inside a chroot (FULL_PACKAGES: LibreOffice Calc, Writer and Impress,
Chromium with OSWorld's `google-chrome` name and a remote debugging port, GIMP, VLC,
Thunderbird; about 400 MB to download, 2.7 GB on disk), cached under `full/<digest>` by a digest
of the base's digest, the package list and the files it writes, then finished with the same
server stage.
Its record lists every package's version, as the base's does.
"""

from __future__ import annotations

import argparse
import contextlib
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
from envab.envs.xdesktop.apps import APPS, DEFAULT_IMAGE, check_image
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
# The full image's applications (apps.APPS["full"]), from Debian's archive, no recommends: each
# package's own dependencies only, so the image holds what the list names and no more.
FULL_PACKAGES = (
    "libreoffice-calc",
    "libreoffice-writer",
    "libreoffice-impress",
    "libreoffice-gtk3",  # the GTK look OSWorld's Ubuntu machine has, rather than bare X11 widgets
    "libreoffice-style-colibre",  # an icon theme: without one the toolbars are blank
    "chromium",
    "socat",  # OSWorld's Chrome tasks forward the debugging port with it at set-up
    "gimp",
    "vlc",
    "thunderbird",
    "fonts-liberation2",  # metric-compatible with the fonts office files name
    "curl",  # a scripted check asks Chromium's debugging port what it shows
    # What OSWorld's set-up steps take for granted on its Ubuntu machine (its os tasks, measured
    # by the no-op check: docs/results/2026-12-03-full-image-and-noop.md): `python`, `sudo`,
    # `gsettings` with GNOME's schemas and the dconf backend, and xsetroot for a background.
    "python-is-python3",
    "sudo",
    "libglib2.0-bin",
    "gsettings-desktop-schemas",
    "dconf-gsettings-backend",
    "x11-xserver-utils",
    # The accessibility tree OSWorld's getters read (AT-SPI, as on its GNOME machine): the bus
    # the applications' bridges join, and the bindings the server walks it with.
    "at-spi2-core",
    "python3-gi",
    "gir1.2-atspi-2.0",
)
# 2: what OSWorld's set-ups take for granted (packages, /home/user, background); 3: AT-SPI;
# 4: sudo as a stand-in
FULL_RECIPE = 4
# OSWorld's tasks launch `google-chrome --remote-debugging-port=1337`; Debian has Chromium. Its
# sandbox needs user namespaces a gVisor sandbox's root does not hand a process, and Chromium
# refuses to run as root without --no-sandbox; the environment itself is the sandbox. A launch
# that names no debugging port gets OSWorld's (1337), where its Chrome getters look, and one that
# names no profile gets Google Chrome's folder (~/.config/google-chrome), where its profile
# getters read Preferences, Bookmarks and History. Its pages join the accessibility tree, where
# OSWorld's getters read the address bar (the server starts the bus, server.py).
CHROME = """#!/bin/sh
case " $* " in
  *" --remote-debugging-port="*) port= ;;
  *) port=--remote-debugging-port=1337 ;;
esac
case " $* " in
  *" --user-data-dir="*) profile= ;;
  *) profile=--user-data-dir=$HOME/.config/google-chrome ;;
esac
exec /usr/bin/chromium --no-sandbox --no-first-run --no-default-browser-check \
  --password-store=basic --disable-dev-shm-usage --disable-gpu --force-renderer-accessibility \
  $port $profile "$@"
"""
# OSWorld's set-ups run `echo password | sudo -S CMD` as its user. Here that user is root, and
# Debian's sudo cannot run in a gVisor sandbox (its setresuid to read sudoers is refused), so a
# stand-in earlier on PATH runs CMD as root, reading the password line -S says comes on standard
# input as sudo does. Options that pick another user are read and not obeyed: root is every user.
SUDO = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -S|--stdin) IFS= read -r _ || true; shift ;;
    -u|-g|-p|-C|-h|-U|-r|-t|-T|-D|-R|--user|--group|--prompt) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || exec /bin/sh
exec "$@"
"""
# Which application opens what in the full image: office files in LibreOffice, as on OSWorld's
# machine (so the base image's Gnumeric task opens its .xlsx in Calc here), pages in Chromium,
# pictures in GIMP, media in VLC.
FULL_MIMEAPPS = """[Default Applications]
text/plain=org.xfce.mousepad.desktop
application/vnd.openxmlformats-officedocument.spreadsheetml.sheet=libreoffice-calc.desktop
application/vnd.oasis.opendocument.spreadsheet=libreoffice-calc.desktop
text/csv=libreoffice-calc.desktop
application/vnd.openxmlformats-officedocument.wordprocessingml.document=libreoffice-writer.desktop
application/vnd.oasis.opendocument.text=libreoffice-writer.desktop
application/vnd.openxmlformats-officedocument.presentationml.presentation=libreoffice-impress.desktop
application/vnd.oasis.opendocument.presentation=libreoffice-impress.desktop
text/html=chromium.desktop
image/png=gimp.desktop
image/jpeg=gimp.desktop
audio/x-wav=vlc.desktop
audio/mpeg=vlc.desktop
video/mp4=vlc.desktop
"""
# LibreOffice's defaults for every user (a sandbox's /root starts empty, so there is no profile
# to set them in): no Tip of the Day dialog over the document at first start, and no template
# chooser over a new presentation (OSWorld's machine has both dismissed), either of which would
# take the keyboard from the task: a key meant for the document or a terminal lands in it.
LIBREOFFICE_DEFAULTS = """<?xml version="1.0" encoding="UTF-8"?>
<oor:data xmlns:xs="http://www.w3.org/2001/XMLSchema"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xmlns:oor="http://openoffice.org/2001/registry">
 <dependency file="main"/>
 <oor:component-data oor:package="org.openoffice.Office" oor:name="Common">
  <node oor:name="Misc">
   <prop oor:name="ShowTipOfTheDay" oor:op="fuse"><value>false</value></prop>
  </node>
 </oor:component-data>
 <oor:component-data oor:package="org.openoffice.Office" oor:name="Impress">
  <node oor:name="Misc">
   <node oor:name="NewDoc">
    <prop oor:name="AutoPilot" oor:op="fuse"><value>false</value></prop>
   </node>
  </node>
 </oor:component-data>
</oor:data>
"""
# OSWorld's machine has a user `user` whose home is /home/user, which its tasks name; here the
# environment's user is root, its home /root (a tmpfs in a sandbox, written at set-up), so
# /home/user is that home under OSWorld's name.
HOME_LINK = ("home/user", "/root")
# A desktop with no window open is one colour, which the host's gate takes for a dead screen
# (screen_not_blank), and OSWorld's machine shows a wallpaper there: a fixed grid on the root
# window, drawn whenever openbox starts (or is told to reconfigure, after a restore).
OPENBOX = """#!/bin/sh
xsetroot -mod 16 16 -fg '#3c6e9b' -bg '#2f5a80' 2>/dev/null
exec /usr/bin/openbox "$@"
"""
# OSWorld's machine has run VLC before: its settings file exists, the first start's privacy
# question answered. Here a sandbox's home starts empty, so VLC's first start in every task shows
# that question over its window, and never writes the file: a task scored on VLC's settings
# (`vlc_config`) could not read one after a no-op. The launcher earlier on PATH writes the
# answer VLC itself writes (`qt-privacy-ask=0`; no metadata from the network, there is none)
# where no settings file exists yet, then starts VLC.
VLC = """#!/bin/sh
rc="$HOME/.config/vlc/vlcrc"
if [ ! -e "$rc" ]; then
  mkdir -p "${rc%/*}" &&
    printf '%s\\n' '[qt]' 'qt-privacy-ask=0' '' '[core]' 'metadata-network-access=0' > "$rc"
fi
exec /usr/bin/vlc "$@"
"""
POLICY_RC = "#!/bin/sh\nexit 101\n"  # no service starts while apt installs into the chroot


@dataclass(frozen=True)
class Built:
    digest: str
    rootfs: Path
    record: dict
    image: str = DEFAULT_IMAGE


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


def full_inputs(base_digest: str) -> dict:
    return {
        "recipe": FULL_RECIPE,
        "base": base_digest,
        "packages": sorted(FULL_PACKAGES),
        "chrome": CHROME,
        "sudo": SUDO,
        "mimeapps": FULL_MIMEAPPS,
        "libreoffice": LIBREOFFICE_DEFAULTS,
        "vlc_as_root": True,
        "vlc_launcher": VLC,
        "home_link": list(HOME_LINK),
        "openbox": OPENBOX,
    }


def build_full(cache: Path, base: Path, rootfs: Path) -> dict:
    """The base's folder copied to `rootfs`, FULL_PACKAGES installed into it by apt in a chroot
    (the .debs kept under `cache/debs-full` for a rebuild), then cleaned as the base is."""
    if rootfs.exists():
        _unmount_under(rootfs)
        shutil.rmtree(rootfs)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    _run(["cp", "-a", "--reflink=auto", str(base), str(rootfs)], "copy the base image")
    debs = (cache / "debs-full").resolve()
    debs.mkdir(parents=True, exist_ok=True)
    archives = rootfs / "var/cache/apt/archives"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    resolv = rootfs / "etc/resolv.conf"
    kept_resolv = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else None
    policy = rootfs / "usr/sbin/policy-rc.d"
    try:
        resolv.unlink(missing_ok=True)
        shutil.copyfile("/etc/resolv.conf", resolv)  # apt in the chroot resolves the mirror
        policy.write_text(POLICY_RC)
        policy.chmod(0o755)
        (rootfs / "etc/apt/sources.list").write_text(f"deb {MIRROR} {SUITE} main\n")
        _run(["mount", "-t", "proc", "proc", str(rootfs / "proc")], "mount /proc in the chroot")
        _run(["mount", "--bind", str(debs), str(archives)], "mount the .deb cache")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
               "LANG": "C.UTF-8", "HOME": "/root"}  # fmt: skip
        # The archive may be a frozen snapshot whose Release is past its Valid-Until (a mirror
        # kept for reproducible builds); the signatures are still checked.
        apt = ["chroot", str(rootfs), "apt-get", "-q", "-o", "Acquire::Check-Valid-Until=false"]
        _run([*apt, "update"], "apt-get update", env=env)
        _run([*apt, "install", "-y", "--no-install-recommends", *FULL_PACKAGES],
             "apt-get install the full image's applications", env=env)  # fmt: skip
    finally:
        _unmount_under(rootfs)
        policy.unlink(missing_ok=True)
        resolv.unlink(missing_ok=True)
        if kept_resolv is not None:
            resolv.write_bytes(kept_resolv)
    chrome = rootfs / "usr/local/bin/google-chrome"
    chrome.parent.mkdir(parents=True, exist_ok=True)
    chrome.write_text(CHROME)
    chrome.chmod(0o755)
    sudo = rootfs / "usr/local/bin/sudo"  # before /usr/bin on the server's PATH
    sudo.write_text(SUDO)
    sudo.chmod(0o755)
    (rootfs / "usr/share/applications/mimeapps.list").write_text(FULL_MIMEAPPS)
    openbox = rootfs / "usr/local/bin/openbox"  # before /usr/bin on the server's PATH
    openbox.write_text(OPENBOX)
    openbox.chmod(0o755)
    home = rootfs / HOME_LINK[0]
    home.parent.mkdir(parents=True, exist_ok=True)
    home.unlink(missing_ok=True)
    home.symlink_to(HOME_LINK[1])
    # Debian reads LibreOffice's configuration from /etc/libreoffice/registry, beside main.xcd
    (rootfs / "etc/libreoffice/registry/envab.xcd").write_text(LIBREOFFICE_DEFAULTS)
    vlc = _vlc_as_root(rootfs / "usr/bin/vlc")
    launcher = rootfs / "usr/local/bin/vlc"  # before /usr/bin on the server's PATH
    launcher.write_text(VLC)
    launcher.chmod(0o755)
    for cache_dir in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                      "usr/share/man"):  # fmt: skip
        shutil.rmtree(rootfs / cache_dir, ignore_errors=True)
        (rootfs / cache_dir).mkdir(parents=True, exist_ok=True)
    return {"dpkg": _dpkg_versions(rootfs), "vlc_root_check": vlc}


def _vlc_as_root(vlc: Path) -> str:
    """Debian's vlc exits when its effective uid is 0 ("VLC is not supposed to be run as root"),
    and the environment's server and what it launches run as root (in a gVisor sandbox, a
    uid of its own; in a VM, the guest's). The binary asks through the libc symbol `geteuid`;
    naming `getppid` instead (the same length, so the dynamic symbol table stays valid) makes
    the check compare a parent's pid, never 0, with 0: the usual way to run it as root."""
    data = vlc.read_bytes()
    found = data.count(b"geteuid")
    if found != 1:  # not the binary this was written for: left alone, and the record says so
        return f"not patched: {found} geteuid symbols"
    vlc.write_bytes(data.replace(b"geteuid", b"getppid"))
    return "patched: geteuid -> getppid"


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


def ensure_desktop(
    cache: Path = REPO / "build" / "xdesktop", log=print, image: str = DEFAULT_IMAGE
) -> Built:
    """The X desktop's root file system (`image`: apps.IMAGES), building whatever is not cached;
    one builder of each image at a time. The full image is built only when asked for by name."""
    check_image(image)
    cache = cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    with build_lock(cache / ".lock", log):
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
        if image == DEFAULT_IMAGE:
            digest, record = _finish(base_dir, base_digest, rootfs, image)
            return Built(digest, rootfs, record, image)
    # The full image under a lock of its own: its build takes many minutes, in which the base
    # stays usable (tests and arms on the base image wait for nothing).
    with build_lock(cache / ".lock-full", log):
        inputs = full_inputs(base_digest)
        full_digest = sha256_json(inputs)
        full_dir = cache / "full" / full_digest[:16]
        full_record = full_dir / "full.json"
        if not full_record.is_file():
            log(f"X desktop full image {full_digest[:16]}: apt-get install of "
                f"{len(FULL_PACKAGES)} packages into a copy of the base (minutes)")  # fmt: skip
            t0 = time.monotonic()
            built = build_full(cache, rootfs, full_dir / "rootfs")
            built["build_s"] = round(time.monotonic() - t0, 1)
            atomic_write_json(full_record, {"digest": full_digest, "inputs": inputs, **built})
        digest, record = _finish(full_dir, full_digest, full_dir / "rootfs", image)
        return Built(digest, full_dir / "rootfs", record, image)


@contextlib.contextmanager
def build_lock(path: Path, log):
    """Held while one process builds what `path` guards; another waits for it (a line says so)."""
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another X desktop build ({path.name} under {path.parent})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cached(cache: Path = REPO / "build" / "xdesktop", image: str = DEFAULT_IMAGE) -> bool:
    """Whether `image`'s packages are built under `cache` (the server stage is seconds): a test
    that needs the full image skips, rather than start a build of minutes and 400 MB, when it
    is not."""
    base_digest = sha256_json(base_inputs())
    if image == DEFAULT_IMAGE:
        return (cache / "base" / base_digest[:16] / "base.json").is_file()
    digest = sha256_json(full_inputs(base_digest))
    return (cache / check_image(image) / digest[:16] / "full.json").is_file()


def _finish(folder: Path, under: str, rootfs: Path, image: str) -> tuple[str, dict]:
    """The server stage on top of a built folder (the base or the full image's): the server, its
    systemd unit and GTK's settings, keyed by `under` (that folder's digest) and their sha256."""
    files = {
        "server": {"path": "opt/envab/xdesktop/server.py", "sha256": sha256_file(SERVER)},
        "unit": {"path": f"etc/systemd/system/{UNIT.name}", "sha256": sha256_file(UNIT)},
        "gtk": {"path": "etc/gtk-3.0/settings.ini", "sha256": sha256_json(GTK_SETTINGS)},
    }
    # the base image's digest is what it was before images had names: receipts keep their value
    named = {} if image == DEFAULT_IMAGE else {"image": image}
    digest = sha256_json({"base": under, **named, **files})
    record_path = folder / "image.json"
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
        atomic_write_json(record_path, {"digest": digest, "base": under, **named, **files,
                                        "apps": sorted(APPS[image])})  # fmt: skip
    return digest, _load(record_path)


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=REPO / "build" / "xdesktop")
    p.add_argument("--image", choices=sorted(APPS), default=DEFAULT_IMAGE,
                   help="base (the default, what CI builds) or full (OSWorld's applications, "
                   "about 400 MB of packages, 2.7 GB on disk: on request only)")  # fmt: skip
    args = p.parse_args(argv)
    try:
        built = ensure_desktop(args.cache, log=lambda m: print(m, file=sys.stderr, flush=True),
                               image=args.image)  # fmt: skip
    except (Refusal, BuildError, subprocess.SubprocessError) as e:
        return refused(e, prefix="envab.envs.xdesktop.image", code=1)
    print(f"{built.digest[:16]} {built.rootfs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
