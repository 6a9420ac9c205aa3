# Held-out evaluation: each saved checkpoint of each run is its own job, discovered after the
# `train` checkpoint has run, on the pre-registered evaluation backend (the same for every arm).
from envab.io import read_jsonl


def checkpoint_names(arm, seed):
    """The checkpoints a finished training run saved (re-evaluated once `train` has run)."""
    records = checkpoints.train.get(arm=arm, seed=seed).output.records
    return [record["checkpoint"] for record in read_jsonl(records)]


def eval_records(arm, seed):
    return [f"{run_dir(arm, seed)}/eval/{name}.json" for name in checkpoint_names(arm, seed)]


rule eval:
    input:
        target=config["preregistration"],
        receipts=expand(f"{RECEIPTS}/{{name}}", name=FREEZE_RECEIPTS),
        checkpoint=f"{RESULTS}/{{arm}}/seed{{seed}}/checkpoints/{{name}}",
        heldout=f"{RESULTS}/tasks/heldout.jsonl",
    output:
        f"{RESULTS}/{{arm}}/seed{{seed}}/eval/{{name}}.json",
    params:
        backend=as_arg(config["arms"][TARGET.evaluation_backend]),
    wildcard_constraints:
        arm="[A-Za-z0-9_-]+",
        seed=r"\d+",
    # The whole machine: an evaluation running beside a training run would slow the training
    # and so distort the wall-clock it is measured by.
    threads: whole_machine()
    log:
        f"{LOGS}/eval_{{arm}}_seed{{seed}}_{{name}}.log",
    shell:
        "{PYTHON} -m eval.heldout --target {input.target} --receipts {RECEIPTS}"
        " --checkpoint {input.checkpoint} --heldout {input.heldout} --backend {params.backend}"
        " --out {output} > {log} 2>&1"
