# The answer: time-to-target per run, learning curves, the coincidence check, the outcome receipt.


def all_eval_records(wildcards):
    return [record for arm, seed in RUNS for record in eval_records(arm, seed)]


rule outcome:
    input:
        target=config["preregistration"],
        runs=[f"{run_dir(arm, seed)}/run.json" for arm, seed in RUNS],
        evals=all_eval_records,
    output:
        json=f"{RESULTS}/outcome.json",
        md=report(
            f"{RESULTS}/outcome.md", caption="../report/outcome.rst", category="Outcome"
        ),
        curves_valid=report(
            f"{RESULTS}/figures/curves_valid.png",
            caption="../report/curves_valid.rst",
            category="Learning curves",
        ),
        curves_wallclock=report(
            f"{RESULTS}/figures/curves_wallclock.png",
            caption="../report/curves_wallclock.rst",
            category="Learning curves",
        ),
        receipt=f"{RECEIPTS}/outcome.json",
    params:
        runs=" ".join(run_dir(arm, seed) for arm, seed in RUNS),
        depends=" ".join(
            f"{RECEIPTS}/{name}"
            for name in FREEZE_RECEIPTS + (["sft.json"] if SFT_ENABLED else [])
        ),
    log:
        f"{LOGS}/outcome.log",
    shell:
        "{PYTHON} -m analysis.outcome --target {input.target} --runs {params.runs}"
        " --out {RESULTS} --receipts {RECEIPTS} --depends-on {params.depends} > {log} 2>&1"


rule run_table:
    input:
        run=f"{RESULTS}/{{arm}}/seed{{seed}}/run.json",
        evals=lambda w: eval_records(w.arm, int(w.seed)),
    output:
        report(
            f"{RESULTS}/{{arm}}/seed{{seed}}/curve.csv",
            caption="../report/run_curve.rst",
            category="Runs",
            subcategory="{arm}",
            labels={"arm": "{arm}", "seed": "{seed}"},
        ),
    log:
        f"{LOGS}/run_table_{{arm}}_seed{{seed}}.log",
    shell:
        "{PYTHON} -m analysis.run_table {RESULTS}/{wildcards.arm}/seed{wildcards.seed}"
        " --out {output} > {log} 2>&1"


def answer_outputs():
    """What `all` asks for: the outcome and one table per run."""
    return [f"{RESULTS}/outcome.md"] + [f"{run_dir(a, s)}/curve.csv" for a, s in RUNS]


# `snakemake report` (a target) makes the same file as `snakemake --report report.html`.
rule report:
    input:
        answer_outputs(),
    output:
        "report.html",
    log:
        f"{LOGS}/report.log",
    shell:
        "{PYTHON} -m snakemake --report {output} --nolock --cores 1 > {log} 2>&1"
