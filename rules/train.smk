# Training: the SFT warm start once (shared by every arm and seed), then GRPO per (arm, seed).
# `train` is a checkpoint: the evaluation discovers the saved model checkpoints of each run
# (results/<exp>/<arm>/seed<k>/checkpoints/<name>/) only after it has run.

SFT_ENABLED = config["training"]["sft"]["enabled"]
SFT_MODEL = f"{RESULTS}/sft/model"


def training_model():
    """The model GRPO starts from: the warm start's output, or the pinned model as it is."""
    return SFT_MODEL if SFT_ENABLED else f"{RESULTS}/model"


if SFT_ENABLED:

    rule sft:
        input:
            target=config["preregistration"],
            receipts=expand(f"{RECEIPTS}/{{name}}", name=FREEZE_RECEIPTS),
            model=f"{RESULTS}/model",
            train=f"{RESULTS}/tasks/train.jsonl",
            solutions=f"{RESULTS}/tasks/solutions.jsonl",  # oracle actions: factory task sets only
        output:
            model=directory(SFT_MODEL),
            receipt=f"{RECEIPTS}/sft.json",
        params:
            settings=as_arg(config["training"]["sft"]),
            tools=config["training"]["tools"],
        threads: whole_machine()
        log:
            f"{LOGS}/sft.log",
        shell:
            "{PYTHON} -m trainer.sft --target {input.target} --model {input.model}"
            " --tasks {input.train} --solutions {input.solutions} --settings {params.settings}"
            " --tools {params.tools}"
            " --out {output.model} > {log} 2>&1"


checkpoint train:
    input:
        target=config["preregistration"],
        pins=f"{RESULTS}/{{arm}}/seed{{seed}}/pins.json",
        guest=lambda w: [f"{RESULTS}/{w.arm}/guest.json"] if w.arm in QEMU_ARMS else [],
        model=training_model(),
        receipts=expand(f"{RECEIPTS}/{{name}}", name=FREEZE_RECEIPTS)
        + ([f"{RECEIPTS}/sft.json"] if SFT_ENABLED else []),
    output:
        run=f"{RESULTS}/{{arm}}/seed{{seed}}/run.json",
        trajectories=f"{RESULTS}/{{arm}}/seed{{seed}}/trajectories.jsonl",
        records=f"{RESULTS}/{{arm}}/seed{{seed}}/checkpoints.jsonl",
        checkpoints=directory(f"{RESULTS}/{{arm}}/seed{{seed}}/checkpoints"),
    params:
        out=lambda w: f"{RESULTS}/{w.arm}/seed{w.seed}",
    wildcard_constraints:
        arm="[A-Za-z0-9_-]+",
        seed=r"\d+",
    # The whole machine for one run at a time: a second run beside it would slow it down and
    # distort the wall-clock that time-to-target is measured by.
    threads: whole_machine()
    log:
        main=f"{LOGS}/train_{{arm}}_seed{{seed}}.log",
        host=f"{LOGS}/train_{{arm}}_seed{{seed}}.host.log",
    shell:
        # The log shows a progress bar of valid trajectories against the frozen budget.
        "{PYTHON} -m trainer.grpo --target {input.target} --pins {input.pins}"
        " --model {input.model} --out {params.out} --host-log {log.host} > {log.main} 2>&1"


def train_outputs():
    """What `all` gains: one run record per selected (arm, seed)."""
    return [f"{RESULTS}/{arm}/seed{seed}/run.json" for arm, seed in RUNS]
