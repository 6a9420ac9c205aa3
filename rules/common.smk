# Configuration is validated once here; everything below reads the typed results. The input
# functions and helpers of every rule file live here too, so those files hold rules only.
import json
import os
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

from envab import codepins, preregistration
from envab.config import load_config, select, selected_runs, selection_name, selection_words
from envab.hashing import sha256_file
from envab.io import read_jsonl
from envab.layout import Layout
from envab.receipts import FREEZE_RECEIPTS
from envab.trainer.timing import block_seed
from envab.run_receipts import training_receipt_name
from envab.schema import ConfigError
from envab.trainer.compute import compute_settings, launcher


def command_line_targets():
    """The targets typed on Snakemake's command line, read with Snakemake's own parser (the
    workflow learns its targets only after this file is parsed); none where Snakemake was not
    started from its command line (the Python API): there the selection comes through config."""
    program = Path(sys.argv[0])
    if "snakemake" not in (program.name, program.parent.name):
        return []
    from snakemake.cli import get_argument_parser

    try:
        return get_argument_parser().parse_known_args(sys.argv[1:])[0].targets or []
    except SystemExit:  # Snakemake itself reports a malformed command line
        return []


def pass_selection_to_jobs(words):
    """A job that a cluster executor spawns re-parses this file with its own targets: the
    selection reaches it as --config, which Snakemake hands to every job it spawns."""
    given = workflow.config_settings.config_args or []
    kept = [a for a in given if a.partition("=")[0] not in words]
    workflow.config_settings.config_args = kept + [f"{k}={v!r}" for k, v in words.items()]


try:
    SELECTION = selection_words(command_line_targets())
    select(config, SELECTION, "--config")
    pass_selection_to_jobs(SELECTION)
    PREREG = load_config(config, "config")  # the schema's defaults filled into config
    RUNS = selected_runs(config, PREREG)
    COMPUTE = compute_settings(config["training"])  # where the model runs (trainer/compute.py)
    if preregistration.receipt_path(PREREG).is_file():
        preregistration.check_frozen(config["preregistration"])  # an edited target stops here
except ConfigError as e:
    sys.exit(f"env-ab: {e}")

EXP = PREREG.experiment_id
# The folder of the Snakefile, as seen from the working directory (`..` under --directory .test):
# the code pins (envab/codepins.py) name the repository's files from there.
REPOSITORY = shlex.quote(os.path.relpath(workflow.basedir))


def refuse_changed_code():
    """Once the experiment is frozen, an edit to any pinned file (the analysis that decides the
    answer included) stops every later run here, naming the file; `verify` still runs, so that
    the reviewer sees every item's line, and `--unlock`, which runs nothing."""
    receipt = Layout(EXP).receipts / "code.json"
    if not receipt.is_file() or set(command_line_targets()) == {"verify"} or "--unlock" in sys.argv:
        return
    try:
        changed = codepins.changed_since(json.loads(receipt.read_text())["predicate"])
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
        sys.exit(f"env-ab: {receipt} cannot be checked against the code ({e}); run verify")
    if changed:
        sys.exit(
            f"env-ab: code changed since experiment '{EXP}' was frozen: {', '.join(changed[:5])}"
            f"{' ...' if len(changed) > 5 else ''}. Restore it (git checkout -- <file>), or "
            "register a new experiment_id; `snakemake --cores 1 verify` lists every item"
        )


refuse_changed_code()
# The pre-registration is a file of the repository, read where the job runs (in the project's
# image on a cluster), never fetched from or written to remote storage.
TARGET = local(config["preregistration"])
# A hub model's manifest may live in its own file (written by rule pin_model), not in the config.
MANIFEST_FILE = (
    config["model"]["manifest"] if isinstance(config["model"]["manifest"], str) else None
)
# A read-only projection of the pre-registration for the report's workflow description.
config["preregistered"] = {**PREREG.as_dict(), "sha256": sha256_file(config["preregistration"])}
LAYOUT = Layout(EXP)  # where every file of the experiment goes (envab/layout.py)
RESULTS = LAYOUT.results.as_posix()
RECEIPTS = LAYOUT.receipts.as_posix()
LOGS = LAYOUT.logs.as_posix()
BENCHMARKS = LAYOUT.benchmarks.as_posix()  # each job's wall-clock, CPU time and memory
EVALUATIONS = LAYOUT.evaluations.as_posix()  # evaluation records by key, each played once
PREREG_RECEIPT = f"{RECEIPTS}/preregistration.json"
# Where the answer goes: the registration's, from every run; a selection's (arm=, seed=) apart,
# under its own name, so that a one-arm run never replaces the registration's answer.
SELECTED = selection_name(config)
ANSWER = f"{RESULTS}/selections/{SELECTED}" if SELECTED else RESULTS
ANSWER_RECEIPTS = f"{RECEIPTS}/selections/{SELECTED}" if SELECTED else RECEIPTS
ANSWER_LOGS = f"{LOGS}/selections/{SELECTED}" if SELECTED else LOGS
ANSWER_BENCHMARKS = f"{BENCHMARKS}/selections/{SELECTED}" if SELECTED else BENCHMARKS
FROZEN = [f"{RECEIPTS}/{name}" for name in FREEZE_RECEIPTS]  # what every later job builds on
SFT_ENABLED = config["training"]["sft"]["enabled"]
SFT_MODEL = f"{RESULTS}/sft/model"
# Every arm a run can go under: the configured arms, and each pre-registered control's, which is
# its base arm's config with the control's change (envs/controls.py) under <arm>-<name>.
CONTROL_BASE = {c.run_arm: c.arm for c in PREREG.controls}
ARMS = {
    **config["arms"],
    **{c.run_arm: c.arm_config(config["arms"][c.arm]) for c in PREREG.controls},
}
# The controls' runs: beside the A/B, on every selected control seed of their base arm;
# `arm=<arm>` asks for that arm alone.
CONTROL_RUNS = [
    (c.run_arm, seed)
    for c in PREREG.controls
    for arm, seed in RUNS
    if arm == c.arm and seed in PREREG.seeds_of_controls() and config["arm"] is None
]
QEMU_ARMS = sorted(a for a, spec in config["arms"].items() if spec["backend"] == "qemu")
# An arm on the real X desktop: the freeze refuses a task it cannot set up or score, judged by
# the applications of the image the arms play (the base image where arms differ: a task must run
# on every arm).
XDESKTOP_IMAGES = {
    spec.get("image", "base")
    for spec in config["arms"].values()
    if spec.get("world") == "xdesktop"
}
RUNNABLE = (
    "--runnable xdesktop --image "
    + (XDESKTOP_IMAGES.pop() if len(XDESKTOP_IMAGES) == 1 else "base")
    if XDESKTOP_IMAGES
    else ""
)

