"""One arm's settings, checked against the config schema's arm definition with its defaults filled.

The schema (`schemas/config.schema.yaml`, `$defs/arm`) is the one place an arm's defaults are
written: Snakemake fills them into config.yaml, and `arm_settings` fills them into an arm given
in code or on a command line, so `QemuConfig`, the guest image and the CLIs read the same numbers.

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
def _arm_validator():
    schema = load_schema(CONFIG_SCHEMA)
    arm = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/arm"}
    return filling_defaults(jsonschema.validators.validator_for(arm))(arm)


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


#: Every setting of a qemu arm that config.yaml leaves out.
QEMU_DEFAULTS = arm_settings({"backend": "qemu"})
