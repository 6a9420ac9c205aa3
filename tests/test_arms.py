"""Opening an arm: one way for every stage, the arm checked and its defaults filled from the
config schema, a wrong arm refused with one line before anything starts."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate as snakemake_validate

from envab.envs.arm_schema import MODES, QEMU_DEFAULTS, SANDBOXES, WORLDS
from envab.envs.arms import ArmError, arm_settings, open_arm
from envab.envs.drums import DrumsBackend
from envab.envs.host.pool import HostConfig
from envab.envs.protocol import ActionRejected
from envab.envs.qemu.image import ImageConfig
from envab.envs.qemu.pool import QemuConfig
from envab.envs.tasks.build import build
from envab.schema import CONFIG_SCHEMA, check_schema

REPO = Path(__file__).resolve().parent.parent
# Every qemu default, as QemuConfig had them written before the schema held them.
QEMU_SETTINGS = {
    "vms": 1,
    "max_vms": None,
    "memory_mib": 256,
    "accel": "auto",
    "cache": "build/qemu",
    "step_timeout_s": 10.0,
    "create_timeout_s": 30.0,
    "screen_wait_s": 2.0,
    "vm_wait_s": 60.0,
}


def test_a_drums_embedded_arm_opens_creates_and_verifies():
    tasks, solutions = build(seed=3, per_family=1)
    task = next(t for t in tasks if t["family"] == "click_button")
    oracle = next(s for s in solutions if s["id"] == task["id"])["oracle"]
    with open_arm({"backend": "drums", "url": "embedded", "mode": "fork"}) as backend:
        assert isinstance(backend, DrumsBackend) and backend.can_fork
        with backend.create(task) as session:
            assert session.observation.valid
            with pytest.raises(ActionRejected, match="outside"):
                session.step({"action_type": "CLICK", "parameters": {"x": 999, "y": 1}})
            for action in oracle:
                session.step(action)
            v = session.verify()
    assert (v.valid, v.score, v.verdict) == (True, 1.0, "valid")
    assert (v["valid"], v["score"], v["verdict"]) == (True, 1.0, "valid")  # how validate reads it


@pytest.mark.parametrize(
    ("arm", "faults", "message"),
    [
        ({"backend": "drums"}, False, "arm: 'url' is a required property"),
        ({"backend": "drums", "url": "embedded"}, False, "arm: 'mode' is a required property"),
        (
            {"backend": "drums", "url": "embedded", "mode": "forkk"},
            False,
            "arm.mode: 'forkk' is not one of ['fork', 'restore']",
        ),
        (
            {"backend": "drums", "url": "embedded", "mode": "fork", "vms": 2},
            False,
            "arm: unknown key ('vms' was unexpected)",
        ),
        ({"backend": "qemu", "vms": 0}, False, "arm.vms: 0 is less than the minimum of 1"),
        ({"backend": "qemu", "url": "embedded"}, False, "arm: unknown key ('url' was unexpected)"),
        ({"backend": "kvm"}, False, "arm.backend: 'kvm' is not one of ['drums', 'qemu']"),
        ({"vms": 2}, False, "arm: 'backend' is a required property"),
        (
            {"backend": "drums", "url": "http://127.0.0.1:9"},
            True,
            "fault injection needs the embedded host (url: embedded)",
        ),
        (
            {
                "backend": "drums",
                "url": "embedded",
                "mode": "fork",
                "sandbox": "qemu",
                "world": "xdesktop",
            },
            False,
            "sandbox qemu runs the X desktop in restore mode (world: xdesktop, mode: restore): "
            "a VM cannot fork",
        ),
        (
            {"backend": "drums", "url": "embedded", "mode": "restore", "sandbox": "qemu"},
            False,
            "sandbox qemu runs the X desktop in restore mode (world: xdesktop, mode: restore): "
            "a VM cannot fork",
        ),
        (
            {
                "backend": "drums",
                "url": "embedded",
                "mode": "restore",
                "sandbox": "qemu",
                "world": "xdesktop",
                "rootfs": "/somewhere",
            },
            False,
            "rootfs is a gVisor sandbox's root; sandbox qemu boots the disk it makes from "
            "build/xdesktop",
        ),
    ],
)
def test_a_wrong_arm_is_refused_with_one_line_before_anything_starts(arm, faults, message):
    given = copy.deepcopy(arm)
    with pytest.raises(ArmError) as refused, open_arm(arm, allow_faults=faults):
        pass
    assert str(refused.value) == message
    assert isinstance(refused.value, ValueError)
    assert arm == given  # the caller's arm is never changed


@pytest.mark.parametrize(
    "host",
    [
        {"mode": "restore", "sandbox": "process", "world": "xdesktop"},
        {"mode": "fork", "sandbox": "namespaces", "world": "xdesktop"},
        {"mode": "fork", "sandbox": "runc", "world": "pillow"},
        {"mode": "fork", "sandbox": "qemu", "world": "xdesktop"},
        {"mode": "restore", "sandbox": "qemu", "world": "pillow"},
        {"mode": "restore", "sandbox": "qemu", "world": "xdesktop", "rootfs": "/somewhere"},
    ],
)
def test_an_embedded_host_refuses_what_its_arm_refuses_with_the_same_line(host):
    """The rules an embedded host's settings obey together are written once
    (envs/arm_schema.py), so an arm and the host it would start refuse alike."""
    arm = {"backend": "drums", "url": "embedded", **host}
    with pytest.raises(ArmError) as by_arm, open_arm(arm):
        pass
    with pytest.raises(ArmError) as by_host:
        HostConfig(**host)
    assert str(by_host.value) == str(by_arm.value)
    # The host and the arm offer the schema's choices.
    assert (MODES, SANDBOXES, WORLDS) == (
        ("fork", "restore"),
        ("gvisor", "process", "namespaces", "runc", "qemu"),
        ("pillow", "xdesktop"),
    )


def test_qemu_arms_get_every_default_from_the_schema_and_drums_arms_none():
    assert arm_settings({"backend": "qemu", "vms": 8}) == {
        "backend": "qemu",
        **QEMU_SETTINGS,
        "vms": 8,
    }
    drums = {"backend": "drums", "url": "embedded", "mode": "fork"}
    assert arm_settings(drums) == drums
    # The numbers are written once: QemuConfig, ImageConfig and QEMU_DEFAULTS read the schema's.
    assert QEMU_DEFAULTS == {"backend": "qemu", **QEMU_SETTINGS}
    assert dataclasses.asdict(QemuConfig()) == {
        **QEMU_SETTINGS,
        "cache": Path("build/qemu"),
        "build": True,
        "run_dir": None,
    }
    assert (ImageConfig().cache, ImageConfig().memory_mib, ImageConfig().accel) == (
        Path("build/qemu"),
        256,
        "auto",
    )
    # config.yaml's qemu arm builds the same QemuConfig as before the schema held the defaults.
    shipped = {"backend": "qemu", "vms": 8, "max_vms": 16, "memory_mib": 256, "accel": "auto"}
    assert QemuConfig.from_arm(shipped) == QemuConfig(
        vms=8,
        max_vms=16,
        memory_mib=256,
        accel="auto",
        cache=Path("build/qemu"),
        step_timeout_s=10.0,
        create_timeout_s=30.0,
        screen_wait_s=2.0,
        vm_wait_s=60.0,
    )
    with pytest.raises(ArmError, match=r"^arm: unknown key \('build' was unexpected\)$"):
        QemuConfig.from_arm({"backend": "qemu", "build": False})


def test_the_config_schema_fills_the_qemu_branch_only():
    """What rules/common.smk runs (envab/config.py load_config): the default filling reaches
    into the if/then branch of a qemu arm (rules/guest.smk reads cache, memory_mib and accel
    from it) and not into a drums arm, which must stay exactly as written (its pins and
    evaluation bytes); and it fills exactly what Snakemake's own `validate` would."""
    with open(REPO / "config.yaml") as f:
        config = yaml.safe_load(f)
    config["arms"]["bare_qemu"] = {"backend": "qemu"}
    written = copy.deepcopy(config)
    check_schema(config, CONFIG_SCHEMA, "config", fill_defaults=True)
    assert config["arms"]["drums"] == written["arms"]["drums"]
    assert config["arms"]["bare_qemu"] == QEMU_DEFAULTS
    assert config["arms"]["qemu"] == {**QEMU_DEFAULTS, **written["arms"]["qemu"]}
    snakemake_validate(written, str(CONFIG_SCHEMA))
    assert written == config
