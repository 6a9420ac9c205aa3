# Held-out evaluation: each saved checkpoint of each run is its own job, discovered after the
# `train` checkpoint has run, on the pre-registered evaluation backend (the same for every arm).
# A checkpoint identical file for file to one already evaluated under the same protocol is not
# played again: its record is taken from EVALUATIONS, marked reused (eval/reuse.py).
# An evaluation corruption's runs (the pre-registration's eval_differs controls) are evaluated
# with their flip, and each of their checkpoints once more honestly (eval-honest/), so that
# analysis/controls.py can compare the two evaluations of one checkpoint.

rule eval:
    input:
        target=TARGET,
        receipts=training_receipts(),  # a LoRA checkpoint's base is the warm start
        pins=run_file("pins.json"),
        records=run_file("checkpoints.jsonl"),
        checkpoint=run_file("checkpoints/{name}"),
        heldout=f"{RESULTS}/tasks/heldout.jsonl",
    output:
        run_file("eval/{name}.json"),
    params:
        backend=lambda w: as_arg(eval_backend(w.arm)),
        store=EVALUATIONS,
    wildcard_constraints:
        arm="[A-Za-z0-9_-]+",
        seed=r"\d+",
    # The whole machine: an evaluation running beside a training run would slow the training
    # and so distort the wall-clock it is measured by. A CPU evaluation plays its episodes on a
    # process per core (eval/workers.py).
    threads: whole_machine()
    conda:
        SOFTWARE
    benchmark:
        f"{BENCHMARKS}/eval/{{arm}}_seed{{seed}}_{{name}}.tsv",
    log:
        f"{LOGS}/eval_{{arm}}_seed{{seed}}_{{name}}.log",
    shell:
        "python -m envab.eval.heldout --target {input.target} --receipts {input.receipts}"
        " --pins {input.pins} --checkpoint-records {input.records}"
        " --checkpoint {input.checkpoint} --heldout {input.heldout} --backend {params.backend}"
        " --out {output} --store {params.store} --log {log} --cores {threads}"


if EVAL_CONTROLS:

    rule eval_honest:
        input:
            target=TARGET,
            receipts=training_receipts(),
            pins=run_file("pins.json"),
            records=run_file("checkpoints.jsonl"),
            checkpoint=run_file("checkpoints/{name}"),
            heldout=f"{RESULTS}/tasks/heldout.jsonl",
        output:
            run_file("eval-honest/{name}.json"),
        params:
            backend=as_arg(config["arms"][PREREG.evaluation.backend]),
            store=EVALUATIONS,  # a replayed checkpoint takes its base run's record
        wildcard_constraints:
            arm="|".join(EVAL_CONTROLS),
            seed=r"\d+",
        threads: whole_machine()
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/eval-honest/{{arm}}_seed{{seed}}_{{name}}.tsv",
        log:
            f"{LOGS}/eval-honest_{{arm}}_seed{{seed}}_{{name}}.log",
        shell:
            "python -m envab.eval.heldout --target {input.target} --receipts {input.receipts}"
            " --pins {input.pins} --checkpoint-records {input.records}"
            " --checkpoint {input.checkpoint} --heldout {input.heldout}"
            " --backend {params.backend} --out {output} --store {params.store} --log {log}"
            " --cores {threads}"


# The confirmatory evaluation (pre-registered `confirmation`): each run's accepted crossing
# evaluated again on fresh seeds with enough episodes to tell the threshold from threshold -
# delta (analysis/confirm.py); a run that never crossed writes that it has nothing to confirm.
if PREREG.confirmation:

    rule confirm:
        input:
            target=TARGET,
            receipts=training_receipts(),
            pins=run_file("pins.json"),
            records=run_file("checkpoints.jsonl"),
            evals=lambda w: eval_records(w.arm, int(w.seed)),
            checkpoints=run_file("checkpoints"),
            heldout=f"{RESULTS}/tasks/heldout.jsonl",
        output:
            run_file("confirm.json"),
        params:
            backend=as_arg(config["arms"][PREREG.evaluation.backend]),
            store=EVALUATIONS,
        wildcard_constraints:
            arm="[A-Za-z0-9_-]+",
            seed=r"\d+",
        threads: whole_machine()  # as every evaluation: never beside a timed training run
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/confirm/{{arm}}_seed{{seed}}.tsv",
        log:
            f"{LOGS}/confirm_{{arm}}_seed{{seed}}.log",
        shell:
            "python -m envab.analysis.confirm --target {input.target} --receipts {input.receipts}"
            " --pins {input.pins} --checkpoint-records {input.records} --evals {input.evals}"
            " --checkpoints {input.checkpoints} --heldout {input.heldout}"
            " --backend {params.backend} --out {output} --store {params.store} --log {log}"
            " --cores {threads}"


# The cross-arm trace replay (pre-registered `replay`): a sample of each A/B run's logged
# attempts played again with the same actions on a fresh environment of every A/B arm
# (eval/replay.py). The check that the arms served the same data which does not rest on
# bit-determinism; a "differ" is recorded, not a failed job: the outcome judges it.
if PREREG.replay:

    rule replay:
        input:
            target=TARGET,
            receipts=FROZEN,  # the training split's; the replay never reads a held-out task
            train=f"{RESULTS}/tasks/train.jsonl",
            trajectories=run_file("trajectories.jsonl"),
            guests=timing_guests,  # every QEMU arm's guest: the replay plays every arm
        output:
            run_file("replay.json"),
        params:
            arms=" ".join(f"--arm {arm} {as_arg(config['arms'][arm])}" for arm in PREREG.arms),
            sample=PREREG.replay.sample,
            seed=PREREG.replay.seed,
        wildcard_constraints:
            arm="|".join(PREREG.arms),  # the A/B runs; a control's arm differs by design
            seed=r"\d+",
        threads: whole_machine()  # as every evaluation: never beside a timed training run
        conda:
            SOFTWARE
        benchmark:
            f"{BENCHMARKS}/replay/{{arm}}_seed{{seed}}.tsv",
        log:
            main=f"{LOGS}/replay_{{arm}}_seed{{seed}}.log",
            host=f"{LOGS}/replay_{{arm}}_seed{{seed}}.host.log",
        shell:
            "python -m envab.eval.replay --target {input.target} --receipts {input.receipts}"
            " --train {input.train} --trajectories {input.trajectories} {params.arms}"
            " --sample {params.sample} --seed {params.seed} --judged-later --out {output}"
            " --log {log.host} > {log.main} 2>&1"
