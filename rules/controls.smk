# The built-in controls (the pre-registration's `controls`): each is trained and evaluated by the
# same rules as the A/B's arms under <arm>-<name>, and judged here against its registered verdict.
# An evaluation corruption's run also names its checkpoints' honest evaluations (rules/eval.smk).


def honest_evaluations(arm, seed):
    if arm not in EVAL_CONTROLS:
        return []
    names = checkpoint_names(arm, seed)
    return [f"{run_dir(arm, seed)}/eval-honest/{name}.json" for name in names]


def controls_inputs(wildcards):
    # The runs' records first: the parameters ask for the training checkpoints in that order.
    runs = control_run_records(wildcards)
    return runs + [path for arm, seed in CONTROL_RUNS for path in honest_evaluations(arm, seed)]


def controls_arguments(wildcards):
    return " ".join(
        "--run "
        + " ".join(
            control_files(arm, seed, is_control)
            + (honest_evaluations(arm, seed) if is_control else [])
        )
        for (arm, seed), is_control in control_pairs()
    )


rule controls:
    input:
        target=TARGET,
        receipts=training_receipts(),
        runs=controls_inputs,
    output:
        json=f"{RESULTS}/controls.json",
        md=report(
            f"{RESULTS}/controls.md", caption="../report/controls.rst", category="Outcome"
        ),
        receipt=f"{RECEIPTS}/controls.json",
    params:
        runs=controls_arguments,
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/controls.tsv",
    log:
        f"{LOGS}/controls.log",
    shell:
        "python -m envab.analysis.controls --target {input.target} --receipts {input.receipts}"
        " {params.runs} --json {output.json} --md {output.md} --receipt {output.receipt}"
        " > {log} 2>&1"
