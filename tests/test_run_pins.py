"""A run's pins typed (envab/run_pins.py): written as the freeze always wrote them, read back
whole, and a file with a field missing, unknown or of the wrong type refused, the field named."""

from __future__ import annotations

import json

import pytest

from envab.hashing import sha256_json
from envab.run_pins import RunPins
from envab.schema import ConfigError

SHARED = {
    "experiment_id": "exp-v1",
    "receipts": {"split.json": "a" * 64},
    "training": {"grpo": {"beta": 0.04}, "tools": "click"},
    "software": {"torch": "2.14.1", "vllm": None},
}


def test_pins_are_written_as_before_and_read_back_whole(tmp_path):
    pins = RunPins.make(**SHARED, arm="drums", seed=3, arm_config={"backend": "drums"})
    pins.write(tmp_path / "pins.json")
    # the record the freeze wrote before the pins were typed: the same keys, sorted, same digest
    before = {**SHARED, "arm": "drums", "seed": 3, "arm_config": {"backend": "drums"},
              "comparable_sha256": sha256_json(SHARED)}  # fmt: skip
    assert (tmp_path / "pins.json").read_text() == json.dumps(
        before, indent=2, sort_keys=True
    ) + "\n"
    assert RunPins.load(tmp_path / "pins.json") == pins
    # the arm and the seed are not in the comparable digest: runs of two arms compare
    other = RunPins.make(**SHARED, arm="qemu", seed=4, arm_config={"backend": "qemu"})
    assert other.comparable_sha256 == pins.comparable_sha256


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"seed": "3"}, "seed must be an integer"),
        ({"seed": True}, "seed must be an integer"),
        ({"training": None}, "training must be an object"),
        ({"extra": 1}, "unknown extra"),
        ({"arm": None}, "arm must be a string"),
    ],
)
def test_a_malformed_pins_file_is_refused_with_the_field_named(tmp_path, change, named):
    record = RunPins.make(**SHARED, arm="drums", seed=3, arm_config={}).as_dict()
    (tmp_path / "pins.json").write_text(json.dumps({**record, **change}))
    with pytest.raises(ConfigError, match=named):
        RunPins.load(tmp_path / "pins.json")
    del record["software"]
    (tmp_path / "pins.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="missing software"):
        RunPins.load(tmp_path / "pins.json")
