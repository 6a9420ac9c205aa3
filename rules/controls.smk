# The built-in controls (the pre-registration's `controls`): each is trained and evaluated by the
# same rules as the A/B's arms under <arm>-<name>, and judged here against its registered verdict.
# An evaluation corruption's run also names its checkpoints' honest evaluations (rules/eval.smk).


rule controls:
    input:
        target=TARGET,
        receipts=training_receipts(),
        runs=controls_inputs,
    output:
        json=f"{ANSWER}/controls.json",
        md=report(f"{ANSWER}/controls.md", caption="../report/controls.rst", category="Outcome"),
        receipt=f"{ANSWER_RECEIPTS}/controls.json",
    params:
        runs=controls_arguments,
    conda:
        SOFTWARE
    benchmark:
        f"{ANSWER_BENCHMARKS}/controls.tsv",
    log:
        f"{ANSWER_LOGS}/controls.log",
    shell:
        "python -m envab.analysis.controls --target {input.target} --receipts {input.receipts}"
        " {params.runs} --json {output.json} --md {output.md} --receipt {output.receipt}"
        " > {log} 2>&1"
