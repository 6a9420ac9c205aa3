# Training: the SFT warm start once (shared by every arm and seed), then GRPO per (arm, seed).
# `train` is a checkpoint: the evaluation discovers the saved model checkpoints of each run
# (results/<exp>/<arm>/seed<k>/checkpoints/<name>/) only after it has run.

if SFT_ENABLED:

    rule sft:
        input:
            target=TARGET,
            receipts=FROZEN,
            model=f"{RESULTS}/model",
            train=f"{RESULTS}/tasks/train.jsonl",
            solutions=f"{RESULTS}/tasks/solutions.jsonl",  # oracle actions, frozen with the tasks
        output:
            model=directory(SFT_MODEL),
            receipt=f"{RECEIPTS}/sft.json",
        params:
            settings=as_arg(config["training"]["sft"]),
            tools=config["training"]["tools"],
            training=as_arg(config["training"]),  # its compute and vision settings
            # The demonstrations are played on the evaluation arm's environment.
            arm=as_arg(config["arms"][PREREG.evaluation.backend]),
        threads: whole_machine()
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/sft.tsv",
        log:
            f"{LOGS}/sft.log",
        shell:
            "python -m envab.trainer.sft --target {input.target} --receipts {input.receipts}"
            " --model {input.model} --tasks {input.train} --solutions {input.solutions}"
            " --settings {params.settings} --tools {params.tools} --arm {params.arm}"
            " --training {params.training}"
            " --out {output.model} --receipt {output.receipt} --log {log}"


checkpoint train:
    input:
        target=TARGET,
        receipts=training_receipts(),
        pins=run_file("pins.json"),
        train=f"{RESULTS}/tasks/train.jsonl",
        guest=qemu_guest_record,
        model=training_model(),
        # No held-out input: the stop-at-target judge's own process finds the held-out split by
        # the split receipt (made with train.jsonl by the split rule); the trainer never has it.
    output:
        run=run_file("run.json"),
        trajectories=run_file("trajectories.jsonl"),
        steps=run_file("steps.jsonl"),
        records=run_file("checkpoints.jsonl"),
        checkpoints=directory(run_file("checkpoints")),
        # the records' digests as training left them, written at the run's end
        receipt=training_records_receipt(),
    params:
        wandb=f"{RESULTS}/wandb",
        launch=" ".join(launcher(COMPUTE)),  # python -m, or accelerate launch ... -m
        stop=stop_at_target,
    wildcard_constraints:
        arm="[A-Za-z0-9_-]+",
        seed=r"\d+",
    # The whole machine for one run at a time: a second run beside it would slow it down and
    # distort the wall-clock that time-to-target is measured by.
    threads: whole_machine()
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/train/{{arm}}_seed{{seed}}.tsv",
    log:
        main=f"{LOGS}/train_{{arm}}_seed{{seed}}.log",
        host=f"{LOGS}/train_{{arm}}_seed{{seed}}.host.log",
    shell:
        # The log shows a progress bar of valid trajectories against the frozen budget; the
        # console a line per checkpoint.
        "{params.launch} envab.trainer.grpo --target {input.target} --receipts {input.receipts}"
        " --pins {input.pins} --model {input.model} --train {input.train}"
        " --trajectories {output.trajectories} --checkpoint-records {output.records}"
        " --checkpoints {output.checkpoints} --run {output.run} --steps {output.steps}"
        " --receipt {output.receipt} {params.stop}"
        " --host-log {log.host} --cores {threads}"
        " --wandb-dir {params.wandb} --log {log.main}"


if TIMING:

    # The speed endpoint's timing blocks: every arm replays a training seed for the registered
    # window, back to back in the registered order, each window measured with the load beside it
    # (trainer/timing.py). After the A/B runs' training, whose pins and guests it shares.
    rule timing:
        input:
            target=TARGET,
            receipts=training_receipts(),
            pins=timing_pins(),
            train=f"{RESULTS}/tasks/train.jsonl",
            guests=timing_guests,
            model=training_model(),
        output:
            TIMING,
        # The whole machine: nothing of the workflow's beside a timed window.
        threads: whole_machine()
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/timing.tsv"
        log:
            f"{LOGS}/timing.log",
        shell:
            "python -m envab.trainer.timing --target {input.target} --receipts {input.receipts}"
            " --model {input.model} --train {input.train} --pins {input.pins}"
            " --dir $(dirname {output}) --out {output} --cores {threads} --log {log}"
