"""Build the guest (Debian bookworm + the embedded desktop) and its warm snapshot, cached by digest.

Three stages, each cached under the cache folder (default `build/qemu`) by a digest of its inputs:

1. base   debootstrap --variant=minbase with PACKAGES and the host's exact Pillow wheel
          (Debian's python3-pil is older; the same wheel gives the same pixels). Keyed by the
          suite, the package list, the Pillow version and BASE_RECIPE (bump it when the base
          steps below change).
2. image  the base plus the project's desktop code and the in-guest agent, as an ext4 root
          (mkfs.ext4 -d) converted to qcow2, with the guest's kernel and initrd beside it.
          Keyed by the base digest and the sha256 of every copied file and of this script.
3. warm   boot the image once, wait for the desktop agent, check that the guest draws the blank
          desktop with exactly the host's pixels, drop caches, `savevm warm`. Keyed by the image
          digest, the VM's memory and acceleration, the QEMU version and the VM definition.

The record (`guest.json`, see `GuestRecord`) holds the digests and the acceleration for receipts.

    python -m envab.envs.qemu.image [--cache build/qemu] [--memory 256] [--accel auto] [--record F]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import PIL

from envab.envs.arm_schema import QEMU_DEFAULTS
from envab.envs.desktop import Desktop
from envab.envs.qemu.accel import choose
from envab.envs.qemu.tools import require
from envab.envs.qemu.vm import VM, AgentError, AgentTimeout, VMDied, VMSpec
from envab.errors import Refusal, refused
from envab.hashing import sha256_bytes, sha256_file, sha256_json
from envab.io import atomic_write_json
from envab.progress import job_console

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "linux-image-amd64",
    "initramfs-tools",
    "systemd-sysv",
    "udev",
    "kmod",
    "python3",
    "python3-evdev",
    "qemu-guest-agent",
)
BASE_RECIPE = 1
PYTHON_TAG = "cp311"  # bookworm's python3 is 3.11
# Services a read-only desktop guest does not need; masked so they do not wake it after restore.
MASKED = (
    "getty@.service",
    "serial-getty@.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "systemd-tmpfiles-clean.timer",
    "dpkg-db-backup.timer",
    "systemd-random-seed.service",
    "systemd-update-utmp.service",
    "ldconfig.service",
)
# repository path -> path under /opt/envab in the guest (the envab namespace, as installed)
GUEST_FILES = {
    "envab/__init__.py": "envab/__init__.py",
    "envab/hashing.py": "envab/hashing.py",
    "envs/__init__.py": "envab/envs/__init__.py",
    **{
        f"envs/desktop/{p.name}": f"envab/envs/desktop/{p.name}"
        for p in sorted((REPO / "envs/desktop").glob("*.py"))
    },
    "envs/qemu/keymap.py": "guest/keymap.py",
    "envs/qemu/guest/agent.py": "guest/agent.py",
}
UNIT = "envs/qemu/guest/envab-desktop.service"
BOOT_TIMEOUT_S = 600.0


def source_files() -> list[str]:
    """Repository files the guest is built from (a workflow rule's inputs)."""
    return sorted({*GUEST_FILES, UNIT, "envs/qemu/image.py", "envs/qemu/vm.py"})


class BuildError(RuntimeError):
    """A build step failed; the message is one line."""


@dataclass(frozen=True)
class ImageConfig:
    """The guest a qemu arm runs; the defaults are the config schema's (`envab.envs.arm_schema`)."""

    cache: Path = Path(QEMU_DEFAULTS["cache"])
    memory_mib: int = QEMU_DEFAULTS["memory_mib"]
    accel: str = QEMU_DEFAULTS["accel"]  # auto | kvm | tcg
    suite: str = SUITE
    mirror: str = MIRROR

    def __post_init__(self):
        if not 128 <= self.memory_mib <= 4096:
            raise ValueError(f"guest memory must be 128..4096 MiB, got {self.memory_mib}")


@dataclass(frozen=True)
class GuestRecord:
    """Everything a receipt needs to say which guest ran, and where its files are."""

    image_digest: str
    base_digest: str
    warm_digest: str
    memory_mib: int
    accel: str
    accel_reason: str
    qemu_version: str
    blank_state_sha256: str
    blank_frame_sha256: str
    inputs: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)  # name -> {"path", "sha256"}
    timings: dict = field(default_factory=dict)

    def path(self, name: str, cache: Path) -> Path:
        return cache / self.files[name]["path"]

    def spec(self, cache: Path) -> VMSpec:
        return VMSpec(
            root=self.path("root", cache),
            kernel=self.path("kernel", cache),
            initrd=self.path("initrd", cache),
            memory_mib=self.memory_mib,
            accel=self.accel,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, path: Path) -> GuestRecord:
        return cls(**json.loads(Path(path).read_text()))


