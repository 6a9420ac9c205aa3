"""JSON-schema checks at the edge: a problem becomes one line naming the file, the key and what is
wrong, e.g. ``config.yaml: arms.drums.mode: 'forkk' is not one of ['fork', 'restore']``; defaults
are filled from the schema, the one place they are written."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import yaml

from envab.errors import Refusal

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
CONFIG_SCHEMA = SCHEMAS / "config.schema.yaml"
TARGET_SCHEMA = SCHEMAS / "target.schema.yaml"


class ConfigError(Refusal, ValueError):
    """A configuration or pre-registration problem, already phrased as one line."""


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def _one_line(source: str, error: jsonschema.ValidationError) -> str:
    if error.validator == "oneOf" and isinstance(error.instance, dict):
        options = " or ".join(
            "/".join(sub.get("required", [])) for sub in error.schema.get("oneOf", [])
        )
        return f"{source}: {_where(error)}: give exactly one of {options}"
    message = error.message
    if error.validator == "additionalProperties":
        message = message.replace("Additional properties are not allowed", "unknown key")
    return f"{source}: {_where(error)}: {message}"


def load_schema(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def filling_defaults(validator_class):
    """The validator class, extended to fill each missing property's default (jsonschema's
    documented recipe; Snakemake's `validate(set_default=True)` does the same)."""
    check_properties = validator_class.VALIDATORS["properties"]

    def properties(validator, props, instance, schema):
        if isinstance(instance, dict):
            for name, sub in props.items():
                if "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from check_properties(validator, props, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": properties})


def check_schema(data, schema_path: Path, source: str, *, fill_defaults: bool = False) -> None:
    """Raise ConfigError with one line for the most relevant schema violation, if any; with
    `fill_defaults`, `data` gains the schema's defaults in place."""
    schema = load_schema(schema_path)
    validator_class = jsonschema.validators.validator_for(schema)
    if fill_defaults:
        validator_class = filling_defaults(validator_class)
    error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(data))
    if error is not None:
        raise ConfigError(_one_line(source, error))


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data
