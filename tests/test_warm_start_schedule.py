"""The warm start's learning-rate schedule: `training.sft.schedule` reaches TRL's SFTConfig.

A constant rate ends the warm start wherever a loss spike falls; a decayed one ends on a settled
model (docs/results/2026-12-03-recipe-transfer.md). The key is part of the pinned settings, so
an unknown schedule is refused at the edge, and an absent one keeps the constant rate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from transformers import get_scheduler

from envab.schema import CONFIG_SCHEMA, ConfigError, check_schema
from envab.trainer.compute import Compute
from envab.trainer.warm_start import sft_config

REPO = Path(__file__).resolve().parent.parent


def embedded_config() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_schedule_defaults_to_constant_and_refuses_unknown_names():
    config = embedded_config()
    config["training"]["sft"].pop("schedule", None)
    check_schema(config, CONFIG_SCHEMA, "config.yaml", fill_defaults=True)
    assert config["training"]["sft"]["schedule"] == "constant"

    config["training"]["sft"]["schedule"] = "exponential"
    with pytest.raises(ConfigError, match="training.sft.schedule: 'exponential' is not one of"):
        check_schema(config, CONFIG_SCHEMA, "config.yaml")


@pytest.mark.parametrize("schedule, last_rate", [("constant", 3e-3), ("linear", 0.0)])
def test_schedule_reaches_the_trainer(tmp_path, schedule, last_rate):
    settings = {"steps": 10, "batch_size": 4, "learning_rate": 3e-3, "schedule": schedule}
    config = sft_config(settings, Compute(), 0, tmp_path)
    assert config.lr_scheduler_type == schedule
    assert (config.max_steps, config.learning_rate) == (10, 3e-3)
    # The rate the trainer's own scheduler gives at the last step, from the same settings.
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate)
    scheduler = get_scheduler(
        config.lr_scheduler_type, optimizer, num_warmup_steps=0, num_training_steps=10
    )
    for _ in range(10):
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(last_rate)


def test_pins_without_the_key_keep_the_constant_rate(tmp_path):
    settings = {"steps": 10, "batch_size": 4, "learning_rate": 3e-3}
    assert sft_config(settings, Compute(), 0, tmp_path).lr_scheduler_type == "constant"
