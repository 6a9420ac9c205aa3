"""What the tests that drive TRL's GRPOTrainer directly with the tiny model share: the shipped
config's GRPO arguments with a few settings changed, a dataset of empty first turns (the
environment's `reset` fills them), and a recorder of the generation batches a step trains on."""

from __future__ import annotations

from pathlib import Path

import yaml

from envab.schema import CONFIG_SCHEMA, check_schema
from envab.trainer.compute import compute_settings
from envab.trainer.grpo import GrpoSettings, grpo_config

REPO = Path(__file__).resolve().parent.parent


def grpo_args(trl_dir: Path, tokenizer, **grpo):
    """TRL's GRPOConfig as a run of the shipped config.yaml builds it, with `grpo` changed."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    check_schema(config, CONFIG_SCHEMA, "config.yaml", fill_defaults=True)
    training = config["training"]
    training["grpo"].update(grpo)
    return grpo_config(
        GrpoSettings(**training["grpo"]), 0, trl_dir, compute_settings(training), tokenizer
    )


def empty_prompts(n: int):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": []}]}] * n)


def record_batches(trainer) -> list[dict]:
    """The list every generation batch the trainer scores is appended to, as it trains."""
    batches = []
    scored = trainer._generate_and_score_completions

    def recording(inputs):
        batches.append(scored(inputs))
        return batches[-1]

    trainer._generate_and_score_completions = recording
    return batches
