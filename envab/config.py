"""The pipeline configuration (config.yaml), validated once at the edge: the schema, then the
cross-checks a schema cannot express (its arms agree with the pre-registration, its tool set can
solve its task families), then which (arm, seed) runs this invocation selects."""

from __future__ import annotations

from envab.preregistration import Preregistration
from envab.schema import CONFIG_SCHEMA, ConfigError, check_schema

# Task families whose oracle is clicks only, so the `click` tool set (trainer/agent.py) covers them.
CLICK_FAMILIES = {"click_button"}


def load_config(config: dict, source: str = "config.yaml") -> Preregistration:
    """Validate `config` once: against the schema, whose defaults it gains in place, then the
    pre-registration it names is loaded and the two are cross-checked; returns that
    pre-registration."""
    check_schema(config, CONFIG_SCHEMA, source, fill_defaults=True)
    prereg = Preregistration.load(config["preregistration"])
    check_config(config, prereg, source)
    return prereg


def check_config(config: dict, prereg: Preregistration, source: str = "config.yaml") -> None:
    """The cross-checks a schema cannot express (arms agree with the target), on a config that
    passed the schema."""
    configured, registered = set(config["arms"]), set(prereg.arms)
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
    tasks = config["tasks"]
    has_demos = "factory" in tasks or "solutions" in tasks.get("osworld", {})
    if config["training"]["sft"]["enabled"] and not has_demos:
        raise ConfigError(
            f"{source}: training.sft.enabled: the warm start plays oracle demonstrations, and "
            "this task source has none; name them (tasks.osworld.solutions) or set "
            "training.sft.enabled: false to start GRPO from the pinned model"
        )


SELECTION_KEYS = ("arm", "seed")


def selection_words(targets) -> dict:
    """The arm= and seed= words among Snakemake's targets (`snakemake --cores all arm=drums
    seed=1`, the design card's command), as the config entries they stand for."""
    words = {}
    for target in targets:
        key, equals, value = target.partition("=")
        if equals and key in SELECTION_KEYS:
            words[key] = int(value) if key == "seed" and value.lstrip("-").isdigit() else value
    return words


def selection_name(config: dict) -> str | None:
    """The name a selection's answer is written under (`arm-drums_seed-1`), so that a one-arm or
    one-seed run never replaces the registration's answer; None where every run is selected."""
    parts = [f"{key}-{config[key]}" for key in SELECTION_KEYS if config.get(key) is not None]
    return "_".join(parts) or None


def select(config: dict, words: dict, source: str = "config") -> None:
    """Put the selection typed as targets into config, where every job reads it (a job that a
    cluster executor spawns re-parses the workflow without the targets). A word that disagrees
    with --config is refused rather than one of them silently winning."""
    for key, value in words.items():
        given = config.get(key)
        if given is not None and str(given) != str(value):
            raise ConfigError(f"{key}={value} disagrees with {source}: {key}: {given!r}")
        config[key] = value


def selected_runs(config: dict, prereg: Preregistration) -> list[tuple[str, int]]:
    """The (arm, seed) pairs this invocation runs: all registered ones, or the one asked for."""
    arm, seed = config.get("arm"), config.get("seed")
    if arm is not None and arm not in prereg.arms:
        raise ConfigError(f"arm={arm!r} is not a registered arm; valid arms: {list(prereg.arms)}")
    if seed is not None:
        if isinstance(seed, str) and seed.lstrip("-").isdigit():
            seed = int(seed)
        if seed not in prereg.seeds:
            raise ConfigError(
                f"seed={seed!r} is not a registered training seed; "
                f"valid seeds: {list(prereg.seeds)}"
            )
    return [
        (a, s)
        for a in prereg.arms
        for s in prereg.seeds
        if (arm is None or a == arm) and (seed is None or s == seed)
    ]
