"""docs/reference/config.md, written from the config schema (schemas/config.schema.yaml).

    python -m envab.config_docs            # writes the page
    python -m envab.config_docs --check    # exit 1, naming the page, when it is not the schema's

The schema is the one place a key, its type, its default and what it means are written:
Snakemake's `validate()` checks the config against it and fills the defaults (rules/common.smk),
and this page is made from it, so the page cannot say what the schema does not. A key without a
description is refused here, naming the key. `tests/test_config_docs.py` runs the check in CI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from envab.errors import Refusal

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "schemas" / "config.schema.yaml"
PAGE = REPO / "docs" / "reference" / "config.md"

HEAD = """\
# Config keys

<!-- Written by `python -m envab.config_docs` from schemas/config.schema.yaml; do not edit by
hand: edit the schema's descriptions and run it again (tests/test_config_docs.py checks). -->

`config.yaml` says how to reach each arm and what to freeze; the experiment itself lives in the
[pre-registration](target.md). The source of truth is `schemas/config.schema.yaml`, from which
this page is written: it is the one place defaults are written, Snakemake's `validate()` checks
the config against it (`rules/common.smk`) and fills them in, and a bad value gets one line naming
the key, e.g.

    env-ab: config: arms.drums.mode: 'forkk' is not one of ['fork', 'restore']
"""

# What a table cannot hold: where to read on, after a section's table.
NOTES = {
    "model": """\
The builtin model is built deterministically offline; a hub model is fetched with
`huggingface_hub.snapshot_download`, honouring `HF_HUB_OFFLINE`. Either way every file must match
the manifest: a mismatched, missing or extra file refuses the run and names the file.
`python -m envab.trainer.model manifest <dir>` prints a folder's manifest.
""",
    "arms": """\
Each arm of `arms` is named as the pre-registration names it and has a `backend`
([which word means what](../concepts/session-protocol.md#arm-backend-host-world-sandbox-mode)):
`drums` takes the keys of a Drums arm, `qemu` those of a QEMU arm, below.
""",
    "training.compute": "[GPUs](../how-to/gpus.md#the-gpu-settings) shows them together.\n",
}
TAIL = """\
## Configs shipped

- `config.yaml`: the [embedded default](../concepts/embedded-default.md);
- `config/qwen3-vl-4b.yaml`: the GPU deployment ([GPUs](../how-to/gpus.md)), used with
  `--configfile`, which replaces `config.yaml` rather than merging into it;
- `.test/config.yaml`: the [small run](../how-to/small-run.md).
"""
# The arm definitions, each its own section (an arm's keys depend on its backend).
ARM_SECTIONS = (
    ("drums_arm", "A Drums arm (`backend: drums`)"),
    ("qemu_arm", "A QEMU arm (`backend: qemu`)"),
)


class Undescribed(Refusal):
    """A key of the schema without a description (its args[0]: every such key)."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _resolved(node: dict, defs: dict) -> dict:
    """`node`, or the definition its `$ref` names."""
    return defs.get(node["$ref"].split("/")[-1], {}) if "$ref" in node else node


def _kind(node: dict, defs: dict) -> str:
    """The key's type as the page shows it: its values where they are few, else its JSON type."""
    node = _resolved(node, defs)
    if "const" in node:
        return f"`{node['const']}`"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    kinds = node.get("type")
    if kinds is None and "oneOf" in node:
        kinds = [o.get("type", "?") for o in node["oneOf"]]
    kinds = kinds if isinstance(kinds, list) else [kinds or "any"]
    words = {"integer": "integer", "number": "number", "string": "text", "boolean": "true/false",
             "array": "list", "object": "mapping", "null": "null"}  # fmt: skip
    return " or ".join(words.get(k, str(k)) for k in kinds)


def _default(node: dict) -> str:
    if "default" not in node:
        return ""
    value = node["default"]
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


Row = tuple[str, str, str, str]  # key, type, default, description


def rows(node: dict, defs: dict, prefix: str, missing: list[str], deep: bool = True) -> list[Row]:
    """A row for every key under `node`, depth first (`deep`: into nested mappings written in
    place; a `$ref`'s definition is its own section); each key without a description is added to
    `missing` instead."""
    found = []
    for key, child in (node.get("properties") or {}).items():
        path = f"{prefix}{key}"
        resolved = _resolved(child, defs)
        description = child.get("description") or resolved.get("description")
        if not description:
            missing.append(path)
            continue
        found.append((path, _kind(child, defs), _default(child), _one_line(description)))
        if deep and "properties" in resolved and "$ref" not in child:
            found += rows(resolved, defs, f"{path}.", missing)
    return found


def _table(found: list[Row]) -> str:
    lines = ["| key | type | default | what it says |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | {d} | {w} |" for k, t, d, w in found]
    return "\n".join(lines) + "\n"


def _section(heading: str, node: dict, defs: dict, prefix: str, missing: list[str]) -> str:
    """A section whose mapping has its own description above its table."""
    if not node.get("description"):
        missing.append(prefix.rstrip("."))
    return f"\n{heading}\n\n{_one_line(node.get('description', ''))}\n\n" + _table(
        rows(node, defs, prefix, missing)
    )


# Top-level mappings whose nested mappings (training's compute, grpo, ...) are sections of their
# own rather than rows of one long table.
SPLIT = ("training",)


def page(schema: dict) -> str:
    """The whole page for `schema`; Undescribed naming every key without a description."""
    defs = schema.get("$defs", {})
    parts, missing = [HEAD], []
    top = schema["properties"]
    parts.append("\n## Top level\n\n" + _table(rows(schema, defs, "", missing, deep=False)))
    for key, node in top.items():
        if "properties" not in node:
            continue
        split = key in SPLIT
        parts.append(f"\n## {key}\n\n" + _table(rows(
            {"properties": {k: v for k, v in node["properties"].items()
                            if not (split and "properties" in v)}},
            defs, f"{key}.", missing)))  # fmt: skip
        if key in NOTES:
            parts.append("\n" + NOTES[key])
        for sub, child in node["properties"].items() if split else ():
            if "properties" in child:
                name = f"{key}.{sub}"
                parts.append(_section(f"### {name}", child, defs, f"{name}.", missing))
                if name in NOTES:
                    parts.append("\n" + NOTES[name])
    parts.append("\n## arms\n\n" + NOTES["arms"])
    for name, title in ARM_SECTIONS:
        undescribed: list[str] = []
        parts.append(_section(f"### {title}", defs[name], defs, "", undescribed))
        missing += [f"arms.<name>.{k}" for k in undescribed]
    if missing:
        raise Undescribed(missing)
    parts.append("\n" + TAIL)
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envab.config_docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    schema = yaml.safe_load(SCHEMA.read_text())
    try:
        text = page(schema)
    except Undescribed as e:
        print(f"error: {SCHEMA.name}: no description for {', '.join(e.args[0])}", file=sys.stderr)
        return 2
    if args.check:
        if PAGE.read_text() != text:
            print(f"{PAGE.relative_to(REPO)} is not the schema's: run python -m envab.config_docs",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
