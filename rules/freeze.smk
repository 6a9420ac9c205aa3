# Freeze: target, task set and split, model pin, code pins; then what each (arm, seed) is pinned to.
# Receipts are write-protected: Snakemake refuses to rerun a job that would overwrite one, so a
# frozen item is never silently re-frozen.

from envab.freeze import setups_per_valid


rule freeze_target:
    input:
        ancient(TARGET),
    output:
        protected(f"{RECEIPTS}/preregistration.json"),
    # Beside the receipt, an experiment's first freeze writes its anchor next to target.yaml
    # (envab/anchor.py), for the team to commit: on the machine that holds the repository, not in
    # a cluster job's copy of it.
    localrule: True
    params:
        # a handicap control that cannot fit the budget is refused at freeze, with the arithmetic
        setups=as_arg(
            setups_per_valid(config["arms"], config["training"]["grpo"]["num_generations"])
        ),
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/freeze_target.tsv",
    log:
        f"{LOGS}/freeze_target.log",
    shell:
        "python -m envab.freeze target {input} --receipt {output}"
        " --setups-per-valid {params.setups} > {log} 2>&1"


if "factory" in config["tasks"]:

    rule tasks:
        input:
            PREREG_RECEIPT,
        output:
            tasks=f"{RESULTS}/tasks/tasks.jsonl",
            solutions=f"{RESULTS}/tasks/solutions.jsonl",
            index=f"{RESULTS}/tasks/index.json",
        params:
            seed=config["tasks"]["factory"]["seed"],
            per_family=config["tasks"]["factory"]["per_family"],
            layout=factory_layout_args(config["tasks"]["factory"]),
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/tasks.tsv",
        log:
            f"{LOGS}/tasks.log",
        shell:
            # --check builds twice and fails on any byte difference; the validator then plays
            # no-op, oracle and near misses and accepts the set only if the checkers separate them.
            "(python -m envab.envs.tasks.build --seed {params.seed} --per-family {params.per_family}"
            " {params.layout} --tasks {output.tasks} --solutions {output.solutions}"
            " --index {output.index} --check"
            " && python -m envab.envs.validate --tasks {output.tasks}"
            " --solutions {output.solutions}) > {log} 2>&1"

elif "osworld" in config["tasks"]:
    # The files the tasks download, frozen by content beside them (envs/tasks/fetch.py) where an
    # arm plays the X desktop, the one world that runs OSWorld's tasks, or where the config says
    # how (tasks.osworld.files: a mirror, a registered map, the caps).
    OSWORLD_FILES = config["tasks"]["osworld"].get("files")
    FREEZE_FILES = bool(RUNNABLE) or OSWORLD_FILES is not None
    OSWORLD_SOLUTIONS = config["tasks"]["osworld"].get("solutions")

    rule tasks:
        input:
            receipt=PREREG_RECEIPT,
            # the task source is the repository's (or the team's), never remote storage's
            examples=local(config["tasks"]["osworld"]["dir"]),
            index=[local(p) for p in [config["tasks"]["osworld"].get("index")] if p],
            # a registered map: a change reruns
            expect=[local(p) for p in [(OSWORLD_FILES or {}).get("expect")] if p],
            solutions=[local(p) for p in [OSWORLD_SOLUTIONS] if p],
            noop=[local(p) for p in [config["tasks"]["osworld"].get("noop_record")] if p],
        output:
            tasks=f"{RESULTS}/tasks/tasks.jsonl",
            sources=directory(f"{RESULTS}/tasks/osworld"),
            report=f"{RESULTS}/tasks/index.json",
            # the warm start's demonstrations, where the source has oracles
            **({"solutions": f"{RESULTS}/tasks/solutions.jsonl"} if OSWORLD_SOLUTIONS else {}),
            **(
                {
                    "files": directory(f"{RESULTS}/tasks/files"),
                    "file_map": f"{RESULTS}/tasks/files.json",
                }
                if FREEZE_FILES
                else {}
            ),
        params:
            index=lambda wildcards, input: f"--index {input.index}" if input.index else "",
            runnable=RUNNABLE,
            # the registered rule choosing the subset; the report says why each other task is out
            select=(
                f"--select {as_arg(config['tasks']['osworld']['select'])}"
                if "select" in config["tasks"]["osworld"]
                else ""
            ),
            files=(
                f"--files {RESULTS}/tasks --files-config {as_arg(OSWORLD_FILES or {})}"
                if FREEZE_FILES
                else ""
            ),
            noop=lambda wildcards, input: f"--noop {input.noop}" if input.noop else "",
            solutions=lambda wildcards, input, output: (
                f"--solutions-from {input.solutions} --solutions {output.solutions}"
                if OSWORLD_SOLUTIONS
                else ""
            ),
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/tasks.tsv",
        log:
            f"{LOGS}/tasks.log",
        shell:
            # Each task file copied byte for byte; a malformed one refused with its path.
            "python -m envab.envs.osworld --dir {input.examples} {params.index}"
            " --tasks {output.tasks} --sources {output.sources} --report {output.report}"
            " {params.runnable} {params.select} {params.files} {params.solutions} {params.noop}"
            " > {log} 2>&1"

