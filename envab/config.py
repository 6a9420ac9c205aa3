"""The configuration and the pre-registration, validated once at the edge and passed down typed.

Both files are checked against their JSON schemas (schemas/); a problem becomes one line naming the
file, the key and what is wrong, e.g.
``config.yaml: arms.drums.mode: 'forkk' is not one of ['fork', 'restore']``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
CONFIG_SCHEMA = SCHEMAS / "config.schema.yaml"
TARGET_SCHEMA = SCHEMAS / "target.schema.yaml"


class ConfigError(ValueError):
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


def _load_schema(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def check_schema(data, schema_path: Path, source: str) -> None:
    """Raise ConfigError with one line for the most relevant schema violation, if any."""
    validator_cls = jsonschema.validators.validator_for(_load_schema(schema_path))
    validator = validator_cls(_load_schema(schema_path))
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
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


@dataclass(frozen=True)
class Target:
    """The pre-registration, as frozen."""

    experiment_id: str
    threshold: float
    arms: tuple[str, ...]
    seeds: tuple[int, ...]
    evaluation_backend: str
    raw: dict

    @classmethod
    def load(cls, path: str | Path) -> Target:
        data = load_yaml(path)
        check_schema(data, TARGET_SCHEMA, str(path))
        arms = tuple(data["arms"])
        problems = []
        if data["evaluation"]["backend"] not in arms:
            problems.append(
                f"evaluation.backend: {data['evaluation']['backend']!r} is not one of the arms "
                f"{list(arms)}"
            )
        missing_prices = [a for a in arms if a not in data["prices"]["host_usd_per_hour"]]
        if missing_prices:
            problems.append(f"prices.host_usd_per_hour: no price for arm(s) {missing_prices}")
        if problems:
            raise ConfigError(f"{path}: {problems[0]}")
        return cls(
            experiment_id=data["experiment_id"],
            threshold=float(data["target"]["threshold"]),
            arms=arms,
            seeds=tuple(data["seeds"]),
            evaluation_backend=data["evaluation"]["backend"],
            raw=data,
        )


# Task families whose oracle is clicks only, so the `click` tool set (trainer/agent.py) covers them.
CLICK_FAMILIES = {"click_button"}


def check_config(config: dict, target: Target, source: str = "config.yaml") -> None:
    """Schema plus the cross-checks a schema cannot express (arms agree with the target)."""
    check_schema(config, CONFIG_SCHEMA, source)
    configured, registered = set(config["arms"]), set(target.arms)
    if configured != registered:
        raise ConfigError(
            f"{source}: arms: configured {sorted(configured)} but the pre-registration names "
            f"{sorted(registered)}"
        )
    factory = config["tasks"].get("factory")
    if factory and config["training"].get("tools") == "click":
        families = set(factory.get("families") or ["every family"])
        if families - CLICK_FAMILIES:
            raise ConfigError(
                f"{source}: training.tools: click (click and done) cannot solve "
                f"{', '.join(sorted(families - CLICK_FAMILIES))}; set tasks.factory.families to "
                f"{sorted(CLICK_FAMILIES)} or training.tools to computer_13"
            )


def selected_runs(config: dict, target: Target) -> list[tuple[str, int]]:
    """The (arm, seed) pairs this invocation runs: all registered ones, or the one asked for."""
    arm, seed = config.get("arm"), config.get("seed")
    if arm is not None and arm not in target.arms:
        raise ConfigError(f"arm={arm!r} is not a registered arm; valid arms: {list(target.arms)}")
    if seed is not None:
        if isinstance(seed, str) and seed.lstrip("-").isdigit():
            seed = int(seed)
        if seed not in target.seeds:
            raise ConfigError(
                f"seed={seed!r} is not a registered training seed; "
                f"valid seeds: {list(target.seeds)}"
            )
    return [
        (a, s)
        for a in target.arms
        for s in target.seeds
        if (arm is None or a == arm) and (seed is None or s == seed)
    ]
