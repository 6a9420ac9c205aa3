# Freeze: target, task set and split, model pin, code pins; then what each (arm, seed) is pinned to.
# Receipts are write-protected: Snakemake refuses to rerun a job that would overwrite one, so a
# frozen item is never silently re-frozen.


rule freeze_target:
    input:
        ancient(config["preregistration"]),
    output:
        protected(f"{RECEIPTS}/preregistration.json"),
    log:
        f"{LOGS}/freeze_target.log",
    shell:
        "{PYTHON} -m envab.freeze target {input} > {log} 2>&1"


def factory_layout_args(factory):
    """The task factory's layout options, as build arguments."""
    args = f"--layout {factory['layout']} --templates {factory['templates']}"
    if factory.get("families"):
        args += " --families " + " ".join(factory["families"])
    return args


if "factory" in config["tasks"]:

    rule tasks:
        input:
            f"{RECEIPTS}/preregistration.json",
        output:
            tasks=f"{RESULTS}/tasks/tasks.jsonl",
            solutions=f"{RESULTS}/tasks/solutions.jsonl",
        params:
            seed=config["tasks"]["factory"]["seed"],
            per_family=config["tasks"]["factory"]["per_family"],
            layout=factory_layout_args(config["tasks"]["factory"]),
            out=f"{RESULTS}/tasks",
        log:
            f"{LOGS}/tasks.log",
        shell:
            # --check builds twice and fails on any byte difference; the validator then plays
            # no-op, oracle and near misses and accepts the set only if the checkers separate them.
            "({PYTHON} -m envs.tasks.build --seed {params.seed} --per-family {params.per_family}"
            " {params.layout} --out {params.out} --check"
            " && {PYTHON} -m envs.tasks.validate --tasks {output.tasks}"
            " --solutions {output.solutions}) > {log} 2>&1"

else:

    rule tasks:
        input:
            receipt=f"{RECEIPTS}/preregistration.json",
            tasks=config["tasks"]["path"],
        output:
            tasks=f"{RESULTS}/tasks/tasks.jsonl",
        log:
            f"{LOGS}/tasks.log",
        shell:
            "cp {input.tasks} {output.tasks} 2> {log}"


rule split:
    input:
        target=config["preregistration"],
        receipt=f"{RECEIPTS}/preregistration.json",
        tasks=f"{RESULTS}/tasks/tasks.jsonl",
    output:
        train=f"{RESULTS}/tasks/train.jsonl",
        heldout=f"{RESULTS}/tasks/heldout.jsonl",
        receipt=protected(f"{RECEIPTS}/split.json"),
    params:
        seed=config["split"]["seed"],
        fraction=config["split"]["heldout_fraction"],
    log:
        f"{LOGS}/split.log",
    shell:
        "{PYTHON} -m envab.freeze split --target {input.target} --tasks {input.tasks}"
        " --seed {params.seed} --heldout-fraction {params.fraction}"
        " --train {output.train} --heldout {output.heldout} > {log} 2>&1"


rule code_pins:
    input:
        target=config["preregistration"],
        receipt=f"{RECEIPTS}/preregistration.json",
    output:
        protected(f"{RECEIPTS}/code.json"),
    params:
        groups=as_arg(config["code_pins"]),
    log:
        f"{LOGS}/code_pins.log",
    shell:
        "{PYTHON} -m envab.freeze code --target {input.target} --groups {params.groups} > {log} 2>&1"


rule model:
    input:
        target=config["preregistration"],
        receipt=f"{RECEIPTS}/preregistration.json",
        train=f"{RESULTS}/tasks/train.jsonl",  # the tokenizer never sees held-out text
    output:
        model=directory(f"{RESULTS}/model"),
        receipt=protected(f"{RECEIPTS}/model.json"),
    params:
        source=config["model"]["source"],
        spec=as_arg(config["model"]["spec"]),
        manifest=as_arg(config["model"]["manifest"]),
    log:
        f"{LOGS}/model.log",
    shell:
        "{PYTHON} -m envab.freeze model --target {input.target} --source {params.source}"
        " --spec {params.spec} --tasks {input.train} --manifest {params.manifest}"
        " --out {output.model} > {log} 2>&1"


rule pins:
    input:
        target=config["preregistration"],
        receipts=expand(f"{RECEIPTS}/{{name}}", name=FREEZE_RECEIPTS),
    output:
        f"{RESULTS}/{{arm}}/seed{{seed}}/pins.json",
    params:
        arm_config=lambda w: as_arg(config["arms"][w.arm]),
        training=as_arg(config["training"]),
        names=" ".join(FREEZE_RECEIPTS),
    log:
        f"{LOGS}/pins_{{arm}}_seed{{seed}}.log",
    shell:
        "{PYTHON} -m envab.freeze pins --target {input.target} --arm {wildcards.arm}"
        " --seed {wildcards.seed} --arm-config {params.arm_config} --training {params.training}"
        " --receipts {params.names}"
        " --out {output} > {log} 2>&1"


# Everything that is frozen before the first training step, the runs' pins included.
rule freeze:
    input:
        expand(f"{RECEIPTS}/{{name}}", name=FREEZE_RECEIPTS),
        run_pins(),


# No inputs on purpose: verify must check what is on disk, never trigger a rebuild first.
rule verify:
    shell:
        "{PYTHON} -m envab.verify {RECEIPTS}"
