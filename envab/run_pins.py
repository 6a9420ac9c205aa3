"""What one (arm, seed) run is pinned to: results/<exp>/<arm>/seed<k>/pins.json, typed.

    pins = RunPins.load("results/<exp>/drums/seed1/pins.json")    # refused with the field named
    pins.arm, pins.seed, pins.training["grpo"], pins.comparable_sha256

Written once by the freeze (`python -m envab.freeze pins`, `RunPins.make`), before the run trains;
read by the trainer (checked against the receipts: trainer/guards.py), the held-out evaluation,
the confirmation, the stop-at-target judge and the analysis. `comparable_sha256` covers everything
but the arm, the seed and the arm's config, so the analysis refuses to compare runs that differ
in anything else. The file's bytes are unchanged from before it was typed: the same keys, sorted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from envab.hashing import sha256_json
from envab.io import atomic_write_json
from envab.schema import ConfigError


@dataclass(frozen=True)
class RunPins:
    experiment_id: str
    """The registration the run belongs to; a run of another experiment is refused."""
    arm: str
    """The run's arm (`<arm>-<name>` for a control's runs)."""
    seed: int
    """The run's training seed."""
    arm_config: dict[str, Any]
    """The arm's settings as config.yaml has them, the schema's defaults filled (a token file's
    path, never a token)."""
    training: dict[str, Any]
    """The training settings every arm shares: `grpo`, `sft`, `compute`, `tools`, `cpus` (the
    config's `training`, as the rule hands it to the freeze)."""
    receipts: dict[str, str]
    """The freeze receipts the run builds on, by file name, with their sha256."""
    software: dict[str, str | None]
    """The versions of the libraries that decide the numbers (envab/software.py), None where one
    is not installed."""
    comparable_sha256: str
    """sha256 of experiment_id, receipts, training and software: equal for runs that may be
    compared."""

    @classmethod
    def make(
        cls,
        experiment_id: str,
        receipts: dict[str, str],
        training: dict,
        software: dict,
        arm: str,
        seed: int,
        arm_config: dict,
    ) -> RunPins:
        shared = {
            "experiment_id": experiment_id,
            "receipts": receipts,
            "training": training,
            "software": software,
        }
        return cls(**shared, arm=arm, seed=seed, arm_config=arm_config,
                   comparable_sha256=sha256_json(shared))  # fmt: skip

    @classmethod
    def load(cls, path: str | Path) -> RunPins:
        """The pins in `path`; ConfigError naming the file and the field when one is missing,
        unknown or of the wrong type."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: not a run's pins ({e})") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: Any, where: str = "pins") -> RunPins:
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: a run's pins are an object, not {type(raw).__name__}")
        names = {f.name for f in fields(cls)}
        if missing := sorted(names - raw.keys()):
            raise ConfigError(f"{where}: missing {', '.join(missing)}")
        if unknown := sorted(raw.keys() - names):
            raise ConfigError(f"{where}: unknown {', '.join(unknown)}")
        kinds = {"experiment_id": str, "arm": str, "seed": int, "arm_config": dict,
                 "training": dict, "receipts": dict, "software": dict,
                 "comparable_sha256": str}  # fmt: skip
        words = {str: "a string", int: "an integer", dict: "an object"}
        for name, kind in kinds.items():
            value = raw[name]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ConfigError(f"{where}: {name} must be {words[kind]}, not {value!r}")
        return cls(**raw)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: str | Path) -> None:
        atomic_write_json(path, self.as_dict())