# The software of every rule: the project in its own environment (`--sdm conda`), or else the
# interpreter running Snakemake, whose folder goes first on each job's PATH so that `python` in a
# rule is that interpreter even when its virtualenv is not activated.
SOFTWARE = "../environment.yaml"
if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
    shell.prefix(
        f"set -euo pipefail; export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\"; "
    )


def as_arg(obj):
    """A config value as one shell-quoted JSON argument."""
    return shlex.quote(json.dumps(obj, sort_keys=True))


def whole_machine():
    """Threads for a timed job: every core Snakemake has, so it never runs beside another one
    (1 where no core count was given, e.g. `snakemake --report`, which runs no job)."""
    try:
        return workflow.cores
    except WorkflowError:
        return 1


def run_dir(arm, seed):
    return LAYOUT.run(arm, seed).as_posix()


def run_pins():
    """What each selected (arm, seed) run, and each control's run, is pinned to."""
    return [f"{run_dir(arm, seed)}/pins.json" for arm, seed in RUNS + CONTROL_RUNS]


def run_file(name):
    """The path of a per-run file, as a Snakemake pattern over {arm} and {seed}."""
    return f"{run_dir('{arm}', '{seed}')}/{name}"


def training_records_receipt(arm="{arm}", seed="{seed}"):
    """A run's training-records receipt (envab/run_receipts.py); a pattern over {arm} and {seed}
    unless both are given."""
    return f"{RECEIPTS}/{training_receipt_name(arm, seed)}"


def training_records_receipts():
    """Every selected run's training-records receipt, the controls' runs' included."""
    return [training_records_receipt(arm, seed) for arm, seed in RUNS + CONTROL_RUNS]


def factory_layout_args(factory):
    """The task factory's layout options, as build arguments."""
    args = f"--layout {factory['layout']} --templates {factory['templates']}"
    if factory.get("families"):
        args += " --families " + " ".join(factory["families"])
    return args


def training_model():
    """The model GRPO starts from: the warm start's output, or the pinned model as it is."""
    return SFT_MODEL if SFT_ENABLED else f"{RESULTS}/model"


def stops_at_target(arm):
    """Whether the runs of `arm` stop at target: the A/B's, where the pre-registration says so;
    never a control's (it runs its own budget)."""
    return PREREG.budget_for(arm).stop_at_target


def stop_at_target(wildcards):
    """How a training job that stops at target has each checkpoint judged (trainer/grpo.py,
    analysis/stop_at_target.py): as the eval and confirm rules would play it, into the same
    evaluation store; nothing where the run trains to its budget."""
    if not stops_at_target(wildcards.arm):
        return ""
    # No held-out path: the judge finds the split's file from the frozen receipts itself.
    judge = {
        "backend": eval_backend(wildcards.arm),
        "confirm_backend": config["arms"][PREREG.evaluation.backend],
        "store": EVALUATIONS,
        "log": f"{LOGS}/train_{wildcards.arm}_seed{wildcards.seed}.judge.log",
    }
    return f"--stop-at-target {as_arg(judge)}"


# The registered timing blocks (target.yaml `timing`, trainer/timing.py): measured for the whole
# registration only; a selection's answer reads the runs alone.
TIMING = f"{RESULTS}/timing/blocks.jsonl" if PREREG.timing and not SELECTED else None


