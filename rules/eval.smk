# Held-out evaluation: each saved checkpoint of each run is its own job, discovered after the
# `train` checkpoint has run, on the pre-registered evaluation backend (the same for every arm).


rule eval:
    input:
        target=config["preregistration"],
        receipts=FROZEN,
        pins=run_file("pins.json"),
        records=run_file("checkpoints.jsonl"),
        checkpoint=run_file("checkpoints/{name}"),
        heldout=f"{RESULTS}/tasks/heldout.jsonl",
    output:
        run_file("eval/{name}.json"),
    params:
        backend=as_arg(config["arms"][PREREG.evaluation.backend]),
    wildcard_constraints:
        arm="[A-Za-z0-9_-]+",
        seed=r"\d+",
    # The whole machine: an evaluation running beside a training run would slow the training
    # and so distort the wall-clock it is measured by.
    threads: whole_machine()
    conda:
        SOFTWARE
    log:
        f"{LOGS}/eval_{{arm}}_seed{{seed}}_{{name}}.log",
    shell:
        "python -m envab.eval.heldout --target {input.target} --receipts {input.receipts}"
        " --pins {input.pins} --checkpoint-records {input.records}"
        " --checkpoint {input.checkpoint} --heldout {input.heldout} --backend {params.backend}"
        " --out {output} --log {log}"
