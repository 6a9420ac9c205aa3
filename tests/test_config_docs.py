"""docs/reference/config.md is written from the config schema (envab/config_docs.py): the page
committed is the schema's, an edited description changes the page, and a key the schema does not
describe is refused by name."""

from __future__ import annotations

import copy

import pytest
import yaml

from envab import config_docs


def schema() -> dict:
    return yaml.safe_load(config_docs.SCHEMA.read_text())


def test_the_committed_page_is_the_schemas():
    assert config_docs.main(["--check"]) == 0, "run python -m envab.config_docs"
    assert config_docs.PAGE.read_text() == config_docs.page(schema())


def test_a_description_edited_in_the_schema_changes_the_page():
    edited = copy.deepcopy(schema())
    edited["$defs"]["qemu_arm"]["properties"]["vms"]["description"] = "VMs at the start"
    page = config_docs.page(edited)
    assert "| `vms` | integer | `1` | VMs at the start |" in page
    assert page != config_docs.PAGE.read_text()


@pytest.mark.parametrize(
    ("where", "named"),
    [
        (("properties", "split", "properties", "seed"), "split.seed"),
        (("$defs", "qemu_arm", "properties", "accel"), "arms.<name>.accel"),
        (
            ("properties", "training", "properties", "grpo", "properties", "beta"),
            "training.grpo.beta",
        ),
    ],
)
def test_a_key_without_a_description_is_refused_by_name(where, named):
    edited = copy.deepcopy(schema())
    node = edited
    for key in where:
        node = node[key]
    del node["description"]
    with pytest.raises(config_docs.Undescribed) as refused:
        config_docs.page(edited)
    assert refused.value.args[0] == [named]