def timing_pins():
    """The pins of every run a timing block replays: its seed on every arm, and on every timed
    control (pins only: a control trains on control_seeds alone)."""
    seeds = sorted({block_seed(PREREG.seeds, k) for k in range(PREREG.timing.blocks)})
    return [f"{run_dir(arm, seed)}/pins.json" for arm in PREREG.timed_arms for seed in seeds]


def timing_guests(wildcards):
    """Every QEMU arm's guest record: the timing blocks play every arm."""
    return [f"{RESULTS}/{arm}/guest.json" for arm in QEMU_ARMS]


def training_receipts():
    """What training builds on: the freeze, and the warm start if there is one."""
    return FROZEN + ([f"{RECEIPTS}/sft.json"] if SFT_ENABLED else [])


def qemu_guest_record(wildcards):
    """A QEMU arm's guest record (the guest is built before the arm trains); none otherwise."""
    arm = CONTROL_BASE.get(wildcards.arm, wildcards.arm)  # a control runs on its base's guest
    return [f"{RESULTS}/{arm}/guest.json"] if arm in QEMU_ARMS else []


def checkpoint_names(arm, seed):
    """The checkpoints a finished training run saved (re-evaluated once `train` has run)."""
    records = checkpoints.train.get(arm=arm, seed=seed).output.records
    return [record["checkpoint"] for record in read_jsonl(records)]


def eval_records(arm, seed):
    return [f"{run_dir(arm, seed)}/eval/{name}.json" for name in checkpoint_names(arm, seed)]


def run_records(arm, seed):
    """One run's files in the order `--run` takes them: its pins, its checkpoint records, its
    final counters, its step digests, then the held-out evaluation of each checkpoint (known once
    `train` ran)."""
    run = run_dir(arm, seed)
    return [
        f"{run}/pins.json",
        f"{run}/checkpoints.jsonl",
        f"{run}/run.json",
        f"{run}/steps.jsonl",
        *eval_records(arm, seed),
    ]


def outcome_run_records(arm, seed):
    """A run's records as the outcome reads them: with its trajectories (each run's reward
    consistency; a control's base run's, for the corruption's comparison) and its confirmatory
    evaluation and its cross-arm trace replay, where each is registered."""
    confirmed = [f"{run_dir(arm, seed)}/confirm.json"] if PREREG.confirmation else []
    replayed = [f"{run_dir(arm, seed)}/replay.json"] if PREREG.replay else []
    return (
        run_records(arm, seed)
        + [f"{run_dir(arm, seed)}/trajectories.jsonl"]
        + confirmed
        + replayed
    )


def all_run_records(wildcards):
    return [path for arm, seed in RUNS for path in outcome_run_records(arm, seed)]


def run_arguments(wildcards):
    """One `--run` group per selected run, naming the same files as `all_run_records`."""
    return " ".join("--run " + " ".join(outcome_run_records(arm, seed)) for arm, seed in RUNS)


def control_pairs():
    """The runs the controls compare: each control's, and its base arm's on the same seed; both
    name their trajectories (the handicap counts set-ups in them, the reward consistency groups
    attempts by task and actions)."""
    base = sorted({(CONTROL_BASE[arm], seed) for arm, seed in CONTROL_RUNS})
    return [(run, False) for run in base] + [(run, True) for run in CONTROL_RUNS]


def control_files(arm, seed, is_control):
    """One run's files as the controls read them: a control's run with its trajectories (the
    handicap counts set-ups in it); a base run with its confirmation, where one is registered,
    since an unconfirmed crossing is not the checkpoint a control is judged at."""
    if is_control:
        return run_records(arm, seed) + [f"{run_dir(arm, seed)}/trajectories.jsonl"]
    return outcome_run_records(arm, seed)


def control_run_records(wildcards):
    return [
        path
        for (arm, seed), is_control in control_pairs()
        for path in control_files(arm, seed, is_control)
    ]


def control_run_arguments(wildcards):
    return " ".join(
        "--run " + " ".join(control_files(arm, seed, is_control))
        for (arm, seed), is_control in control_pairs()
    )


def answer_outputs():
    """What `all` asks for: the outcome, its verification, the controls' table where any are
    registered, and one table per run."""
    answer = [f"{ANSWER}/outcome.md", f"{ANSWER}/verification.html"]
    answer += [f"{ANSWER}/controls.md"] if CONTROL_RUNS else []
    return answer + [f"{run_dir(a, s)}/curve.csv" for a, s in RUNS + CONTROL_RUNS]


# An evaluation corruption's runs (the pre-registration's eval_differs controls; rules/eval.smk)
# are evaluated with their flip, and each of their checkpoints once more honestly.
EVAL_CONTROLS = {c.run_arm: c for c in PREREG.controls if c.expect == "eval_differs"}


def eval_backend(arm):
    """The evaluation arm's config for the runs of `arm`: with an evaluation corruption's flip
    (envs/controls.py) for its runs, as registered for every other arm."""
    evaluation = config["arms"][PREREG.evaluation.backend]
    control = EVAL_CONTROLS.get(arm)
    return control.eval_config(evaluation) if control else evaluation


# The controls' job (rules/controls.smk): every control run's records, and an evaluation
# corruption's honest evaluations beside them.
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
