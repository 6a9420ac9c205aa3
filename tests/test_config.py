"""Bad configuration and pre-registration values: one clear line each, exit status non-zero."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import SHIPPED_EXP as EXP

from envab.config import ConfigError, load_config, selected_runs
from envab.preregistration import Preregistration

REPO = Path(__file__).resolve().parent.parent


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("env-ab:")]


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            lambda c: c["arms"]["drums"].update(mode="forkk"),
            "config: arms.drums.mode: 'forkk' is not one of ['fork', 'restore']",
        ),
        (lambda c: c.pop("split"), "config: (top level): 'split' is a required property"),
        (lambda c: c["split"].update(heldout_fraction=1.5), "config: split.heldout_fraction"),
        (
            lambda c: c["model"].update(source="hf://Qwen/Qwen3-VL-4B-Instruct@main"),
            "config: model.source",
        ),
        (lambda c: c.update(colour="blue"), "unknown key ('colour' was unexpected)"),
        (
            lambda c: c["arms"].pop("drums"),
            "config: arms: configured ['qemu'] but the pre-registration names ['drums', 'qemu']",
        ),
        (
            lambda c: c["tasks"]["factory"].pop("families"),
            "config: training.tools: click (click and done) cannot solve every family; set "
            "tasks.factory.families to ['click_button'] or training.tools to computer_13",
        ),
        (
            lambda c: c["training"].update(tools="mouse"),
            "config: training.tools: 'mouse' is not one of ['computer_13', 'click']",
        ),
    ],
)
def test_bad_config_value_is_one_clear_line(workflow, edit, expected):
    workflow.edit_config(edit)
    result = workflow.snakemake("-n")
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            lambda t: t["target"].update(threshold=-0.1),
            "target.threshold: -0.1 is less than the minimum of 0",
        ),
        (lambda t: t.pop("budget"), "'budget' is a required property"),
        (
            lambda t: t["evaluation"].update(backend="restore"),
            "evaluation.backend: 'restore' is not one of the arms",
        ),
        (  # a margin as wide as the gain cannot tell learning from not learning
            lambda t: t.update(equivalence={"reference_start": 0.625, "margin_fraction": 1}),
            "equivalence.margin_fraction: 1 is greater than or equal to the maximum of 1",
        ),
        (
            lambda t: t.update(
                target={**t["target"], "threshold": 0.7},
                equivalence={"reference_start": 0.8, "margin_fraction": 0.5},
            ),
            "equivalence.reference_start: 0.8 is not below the threshold 0.7",
        ),
        (
            lambda t: t["target"].update(crossing={"rule": "lower_bound", "checkpoints": 2}),
            "target.crossing: crossing rule 'lower_bound': unexpected keys ['checkpoints']",
        ),
    ],
)
def test_bad_preregistration_value_is_one_clear_line(workflow, edit, expected):
    workflow.edit_target(edit)
    result = workflow.snakemake("-n")
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert "target.yaml" in lines[0] and expected in lines[0]


def test_unknown_arm_or_seed_is_refused_with_the_valid_ones(workflow):
    result = workflow.snakemake("-n", "--config", "arm=restore")
    assert result.returncode != 0
    assert error_lines(result) == [
        "env-ab: arm='restore' is not a registered arm; valid arms: ['qemu', 'drums']"
    ]
    result = workflow.snakemake("-n", "--config", "seed=7")
    assert result.returncode != 0
    assert error_lines(result) == [
        "env-ab: seed=7 is not a registered training seed; valid seeds: [1, 2, 3, 4, 5]"
    ]


@pytest.fixture
def two_seeds(workflow):
    workflow.edit_target(lambda t: t.update(seeds=[1, 2]))
    return workflow


RUN = f"results/{EXP}/{{}}/seed{{}}/pins.json"


@pytest.mark.parametrize(
    "words, runs",
    [
        (["arm=drums", "seed=1"], {("drums", 1)}),  # the design card's command, as typed
        (["seed=1", "arm=drums"], {("drums", 1)}),
        (["arm=drums"], {("drums", 1), ("drums", 2)}),
        (["seed=2"], {("qemu", 2), ("drums", 2)}),
        (["--config", "arm=drums", "seed=1"], {("drums", 1)}),
        (["seed=2", "--config", "arm=qemu"], {("qemu", 2)}),
        ([], {("qemu", 1), ("qemu", 2), ("drums", 1), ("drums", 2)}),
    ],
)
def test_selection_restricts_the_dry_run_to_those_runs(two_seeds, words, runs):
    result = two_seeds.snakemake("-n", *words)
    assert result.returncode == 0, result.stderr[-3000:]
    planned = {
        (arm, seed)
        for arm in ("qemu", "drums")
        for seed in (1, 2)
        if RUN.format(arm, seed) in result.stdout
    }
    assert planned == runs


@pytest.mark.parametrize(
    "words, expected",
    [
        (
            ["arm=restore"],
            "env-ab: arm='restore' is not a registered arm; valid arms: ['qemu', 'drums']",
        ),
        (
            ["seed=7"],
            "env-ab: seed=7 is not a registered training seed; valid seeds: [1, 2, 3, 4, 5]",
        ),
        (
            ["arm=drums", "--config", "arm=qemu"],
            "env-ab: arm=drums disagrees with --config: arm: 'qemu'",
        ),
    ],
)
def test_a_selection_as_typed_is_checked_like_config(workflow, words, expected):
    result = workflow.snakemake("-n", *words)
    assert result.returncode != 0
    assert error_lines(result) == [expected]


def test_selected_runs_is_the_product_of_arms_and_seeds_filtered():
    prereg = Preregistration.load(REPO / "preregistration" / "target.yaml")
    two_seeds = dataclasses.replace(prereg, seeds=(1, 2))
    assert selected_runs({}, two_seeds) == [("qemu", 1), ("qemu", 2), ("drums", 1), ("drums", 2)]
    assert selected_runs({"arm": "drums"}, two_seeds) == [("drums", 1), ("drums", 2)]
    assert selected_runs({"seed": "2"}, two_seeds) == [("qemu", 2), ("drums", 2)]
    with pytest.raises(ConfigError, match="valid arms"):
        selected_runs({"arm": "restore"}, two_seeds)


def test_shipped_config_and_target_are_valid(monkeypatch):
    import yaml

    monkeypatch.chdir(REPO)  # the config names its pre-registration relative to the workflow
    prereg = load_config(yaml.safe_load((REPO / "config.yaml").read_text()))
    assert prereg == Preregistration.load(REPO / "preregistration" / "target.yaml")
    assert prereg.evaluation.backend in prereg.arms


def test_the_schema_fills_the_pre_registrations_defaults(tmp_path):
    text = (REPO / "preregistration" / "target.yaml").read_text()
    for line in ("  max_invalid_retries: 3\n", "  bootstrap_samples: 2000\n"):
        assert line in text
        text = text.replace(line, "")
    (tmp_path / "target.yaml").write_text(text)
    prereg = Preregistration.load(tmp_path / "target.yaml")
    assert prereg.evaluation.max_invalid_retries == 3  # written once, in the schema
    assert prereg.coincidence.bootstrap_samples == 2000
