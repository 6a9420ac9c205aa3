"""The trainer a run trains with, built in layers (step 3 of trainer/grpo.py): the seeded dataset
and the checked starting model (`prepare`); then TRL's GRPOTrainer (`grpo_config`), resumable
(trainer/resume.py), over the arm's fork groups (trainer/forkgroups.py) through the environment
(trainer/environment.py), with the Accounting callback (trainer/callback.py) and, where the run
stops at target, its judge (trainer/stop_judge.py).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset
from transformers import set_seed
from trl import GRPOConfig

from envab import preregistration
from envab.layout import judged_beside
from envab.progress import Console
from envab.trainer import agent
from envab.trainer.accounting import Ledger
from envab.trainer.callback import Accounting
from envab.trainer.compute import Compute, grpo_kwargs, lora_config
from envab.trainer.environment import GenerationClock, Run, environment_factory
from envab.trainer.forkgroups import ForkGroups
from envab.trainer.generation import Generation
from envab.trainer.model import load_checked
from envab.trainer.ranks import Ranks
from envab.trainer.resume import Journal, Restart, ResumableGRPOTrainer
from envab.trainer.run_inputs import GrpoSettings, Outputs, RunInputs
from envab.trainer.stop_judge import StopJudge
from envab.trainer.toolcalls import ToolCalls


@dataclass(frozen=True)
class Prepared:
    """The seeded dataset and the checked starting model."""

    dataset: Dataset
    # task id -> digest of the in-process first screen, on an arm with deterministic_screens
    first_screens: dict[str, str] | None
    model: object
    processor: object


def prepare(inputs: RunInputs, model_dir: str) -> Prepared:
    """Seed, then build the dataset (one row per training task; the first screenshot comes from
    the arm at reset) and load the model checked against its receipt; in this order, which fixes
    the draws."""
    set_seed(inputs.seed)
    dataset = Dataset.from_list(agent.training_rows(inputs.tasks))
    first_screens = None
    if inputs.pins.arm_config.get("deterministic_screens"):
        first_screens = agent.rendered_first_screens(inputs.tasks, inputs.settings.prefix)
    model, processor = load_checked(model_dir, inputs.receipts, inputs.compute)
    return Prepared(dataset, first_screens, model, processor)


def build_trainer(
    inputs: RunInputs,
    prepared: Prepared,
    ledger: Ledger,
    groups: ForkGroups,
    outputs: Outputs,
    journal: Journal,
    restart: Restart | None,
    args,
    console: Console,
    tracker,
    ranks: Ranks,
) -> tuple[ResumableGRPOTrainer, Accounting]:
    """TRL's GRPOTrainer on the arm's fork groups, and its Accounting callback."""
    settings = inputs.settings
    run = Run(
        tasks=inputs.tasks,
        first_screens=prepared.first_screens,
        guard=inputs.guard,
        ledger=ledger,
        groups=groups,
        tools=inputs.tools,
        max_turns=settings.max_turns,
        clock=GenerationClock(),
    )
    callback = Accounting(
        run,
        inputs.prereg.budget_for(inputs.arm),
        outputs,
        journal,
        restart,
        preregistration.frozen_utc(inputs.receipts[preregistration.RECEIPT]),
        prepared.processor,
        console,
        tracker,
        ranks,
        stop_judge(inputs, args, outputs) if ranks.main else None,
    )
    trainer = ResumableGRPOTrainer(
        model=prepared.model,
        processing_class=prepared.processor,
        args=grpo_config(
            settings, inputs.seed, journal.trl, inputs.compute, prepared.processor.tokenizer
        ),
        train_dataset=prepared.dataset,
        environment_factory=environment_factory(run),
        callbacks=[callback],
        peft_config=lora_config(inputs.compute),
        steps_path=journal.records["steps"],
        ranks=ranks,
        step_times=run.times,
        # Timed from the trainer's thread: a batch is one environment span and one call of the
        # generation clock, however many calls ran in it.
        tool_calls=ToolCalls(settings.parallel_steps, run.times, run.clock.env_call),
    )
    return trainer, callback


def judged_folder(args, inputs: RunInputs) -> Path:
    """Where a run's judge processes keep their records: `<store>/../judged/<arm>/seed<k>`."""
    folder = judged_beside(args.stop_at_target["store"], inputs.arm, inputs.seed)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def stop_judge(inputs: RunInputs, args, outputs: Outputs) -> StopJudge | None:
    """The stop-at-target judge of a run whose budget stops at target (the A/B's runs where the
    pre-registration says so; never a control's), or None."""
    if not inputs.prereg.budget_for(inputs.arm).stop_at_target:
        return None
    return StopJudge(
        frozen=["--target", args.target, "--receipts", *args.receipts, "--pins", args.pins],
        checkpoint_records=outputs.checkpoint_records,
        checkpoints=outputs.checkpoints,
        settings=args.stop_at_target,
        # this process's judgments: a restarted run judges its checkpoints again (the store
        # makes that cheap) rather than trust a verdict on a checkpoint it rolled back. Beside
        # the evaluation store, never in the run's folder: the held-out records the judge
        # writes are no file of training's (it opens only the verdicts).
        judged=Path(tempfile.mkdtemp(prefix="judge-", dir=judged_folder(args, inputs))),
        cores=args.cores,
        # three times the run's own wall-clock budget: a judge past that is hung
        timeout_s=3 * inputs.prereg.budget_for(inputs.arm).max_wall_clock_s,
    )


def grpo_config(
    settings: GrpoSettings, seed: int, trl_dir: Path, compute: Compute, tokenizer
) -> GRPOConfig:
    """TRL's settings; those that must not differ between arms come from the pins."""
    generation = Generation(settings.temperature, settings.max_completion_length, settings.turn_end)
    return GRPOConfig(
        # TRL's own checkpoints (optimizer, scheduler, RNG, trainer state) go to the journal, one
        # with each of ours, which the Accounting callback asks for (save_strategy stays "no").
        # Two are kept, so the one the last resume point names survives the next one's rotation.
        output_dir=str(trl_dir),
        save_total_limit=2,
        seed=seed,
        data_seed=seed,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",  # max_steps below is only a ceiling; the budget stops us
        max_steps=10**9,
        num_generations=settings.num_generations,
        # The device, dtype, micro-batches and generation path (trainer/compute.py); a step's
        # generation batch is always whole (num_generations x prompts_per_step completions).
        **grpo_kwargs(compute, settings.batch_size),
        max_completion_length=settings.max_completion_length,
        max_tool_calling_iterations=settings.max_turns,
        temperature=settings.temperature,
        beta=settings.beta,
        # How a turn ends, as evaluation ends it (trainer/generation.py).
        generation_kwargs=generation.trl_kwargs(tokenizer, vllm=compute.vllm is not None),
        # Every completion keeps its gradient, a truncated one included: masking truncation made
        # running to the length limit a shelter from negative advantages
        # (docs/results/2026-11-29-embedded-default-v5-learns.md).
        mask_truncated_completions=False,
        save_strategy="no",
        save_only_model=False,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,  # our bar counts valid trajectories against the budget instead
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
