# The answer: the primary endpoint, time-to-target per run, learning curves, the outcome receipt.
# Every file a job reads or writes is declared here and handed to it by name.


rule outcome:
    input:
        target=TARGET,
        # What the outcome receipt builds on: the freeze, and the warm start if there is one.
        receipts=training_receipts(),
        runs=all_run_records,
        timing=[TIMING] if TIMING else [],
    output:
        json=f"{ANSWER}/outcome.json",
        md=report(f"{ANSWER}/outcome.md", caption="../report/outcome.rst", category="Outcome"),
        curves_valid=report(
            f"{ANSWER}/figures/curves_valid.png",
            caption="../report/curves_valid.rst",
            category="Learning curves",
        ),
        curves_wallclock=report(
            f"{ANSWER}/figures/curves_wallclock.png",
            caption="../report/curves_wallclock.rst",
            category="Learning curves",
        ),
        receipt=f"{ANSWER_RECEIPTS}/outcome.json",
    params:
        runs=run_arguments,
        timing=f"--timing {TIMING}" if TIMING else "",
    conda:
        SOFTWARE
    benchmark:
        f"{ANSWER_BENCHMARKS}/outcome.tsv",
    log:
        f"{ANSWER_LOGS}/outcome.log",
    shell:
        "python -m envab.analysis.outcome --target {input.target} --receipts {input.receipts}"
        " {params.runs} {params.timing}"
        " --outcome-json {output.json} --outcome-md {output.md}"
        " --curves-valid {output.curves_valid} --curves-wallclock {output.curves_wallclock}"
        " --receipt {output.receipt} > {log} 2>&1"


rule run_table:
    input:
        target=TARGET,
        pins=run_file("pins.json"),
        checkpoints=run_file("checkpoints.jsonl"),
        run=run_file("run.json"),
        evals=lambda w: eval_records(w.arm, int(w.seed)),
    output:
        report(
            run_file("curve.csv"),
            caption="../report/run_curve.rst",
            category="Runs",
            subcategory="{arm}",
            labels={"arm": "{arm}", "seed": "{seed}"},
        ),
    params:
        wandb=f"{RESULTS}/wandb",  # the run's held-out curve, as a wandb run
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/run_table/{{arm}}_seed{{seed}}.tsv",
    log:
        f"{LOGS}/run_table_{{arm}}_seed{{seed}}.log",
    shell:
        "python -m envab.analysis.run_table --target {input.target} --pins {input.pins}"
        " --checkpoints {input.checkpoints} --run {input.run} --evals {input.evals}"
        " --out {output} --wandb-dir {params.wandb} > {log} 2>&1"


# The `verify` result inside the report, next to the outcome: every receipt the outcome builds on,
# each run's training records, the outcome's own and the controls'. The job fails on any failed
# digest (its log keeps the lines).
rule verification:
    input:
        receipts=training_receipts()
        + training_records_receipts()
        + [f"{ANSWER_RECEIPTS}/outcome.json"]
        + ([f"{ANSWER_RECEIPTS}/controls.json"] if CONTROL_RUNS else []),
    output:
        report(
            f"{ANSWER}/verification.html",
            caption="../report/verification.rst",
            category="Outcome",
        ),
    conda:
        SOFTWARE
    benchmark:
        f"{ANSWER_BENCHMARKS}/verification.tsv",
    log:
        f"{ANSWER_LOGS}/verification.log",
    shell:
        "python -m envab.verify --receipts {input.receipts} --html {output} > {log} 2>&1"


# `snakemake report` (a target) makes the same file as `snakemake --report report.html`.
rule report:
    input:
        answer_outputs(),
    output:
        "report.html",
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/report.tsv",
    log:
        f"{LOGS}/report.log",
    shell:
        "python -m snakemake --report {output} --nolock --cores 1 > {log} 2>&1"
