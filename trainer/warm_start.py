"""The warm start's training proper: TRL's SFTTrainer on the demonstrations trainer/sft.py played,
loss on the assistant turns only, a console line per tenth of the steps. Apart from the job so
that the job checks its inputs before torch, transformers and TRL are loaded."""

from __future__ import annotations

from datasets import Dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer
from trl.chat_template_utils import get_training_chat_template
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

from envab.progress import Console, duration, eta
from envab.trainer import agent
from envab.trainer.compute import lora_config


def demonstration_collator(processor, demos: dict, tools: agent.ToolSet):
    """TRL's vision collator, fed each row's whole conversation by task id.

    The conversations cannot live in the Arrow dataset: Arrow unifies content blocks into one
    struct, so a text block gains `image: null`, which the chat template counts as an image; and
    TRL's collator fills a row's `images` into user turns only, never into tool results. So the
    dataset holds task ids, and the screenshots stay inside their messages (`images` empty).
    """

    class DemonstrationCollator(DataCollatorForVisionLanguageModeling):
        def torch_call(self, examples):
            rows = [{"messages": demos[e["task_id"]], "images": []} for e in examples]
            return super().torch_call(rows)

    # Loss on the assistant turns only (the tool calls), through TRL's training template, which
    # marks them with {% generation %}.
    return DemonstrationCollator(
        processor=WithTools(processor, tools),
        assistant_only_loss=True,
        chat_template=get_training_chat_template(processor),
    )


class StepProgress(TrainerCallback):
    """A transformers Trainer's progress on the console: a line at each logging step (set
    `logging_steps` to a tenth of max_steps) with the training loss and an ETA. For the warm start,
    whose length is a step count."""

    def __init__(self, console: Console):
        self.console = console

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            step, elapsed = state.global_step, self.console.elapsed()
            self.console.say(
                f"step {step}/{state.max_steps}, loss {logs['loss']:.4f}, {duration(elapsed)}, "
                f"ETA {eta(step, state.max_steps, elapsed)}"
            )


class WithTools:
    """The processor, rendering every conversation with the agent's tools. TRL's vision collator
    passes no `tools`, so without this the warm start would learn from a prompt without the tool
    descriptions, shorter than the one GRPO and the held-out evaluation render."""

    def __init__(self, processor, tools: agent.ToolSet):
        self._processor = processor
        self._tools = list(tools.tools)

    def __getattr__(self, name):
        return getattr(self._processor, name)

    def apply_chat_template(self, conversation, **kwargs):
        return self._processor.apply_chat_template(conversation, tools=self._tools, **kwargs)


def sft_config(settings: dict, compute, seed: int, scratch) -> SFTConfig:
    """TRL's settings for `training.sft` (steps, batch size, learning rate and its schedule)."""
    return SFTConfig(
        output_dir=str(scratch / "trainer"),
        seed=seed,
        max_steps=settings["steps"],
        per_device_train_batch_size=settings["batch_size"],
        learning_rate=settings["learning_rate"],
        lr_scheduler_type=settings.get("schedule", "constant"),  # constant: the schema's default
        dataset_kwargs={"skip_prepare_dataset": True},  # rows are task ids, see the collator
        use_cpu=compute.cpu,
        bf16=compute.dtype == "bfloat16" and not compute.cpu,
        gradient_checkpointing=compute.gradient_checkpointing,
        save_strategy="no",
        logging_steps=max(1, settings["steps"] // 10),  # a console line each tenth
        report_to="none",
        remove_unused_columns=False,
        # Rendering a batch's conversations through the chat template is a fifth of a CPU step:
        # one worker process renders the next batches while the model trains on this one. The
        # rows' order is drawn here, in the trainer, so the weights are those of rendering here;
        # the saved tokenizer.json no longer carries the padding the collator's last call set.
        dataloader_num_workers=1,
        dataloader_persistent_workers=True,
    )


def fit(
    model, processor, demos: dict, tools, settings: dict, compute, args, console, scratch, out
) -> float:
    """Train on every demonstration for `settings["steps"]` steps; save model and processor into
    `out`; the mean training loss. The caller seeded the RNGs before it loaded the model. On
    `compute` (trainer/compute.py): its device, dtype and checkpointing; with LoRA the adapters
    are trained and then merged, so the warm start is a whole model folder as without."""
    dataset = Dataset.from_list([{"task_id": task_id} for task_id in sorted(demos)])
    config = sft_config(settings, compute, args.seed, scratch)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=processor,
        data_collator=demonstration_collator(processor, demos, tools),
        callbacks=[StepProgress(console)],
        peft_config=lora_config(compute),
    )
    result = trainer.train()
    trained = trainer.model
    if compute.lora is not None:
        trained = trained.merge_and_unload()
    trained.save_pretrained(out)
    processor.save_pretrained(out)
    return result.training_loss
