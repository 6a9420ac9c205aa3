# env-ab: does changing only the environment infrastructure of a computer-use RL run reach the
# same held-out success faster or cheaper? This file is the table of contents; the rules live in
# rules/ by topic, the experiment is pre-registered in preregistration/target.yaml.
import sys
from pathlib import Path

from snakemake.utils import min_version

from envab.schema import ConfigError, load_yaml

min_version("9.0")

# A config.yaml that is not YAML at all: one line saying where (Snakemake's own error names no
# line). Its values are checked against the schema in rules/common.smk.
if Path("config.yaml").is_file():
    try:
        load_yaml("config.yaml")
    except ConfigError as e:
        sys.exit(f"env-ab: {e}")


# A config named with --configfile (config/qwen3-vl-4b.yaml) replaces config.yaml rather than
# being merged into it, as Snakemake's --replace-workflow-config would: a real deployment must not
# inherit the embedded default's arms, tasks or model manifest.
if not workflow.config_settings.configfiles:

    configfile: "config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/freeze.smk"
include: "rules/guest.smk"
include: "rules/train.smk"
include: "rules/eval.smk"
include: "rules/analysis.smk"
include: "rules/controls.smk"


rule all:
    input:
        answer_outputs(),
    default_target: True


# `snakemake --cores all arm=drums seed=1`, the design card's command as typed: Snakemake reads
# those words as targets, so every registered arm and seed is a rule of that name. Which runs
# they stand for was settled when this workflow was parsed (RUNS), so any mix of them asks for
# the same selected answer.
for word in [f"arm={arm}" for arm in PREREG.arms] + [f"seed={seed}" for seed in PREREG.seeds]:

    rule:
        name:
            word
        input:
            answer_outputs(),