else:

    rule tasks:
        input:
            receipt=PREREG_RECEIPT,
            tasks=local(config["tasks"]["path"]),
        output:
            tasks=f"{RESULTS}/tasks/tasks.jsonl",
            report=f"{RESULTS}/tasks/index.json",
        params:
            runnable=RUNNABLE,
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/tasks.tsv",
        log:
            f"{LOGS}/tasks.log",
        shell:
            # Kept line for line; a malformed line refused with its number.
            "python -m envab.envs.osworld --jsonl {input.tasks} --tasks {output.tasks}"
            " --report {output.report} {params.runnable} > {log} 2>&1"


rule split:
    input:
        target=TARGET,
        receipt=PREREG_RECEIPT,
        tasks=f"{RESULTS}/tasks/tasks.jsonl",
        report=f"{RESULTS}/tasks/index.json",
    output:
        train=f"{RESULTS}/tasks/train.jsonl",
        heldout=f"{RESULTS}/tasks/heldout.jsonl",
        receipt=protected(f"{RECEIPTS}/split.json"),
    params:
        seed=config["split"]["seed"],
        fraction=config["split"]["heldout_fraction"],
        unit=config["split"]["unit"],
        stratify=config["split"]["stratify"],
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/split.tsv",
    log:
        f"{LOGS}/split.log",
    shell:
        "python -m envab.freeze split --target {input.target} --receipts {input.receipt}"
        " --tasks {input.tasks} --tasks-report {input.report} --seed {params.seed}"
        " --heldout-fraction {params.fraction}"
        " --unit {params.unit} --stratify {params.stratify}"
        " --train {output.train} --heldout {output.heldout} --receipt {output.receipt}"
        " > {log} 2>&1"


rule code_pins:
    input:
        target=TARGET,
        receipt=PREREG_RECEIPT,
    output:
        protected(f"{RECEIPTS}/code.json"),
    params:
        repository=REPOSITORY,
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/code_pins.tsv",
    log:
        f"{LOGS}/code_pins.log",
    shell:
        "python -m envab.freeze code --target {input.target} --receipts {input.receipt}"
        " --repository {params.repository} --receipt {output} > {log} 2>&1"


if MANIFEST_FILE:

    # A hub model's manifest, from the hub's metadata at the pinned commit (the commit fixes the
    # files, so this is a record, not a choice); once written, every later run checks offline.
    rule pin_model:
        output:
            MANIFEST_FILE,
        params:
            source=config["model"]["source"],
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/pin_model.tsv",
        log:
            f"{LOGS}/pin_model.log",
        shell:
            "python -m envab.trainer.model pin {params.source} --expect {params.source}"
            " --write {output} > {log} 2>&1"


rule model:
    input:
        target=TARGET,
        receipt=PREREG_RECEIPT,
        train=f"{RESULTS}/tasks/train.jsonl",  # the tokenizer never sees held-out text
        manifest=[MANIFEST_FILE] if MANIFEST_FILE else [],
    output:
        model=directory(f"{RESULTS}/model"),
        receipt=protected(f"{RECEIPTS}/model.json"),
    params:
        source=config["model"]["source"],
        spec=as_arg(config["model"]["spec"]),
        manifest=MANIFEST_FILE or as_arg(config["model"]["manifest"]),
        # the turns must fit the completion budget, counted by the pinned processor: refused here
        training=as_arg(config["training"]),
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/model.tsv",
    log:
        f"{LOGS}/model.log",
    shell:
        "python -m envab.trainer.pin --target {input.target} --receipts {input.receipt}"
        " --source {params.source} --spec {params.spec} --tasks {input.train}"
        " --manifest {params.manifest} --training {params.training}"
        " --out {output.model} --receipt {output.receipt} > {log} 2>&1"


rule pins:
    input:
        target=TARGET,
        receipts=FROZEN,
    output:
        run_file("pins.json"),
    params:
        arm_config=lambda w: as_arg(ARMS[w.arm]),
        training=as_arg(config["training"]),
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/pins/{{arm}}_seed{{seed}}.tsv",
    log:
        f"{LOGS}/pins_{{arm}}_seed{{seed}}.log",
    shell:
        "python -m envab.freeze pins --target {input.target} --receipts {input.receipts}"
        " --arm {wildcards.arm} --seed {wildcards.seed} --arm-config {params.arm_config}"
        " --training {params.training} --out {output} > {log} 2>&1"


# Everything that is frozen before the first training step, the runs' pins included.
rule freeze:
    input:
        FROZEN,
        run_pins(),


# No inputs on purpose: verify must check what is on disk, never trigger a rebuild first. And no
# product (no `benchmark:`, no output): a rule with one is "Nothing to be done" once it exists, so a
# tamper after a first verify would pass silently; a rule with neither input nor output runs every
# time it is asked for (a log is not a product to Snakemake). tests/test_freeze_workflow.py holds it.
localrules:
    verify,


rule verify:
    params:
        receipts=RECEIPTS,
    conda:
        SOFTWARE
    log:
        f"{LOGS}/verify.log",
    shell:
        "python -m envab.verify {params.receipts} 2>&1 | tee {log}"
