"""One arm's settings, checked against the config schema's arm definition with its defaults filled.

The schema (`schemas/config.schema.yaml`, `$defs/arm`) is the one place an arm's defaults are
written: Snakemake fills them into config.yaml, and `arm_settings` fills them into an arm given
in code or on a command line, so `QemuConfig`, the guest image and the CLIs read the same numbers.
What one enum per key cannot say, how an embedded host's settings go together, is
`check_embedded_host`: the arm (`open_arm`) and the host (`HostConfig`) both call it.

This module is a leaf (the QEMU arm imports it for its defaults); opening an arm is
`envab.envs.arms`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from functools import cache

import jsonschema

from envab.errors import Refusal
from envab.schema import CONFIG_SCHEMA, filling_defaults, load_schema


class ArmError(Refusal, ValueError):
    """An arm config that cannot be opened; the message is one line naming the key."""


@cache
def _schema() -> dict:
    return load_schema(CONFIG_SCHEMA)


@cache
def _arm_validator():
    schema = _schema()
    arm = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/arm"}
    return filling_defaults(jsonschema.validators.validator_for(arm))(arm)


def _embedded_host_choices(key: str) -> tuple[str, ...]:
    return tuple(_schema()["$defs"]["drums_arm"]["properties"][key]["enum"])


#: An embedded host's modes, sandboxes and worlds, as a drums arm names them (the host's CLI and
#: HostConfig take the same).
MODES = _embedded_host_choices("mode")
SANDBOXES = _embedded_host_choices("sandbox")
WORLDS = _embedded_host_choices("world")


def arm_settings(arm_config: Mapping) -> dict:
    """A copy of `arm_config` with every default of its backend filled in (a qemu arm gets all of
    QemuConfig's settings, a drums arm none of them); raises ArmError on the first problem."""
    arm = copy.deepcopy(dict(arm_config)) if isinstance(arm_config, Mapping) else arm_config
    error = jsonschema.exceptions.best_match(_arm_validator().iter_errors(arm))
    if error is not None:
        where = "".join(f".{p}" for p in error.absolute_path)
        message = error.message.replace("Additional properties are not allowed", "unknown key")
        raise ArmError(f"arm{where}: {message}")
    return arm


def check_embedded_host(mode: str | None, sandbox: str, world: str, rootfs_given: bool) -> None:
    """What an embedded host's settings must be together, which a schema's one enum per key
    cannot say; raises ArmError naming the conflict. `open_arm` checks an arm's settings with it
    and `HostConfig` a host's, so an arm is refused before its host would be."""
    if world == "xdesktop" and sandbox == "process":
        raise ArmError("world xdesktop runs in gVisor sandboxes or QEMU VMs, not processes")
    if world == "xdesktop" and sandbox == "qemu" and rootfs_given:
        raise ArmError("rootfs is a gVisor sandbox's root; sandbox qemu boots the disk it "
                       "makes from build/xdesktop")  # fmt: skip
    if world == "xdesktop" and sandbox == "namespaces":
        raise ArmError("world xdesktop runs in gVisor sandboxes or QEMU VMs: a namespace "
                       "sandbox's filter refuses the programs it starts")  # fmt: skip
    if sandbox == "runc" and (world != "pillow" or mode != "restore"):
        raise ArmError("sandbox runc runs the Pillow desktop in restore mode (world: pillow, "
                       "mode: restore): a container cannot fork here")  # fmt: skip
    if sandbox == "qemu" and (world != "xdesktop" or mode != "restore"):
        raise ArmError("sandbox qemu runs the X desktop in restore mode (world: xdesktop, "
                       "mode: restore): a VM cannot fork")  # fmt: skip


#: Every setting of a qemu arm that config.yaml leaves out.
QEMU_DEFAULTS = arm_settings({"backend": "qemu"})
