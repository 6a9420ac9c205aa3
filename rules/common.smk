# Configuration is validated once here; everything below reads the typed results.
import json
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from envab import preregistration
from envab.config import CONFIG_SCHEMA, ConfigError, Target, check_config, check_schema, selected_runs
from envab.hashing import sha256_file


def _refuse_literal_selection():
    """`snakemake arm=drums seed=1` makes Snakemake look for files named arm=drums and seed=1
    (targets are only known after this file is parsed, so they cannot be rewritten here): say
    what to type instead of letting it fail with a missing-rule error."""
    words = [w for w in sys.argv[1:] if w.partition("=")[0] in ("arm", "seed") and "=" in w]
    if words and "--config" not in sys.argv and "-C" not in sys.argv:
        raise ConfigError(
            f"Snakemake reads {' '.join(words)} as targets; select a run with "
            f"--config {' '.join(words)}"
        )


try:
    _refuse_literal_selection()
    check_schema(config, CONFIG_SCHEMA, "config")
    validate(config, "../schemas/config.schema.yaml")  # Snakemake's own check; fills defaults
    TARGET = Target.load(config["preregistration"])
    check_config(config, TARGET, "config")
    RUNS = selected_runs(config, TARGET)
    if preregistration.receipt_path(TARGET).is_file():
        preregistration.check_frozen(config["preregistration"])  # an edited target stops here
except ConfigError as e:
    sys.exit(f"env-ab: {e}")

EXP = TARGET.experiment_id
# A read-only projection of the frozen target for the report's workflow description.
config["preregistered"] = {**TARGET.raw, "sha256": sha256_file(config["preregistration"])}
RESULTS = f"results/{EXP}"
RECEIPTS = f"receipts/{EXP}"
LOGS = f"logs/{EXP}"
PYTHON = shlex.quote(sys.executable)  # the interpreter running Snakemake runs every stage
FREEZE_RECEIPTS = ["preregistration.json", "split.json", "code.json", "model.json"]


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
    return f"{RESULTS}/{arm}/seed{seed}"


def run_pins():
    """What each selected (arm, seed) run is pinned to."""
    return [f"{run_dir(arm, seed)}/pins.json" for arm, seed in RUNS]
