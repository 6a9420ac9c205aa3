"""What the tests that drive TRL's GRPOTrainer directly with the tiny model share: the shipped
config's GRPO arguments with a few settings changed, a dataset of empty first turns (the
environment's `reset` fills them), and a recorder of the generation batches a step trains on."""

from __future__ import annotations

from pathlib import Path

import yaml

from envab.schema import CONFIG_SCHEMA, check_schema
from envab.trainer.build import grpo_config
from envab.trainer.compute import compute_settings
from envab.trainer.run_inputs import GrpoSettings

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


def call_ids(processing_class, name: str, arguments: dict) -> list[int]:
    """The token ids of one assistant turn calling `name`, through its end of turn: what a
    scripted policy hands TRL's loop as its completion."""
    from envab.trainer import agent
    from envab.trainer.preflight import _unbatched

    end = processing_class.tokenizer.convert_tokens_to_ids("<|im_end|>")
    user = [{"role": "user", "content": [{"type": "text", "text": "-"}]}]
    render = processing_class.apply_chat_template
    prompt = _unbatched(render(user, add_generation_prompt=True, tokenize=True))
    full = _unbatched(render([*user, agent.assistant_call(name, arguments)], tokenize=True))
    ids = list(full[len(prompt) :])
    return ids[: ids.index(end) + 1]


def arm_run(tasks: dict, backend, out: Path, group: int, max_turns: int, arm: str = "drums"):
    """trainer/environment.py's Run over `backend`, its records under `out`, as a run of the
    shipped config builds it (no held-out ids, the click tools)."""
    from envab.trainer import agent
    from envab.trainer.accounting import Ledger, Prices
    from envab.trainer.environment import GenerationClock, Run
    from envab.trainer.forkgroups import ForkGroups
    from envab.trainer.guards import HeldoutGuard

    ledger = Ledger(
        str(out / "trajectories.jsonl"),
        str(out / "checkpoints.jsonl"),
        arm=arm,
        seed=1,
        checkpoint_interval=100,
        prices=Prices(0.1, 0.2),
    )
    return Run(
        tasks,
        None,
        HeldoutGuard(frozenset()),
        ledger,
        ForkGroups(backend, group),
        tools=agent.tool_set("click"),
        max_turns=max_turns,
        clock=GenerationClock(),
    )