def _run(args: list[str], what: str, **kw) -> None:
    result = subprocess.run(args, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()
        raise BuildError(f"{what} failed ({result.returncode}): {tail[-1] if tail else ''}")


def qemu_version() -> str:
    out = subprocess.run(
        [require("qemu-system-x86_64"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    return out.splitlines()[0].strip()


# --- stage 1: base ---------------------------------------------------------------------------


def base_inputs(config: ImageConfig) -> dict:
    return {
        "recipe": BASE_RECIPE,
        "suite": config.suite,
        "packages": sorted(PACKAGES),
        "pillow": PIL.__version__,
        "python": PYTHON_TAG,
        "masked": sorted(MASKED),
    }


def build_base(config: ImageConfig, rootfs: Path) -> dict:
    """debootstrap the root file system into `rootfs`; return what went into it."""
    require("debootstrap")
    if rootfs.exists():
        _unmount_under(rootfs)  # a failed debootstrap can leave /proc mounted in it
        shutil.rmtree(rootfs)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    debs = (config.cache / "debs").resolve()  # kept: a rebuild downloads only what changed
    debs.mkdir(parents=True, exist_ok=True)
    _run(
        [
            require("debootstrap"),
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            f"--cache-dir={debs}",
            config.suite,
            str(rootfs),
            config.mirror,
        ],
        "debootstrap",
    )
    wheel = _pillow_wheel(config.cache / "wheels")
    site = rootfs / "usr/local/lib/python3.11/dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:  # a wheel is a zip laid out as site-packages
        zf.extractall(site)
    for unit in MASKED:
        link = rootfs / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (rootfs / "etc/hostname").write_text("envab-guest\n")
    (rootfs / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    for cache in (
        "var/cache/apt/archives",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/locale",
    ):
        shutil.rmtree(rootfs / cache, ignore_errors=True)
        (rootfs / cache).mkdir(parents=True, exist_ok=True)
    return {
        "pillow_wheel": {"name": wheel.name, "sha256": sha256_file(wheel)},
        "dpkg": _dpkg_versions(rootfs),
    }


def _unmount_under(root: Path) -> None:
    root = root.resolve()
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted(points, reverse=True):  # the deepest first
        if Path(point) == root or root in Path(point).parents:
            subprocess.run(["umount", "-l", point], check=False)


def _pillow_wheel(folder: Path) -> Path:
    """The host's exact Pillow as a manylinux wheel for the guest's Python (pip download)."""
    folder.mkdir(parents=True, exist_ok=True)
    pattern = f"pillow-{PIL.__version__}-{PYTHON_TAG}-{PYTHON_TAG}-manylinux*x86_64*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                f"pillow=={PIL.__version__}",
                "--only-binary=:all:",
                "--no-deps",
                "--platform",
                "manylinux_2_28_x86_64",
                "--python-version",
                "3.11",
                "--implementation",
                "cp",
                "--abi",
                PYTHON_TAG,
                "-d",
                str(folder),
            ],
            "pip download pillow",
        )
        found = sorted(folder.glob(pattern))
    if not found:
        raise BuildError(f"no Pillow {PIL.__version__} {PYTHON_TAG} manylinux wheel in {folder}")
    return found[-1]


def _dpkg_versions(rootfs: Path) -> dict[str, str]:
    out = subprocess.run(
        ["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f", "${Package}\t${Version}\n"],
        capture_output=True,
        text=True,
    )
    return dict(line.split("\t", 1) for line in out.stdout.splitlines() if "\t" in line)


# --- stage 2: image --------------------------------------------------------------------------


def image_inputs(base_digest: str) -> dict:
    files = {src: sha256_file(REPO / src) for src in [*GUEST_FILES, UNIT]}
    return {"base": base_digest, "files": files, "builder": sha256_file(Path(__file__))}


def build_image(rootfs: Path, out: Path) -> dict:
    """Put the project's code into `rootfs`; write root.qcow2, vmlinuz and initrd.img to `out`."""
    require("mkfs.ext4")
    require("qemu-img")
    opt = rootfs / "opt/envab"
    shutil.rmtree(opt, ignore_errors=True)
    for src, dst in GUEST_FILES.items():
        (opt / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / src, opt / dst)
    unit = rootfs / "etc/systemd/system/envab-desktop.service"
    shutil.copyfile(REPO / UNIT, unit)
    wants = rootfs / "etc/systemd/system/multi-user.target.wants/envab-desktop.service"
    wants.parent.mkdir(parents=True, exist_ok=True)
    wants.unlink(missing_ok=True)
    wants.symlink_to("/etc/systemd/system/envab-desktop.service")
    return make_disk(rootfs, out)


def make_disk(rootfs: Path, out: Path) -> dict:
    """The guest's files from `rootfs`: its root as an ext4 disk in root.qcow2, its kernel and
    initrd beside it; their sha256s."""
    require("mkfs.ext4")
    qemu_img = require("qemu-img")
    out.mkdir(parents=True, exist_ok=True)
    for name, pattern in (("vmlinuz", "vmlinuz-*"), ("initrd.img", "initrd.img-*")):
        found = sorted((rootfs / "boot").glob(pattern))
        if not found:
            raise BuildError(f"the guest has no /boot/{pattern} (did linux-image-amd64 install?)")
        shutil.copyfile(found[-1], out / name)
    used = int(
        subprocess.run(
            ["du", "-sm", str(rootfs)], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )
    raw = out / "root.raw"
    _run(
        [
            require("mkfs.ext4"),
            "-q",
            "-F",
            "-L",
            "envab-root",
            "-d",
            str(rootfs),
            "-E",
            "root_owner=0:0",
            str(raw),
            f"{used + used // 4 + 64}M",
        ],
        "mkfs.ext4",
    )
    _run(
        [qemu_img, "convert", "-O", "qcow2", str(raw), str(out / "root.qcow2")], "qemu-img convert"
    )
    raw.unlink()
    return {name: sha256_file(out / name) for name in ("root.qcow2", "vmlinuz", "initrd.img")}


# --- stage 3: warm snapshot ------------------------------------------------------------------


def warm_inputs(image_digest: str, spec: VMSpec) -> dict:
    """A snapshot loads only into the same machine: same QEMU, memory and devices."""
    return {
        "image": image_digest,
        "memory_mib": spec.memory_mib,
        "accel": spec.accel,
        "qemu": qemu_version(),
        "vm": spec.definition(),
    }


def build_warm(spec: VMSpec, warm: Path) -> dict:
    """Boot once, check the desktop, and save the internal snapshot `warm` into `warm`."""
    _run([require("qemu-img"), "create", "-q", "-f", "qcow2", str(warm), "16M"], "qemu-img create")
    expected = Desktop()
    expected_frame = sha256_bytes(expected.screenshot().tobytes())
    with tempfile.TemporaryDirectory(prefix="envab-warm-") as tmp:
        vm = VM(spec, warm, Path(tmp))
        try:
            t0 = time.monotonic()
            vm.launch(loadvm=None)
            hello = _wait_agent(vm)
            boot_s = time.monotonic() - t0
            if hello["state_sha256"] != expected.state_hash():
                raise BuildError("the guest's blank desktop state differs from the host's")
            if hello["frame_sha256"] != expected_frame:
                raise BuildError(
                    "the guest renders the blank desktop with other pixels than "
                    "the host (Pillow differs?)"
                )
            w, h = hello["screen"]
            shown = vm.screendump().crop((0, 0, w, h))
            if sha256_bytes(shown.convert("RGB").tobytes()) != expected_frame:
                raise BuildError("the guest's screen does not show the desktop it drew")
            vm.guest_sync(timeout=60.0)  # qemu-guest-agent is up too
            vm.call("settle", timeout=60.0)
            time.sleep(1.0)  # let the guest go idle after dropping caches
            t1 = time.monotonic()
            vm.savevm("warm")
            save_s = time.monotonic() - t1
        except (AgentError, AgentTimeout, VMDied, OSError) as e:
            raise BuildError(f"warm boot: {e} (console: {_console_tail(Path(tmp))})") from None
        finally:
            vm.quit()
    return {
        "blank_state_sha256": hello["state_sha256"],
        "blank_frame_sha256": expected_frame,
        "fb": hello["fb"],
        "boot_s": round(boot_s, 1),
        "savevm_s": round(save_s, 2),
    }


def _wait_agent(vm: VM) -> dict:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while True:
        try:
            return vm.call("hello", timeout=5.0)
        except AgentTimeout:
            if not vm.alive():
                raise BuildError("the guest's QEMU exited during boot") from None
            if time.monotonic() > deadline:
                raise BuildError(
                    f"the desktop agent did not start in {BOOT_TIMEOUT_S:.0f} s "
                    f"(console: {_console_tail(vm.run_dir)})"
                ) from None


def _console_tail(run_dir: Path) -> str:
    path = run_dir / "console.log"
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return lines[-1][:200] if lines else "empty"


# --- all stages ------------------------------------------------------------------------------


def ensure_guest(config: ImageConfig, log=print, build: bool = True) -> GuestRecord:
    """The guest record for `config`, building whatever stage is not cached yet.

    With build=False a missing stage is a BuildError instead of minutes of building."""

    config.cache.mkdir(parents=True, exist_ok=True)
    lock = config.cache / ".lock"
    try:
        # Read-only is enough to lock: an ordinary user's run locks a cache root built.
        fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
    except PermissionError:
        raise BuildError(f"{lock} cannot be made here: {_as_root(config)}") from None
    with os.fdopen(fd) as held:
        # Two builders on one cache would delete each other's root file system.
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another guest build under {config.cache}")
            fcntl.flock(held, fcntl.LOCK_EX)
        return _ensure_guest(config, log, build)


def _as_root(config: ImageConfig) -> str:
    """How a guest an ordinary user cannot build is built: once, as root, for every user."""
    command = (
        f"python -m envab.envs.qemu.image --cache {config.cache} --memory {config.memory_mib}"
        f" --accel {config.accel}"
    )
    return (
        f"the guest's root file system is built by debootstrap, which needs root: build it once "
        f"as root (sudo .venv/bin/{command}; `bash setup` does, run by a user with sudo), "
        "then every user's run reuses it"
    )


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _read(record: Path, config: ImageConfig) -> dict:
    """A record of the cache; one root wrote 0600 (before records were shared) is refused with
    how to build it, not a traceback."""
    try:
        return json.loads(record.read_text())
    except PermissionError:
        raise BuildError(f"{record} is not readable here: {_as_root(config)}") from None


def _ensure_guest(config: ImageConfig, log, build: bool) -> GuestRecord:
    def building(what: str, by_a_user: bool = False) -> None:
        if not build:
            raise BuildError(
                f"{what} is not built under {config.cache}: run "
                f"python -m envab.envs.qemu.image --cache {config.cache} "
                f"--memory {config.memory_mib}"
            )
        # The base is debootstrap's (root's), and the image reads the base's root-only files:
        # an ordinary user builds neither. The warm stage only boots the image (`by_a_user`
        # where its folder is the user's to write).
        if os.geteuid() != 0 and not by_a_user:
            raise BuildError(f"{what} is not built under {config.cache}: {_as_root(config)}")
        log(what)

    for tool in ("qemu-system-x86_64", "qemu-img"):
        require(tool)
    accel = choose(config.accel)
    cache = config.cache
    timings = {}

    base_digest = sha256_json(base_inputs(config))
    base_dir = cache / "base" / base_digest[:16]
    base_record = base_dir / "base.json"
    image_digest = sha256_json(image_inputs(base_digest))
    image_dir = cache / "images" / image_digest[:16]
    image_record = image_dir / "image.json"
    if not image_record.is_file():
        if not base_record.is_file():
            building(f"guest base {base_digest[:16]}: debootstrap {config.suite} (minutes)")
            t0 = time.monotonic()
            built = build_base(config, base_dir / "rootfs")
            timings["base_s"] = round(time.monotonic() - t0, 1)
            atomic_write_json(
                base_record, {"digest": base_digest, "inputs": base_inputs(config), **built}
            )
        building(f"guest image {image_digest[:16]}: root file system and qcow2")
        t0 = time.monotonic()
        digests = build_image(base_dir / "rootfs", image_dir)
        timings["image_s"] = round(time.monotonic() - t0, 1)
        atomic_write_json(
            image_record,
            {
                "digest": image_digest,
                "base": base_digest,
                "inputs": image_inputs(base_digest),
                "files": digests,
            },
        )
    base = _read(base_record, config) if base_record.is_file() else {}
    image = _read(image_record, config)

    spec = VMSpec(
        root=image_dir / "root.qcow2",
        kernel=image_dir / "vmlinuz",
        initrd=image_dir / "initrd.img",
        memory_mib=config.memory_mib,
        accel=accel.mode,
    )
    winputs = warm_inputs(image_digest, spec)
    warm_digest = sha256_json(winputs)
    stem = f"warm-{config.memory_mib}-{accel.mode}"
    warm_path, warm_json = image_dir / f"{stem}.qcow2", image_dir / f"{stem}.json"
    warm = _read(warm_json, config) if warm_json.is_file() else {}
    if warm.get("digest") != warm_digest:
        building(
            f"warm snapshot {stem}: boot under {accel.mode}, wait for the desktop, savevm",
            by_a_user=_writable(image_dir),
        )
        t0 = time.monotonic()
        tmp = warm_path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        warm = build_warm(spec, tmp)
        tmp.rename(warm_path)
        timings["warm_s"] = round(time.monotonic() - t0, 1)
        warm.update(digest=warm_digest, inputs=winputs, sha256=sha256_file(warm_path))
        atomic_write_json(warm_json, warm)
    if os.geteuid() == 0:
        # Every record root built or found, readable by every user of the cache (each is
        # written 0600, like every record): a user's run reads them and writes nothing here.
        for record in (base_record, image_record, warm_json):
            if record.is_file():
                record.chmod(0o644)

    rel = image_dir.relative_to(cache)
    files = {
        "root": {"path": str(rel / "root.qcow2"), "sha256": image["files"]["root.qcow2"]},
        "kernel": {"path": str(rel / "vmlinuz"), "sha256": image["files"]["vmlinuz"]},
        "initrd": {"path": str(rel / "initrd.img"), "sha256": image["files"]["initrd.img"]},
        "warm": {"path": str(rel / f"{stem}.qcow2"), "sha256": warm["sha256"]},
    }
    return GuestRecord(
        image_digest=image_digest,
        base_digest=base_digest,
        warm_digest=warm_digest,
        memory_mib=config.memory_mib,
        accel=accel.mode,
        accel_reason=accel.reason,
        qemu_version=winputs["qemu"],
        blank_state_sha256=warm["blank_state_sha256"],
        blank_frame_sha256=warm["blank_frame_sha256"],
        inputs={
            "base": base_inputs(config),
            "image": image["inputs"],
            "warm": winputs,
            "pillow_wheel": base.get("pillow_wheel"),
        },
        files=files,
        timings={**timings, "boot_s": warm.get("boot_s"), "savevm_s": warm.get("savevm_s")},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build (or find cached) the QEMU guest")
    parser.add_argument("--cache", type=Path, default=ImageConfig.cache)
    parser.add_argument(
        "--memory", type=int, default=ImageConfig.memory_mib, help="guest memory in MiB"
    )
    parser.add_argument("--accel", choices=["auto", "kvm", "tcg"], default=ImageConfig.accel)
    parser.add_argument("--record", type=Path, help="also write the guest record here")
    parser.add_argument("--log", help="the job's log; the console then gets each stage built")
    args = parser.parse_args(argv)
    console = job_console("qemu guest", args.log, f"cache {args.cache.as_posix()}")

    def stage(message: str) -> None:
        print(message, file=sys.stderr, flush=True)
        console.say(message)

    try:
        config = ImageConfig(cache=args.cache, memory_mib=args.memory, accel=args.accel)
        record = ensure_guest(config, log=stage)
    except (Refusal, BuildError, ValueError) as e:
        return refused(e, console, prefix="envab.envs.qemu.image", code=1)
    out = args.record or args.cache / f"guest-{record.memory_mib}-{record.accel}.json"
    atomic_write_json(out, record.to_dict())
    line = (
        f"guest {record.image_digest[:16]} warm {record.warm_digest[:16]} "
        f"({record.accel}, {record.memory_mib} MiB) -> {out}"
    )
    print(line)
    console.say(f"done: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
