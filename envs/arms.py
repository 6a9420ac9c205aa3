"""Open the backend an arm of config.yaml names: the one way every stage reaches an environment.

    with open_arm({"backend": "drums", "url": "embedded", "mode": "fork"}) as backend:
        session = backend.create(task)

The arm is checked against the config schema and its defaults are filled first (`arm_settings`),
so a partial arm works and a wrong one is refused with one line (ArmError) before anything starts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from envab.envs.arm_schema import ArmError, arm_settings, check_embedded_host
from envab.envs.controls import ControlBackend
from envab.envs.drums import EMBEDDED, DrumsError, connect
from envab.envs.host.gvisor import gvisor_problem
from envab.envs.host.namespaces import namespaces_problem
from envab.envs.host.runc import runc_problem
from envab.envs.protocol import Backend
from envab.envs.qemu.pool import QemuConfig, QemuPool

__all__ = ["ArmError", "arm_settings", "host_log_beside", "open_arm"]


@contextmanager
def open_arm(
    arm_config: Mapping,
    *,
    log_path: str | None = None,
    allow_faults: bool = False,
    files: str | Path | None = None,
) -> Iterator[Backend]:
    """The backend of `arm_config` for the block's length: a QEMU pool, a Drums host, or the
    embedded host started for the block (its output appended to `log_path`), wrapped by
    envs/controls.py where the arm is a control. `allow_faults` turns the fault switches
    (envs/faults.py) of the embedded host or the QEMU pool on (tests, reliability runs); no other
    host is asked to. `files`: the frozen task set's files.json (`files_beside`), from whose
    store an embedded X desktop host delivers the files the tasks download."""
    arm = arm_settings(arm_config)
    if "control" in arm:
        with open_arm(
            {k: v for k, v in arm.items() if k != "control"},
            log_path=log_path,
            allow_faults=allow_faults,
            files=files,
        ) as backend:
            yield ControlBackend(backend, arm["control"])
        return
    if arm["backend"] == "qemu":
        with QemuPool(QemuConfig.from_arm(arm), allow_faults=allow_faults) as pool:
            yield pool
        return
    if allow_faults and arm["url"] != EMBEDDED:
        raise ArmError("fault injection needs the embedded host (url: embedded)")
    for key in ("sandbox", "world", "rootfs", "image"):
        if key in arm and arm["url"] != EMBEDDED:
            raise ArmError(f"{key} is the embedded host's setting (url: embedded); a Drums host "
                           "chooses its own")  # fmt: skip
    sandbox, world = arm.get("sandbox", "gvisor"), arm.get("world", "pillow")
    check_embedded_host(arm.get("mode"), sandbox, world, rootfs_given="rootfs" in arm)
    image = arm.get("image", "base")  # the X desktop image (envs/xdesktop/apps.py)
    if "image" in arm and world != "xdesktop":
        raise ArmError("image names an X desktop image: it needs world: xdesktop")
    if "image" in arm and "rootfs" in arm:
        raise ArmError("image and rootfs both name the X desktop's root: give one")
    if arm["url"] == EMBEDDED and sandbox == "gvisor" and gvisor_problem():
        raise ArmError(f"arm sandbox gvisor: {gvisor_problem()} (or set sandbox: process)")
    if arm["url"] == EMBEDDED and sandbox == "namespaces" and namespaces_problem():
        raise ArmError(f"arm sandbox namespaces: {namespaces_problem()}")
    if arm["url"] == EMBEDDED and sandbox == "runc" and runc_problem():
        raise ArmError(f"arm sandbox runc: {runc_problem()}")
    host_args = []
    if world == "xdesktop":
        host_args = ["--world", "xdesktop"]
        if sandbox == "gvisor":
            host_args += ["--rootfs", _xdesktop_root(arm.get("rootfs"), image)]
        elif image != "base":
            host_args += ["--image", image]
        if files is not None:
            host_args += ["--files", str(files)]
    client = {}
    if sandbox == "qemu":
        # A guest under TCG starts an application in tens of seconds, not a sandbox's few.
        host_args += ["--create-timeout", "600", "--step-timeout", "60"]
        client = {"create_timeout_s": 660.0, "step_timeout_s": 90.0}
    try:  # no token, an unreachable host, a refused token: one line, before any work is done
        with connect(
            arm["url"],
            mode=arm.get("mode"),
            sandbox=sandbox,
            host_args=host_args,
            token_file=arm.get("token_file"),
            log_path=log_path,
            allow_faults=allow_faults,
            **client,
        ) as backend:
            backend.preflight()
            yield backend
    except DrumsError as e:
        raise ArmError(str(e)) from None


def host_log_beside(log: str | Path | None) -> str | None:
    """Where a job whose log is `log` keeps its embedded host's log: beside it, `<name>.host.log`
    (as the training rule names it). The host's reason for an `env_failure` (no room for a
    checkpoint, a sandbox that would not start) is only there; None where the job has no log."""
    return None if log is None else str(Path(log).with_suffix(".host.log"))


def files_beside(tasks: str | Path) -> Path | None:
    """The files.json the freeze wrote beside a task set's `tasks` file (train.jsonl,
    heldout.jsonl: `<results>/tasks/`), or None where its files were not frozen."""
    path = Path(tasks).parent / "files.json"
    return path if path.is_file() else None


def _xdesktop_root(rootfs: str | None, image: str = "base") -> str:
    """The X desktop's root: the arm's, or the project's build of `image` (made on first use,
    minutes; the full image's about 400 MB of packages)."""
    if rootfs is not None:
        return rootfs
    from envab.envs.xdesktop.image import ensure_desktop  # only an X desktop arm needs it

    return str(
        ensure_desktop(log=lambda m: print(f"[xdesktop] {m}", flush=True), image=image).rootfs
    )
