"""The pre-registration: a typed, frozen object built once from the validated target.yaml; freezing
it, and the check every later job makes against it.

`Preregistration.load` checks target.yaml against schemas/target.schema.yaml, fills the schema's
defaults (the one place they are written) and cross-checks what a schema cannot say; every stage
reads the typed object, never the raw file. Freezing records target.yaml's sha256 in
receipts/<experiment>/preregistration.json, and on an experiment's first freeze in its anchor
(anchors/<experiment>.json beside target.yaml, committed; envab/anchor.py). Once that receipt
exists the file is never re-frozen: an edited target.yaml is refused, a freeze redone after the
receipt was deleted must match the anchor, and the only way to register a changed experiment is a
new experiment_id (a new receipts folder and anchor).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from envab import anchor
from envab.hashing import sha256_file
from envab.receipts import (
    Receipts,
    read_receipt,
    receipt_dir,
    repo_commit,
    subject,
    utc_now,
    write_receipt,
)
from envab.run_receipts import RUN_RECEIPTS
from envab.schema import TARGET_SCHEMA, ConfigError, check_schema, load_schema, load_yaml

RECEIPT = "preregistration.json"

# Crossing rules (analysis/crossing.py applies them; which one holds is pre-registered).
KINDS = ("lower_bound", "consecutive", "first_crossing")
RULE_KEYS = {"confidence": "confidence", "checkpoints": "consecutive"}  # target.yaml -> field


@dataclass(frozen=True)
class CrossingRule:
    """A pre-registered crossing rule.

    kind: "lower_bound" | "consecutive" | "first_crossing" (the old rule; noise-prone, kept only
    for comparison). confidence: the one-sided level of the Wilson lower bound (lower_bound only).
    consecutive: how many consecutive scored checkpoints must all be at or above the threshold
    (consecutive only). Fields that a kind does not use keep their defaults and are ignored.
    These two defaults are the only ones not in the schema: filled there, they would be written
    into target.crossing, which the outcome and confirmation record as target.yaml gives it.
    """

    kind: str
    confidence: float = 0.95
    consecutive: int = 2

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"crossing rule {self.kind!r}: expected one of {', '.join(KINDS)}")
        if not 0.5 < self.confidence < 1:
            # one-sided level c is the two-sided 2c-1 interval, which needs c in (0.5, 1)
            raise ValueError(f"confidence {self.confidence}: must lie in (0.5, 1)")
        if (
            isinstance(self.consecutive, bool)
            or not isinstance(self.consecutive, int)
            or self.consecutive < 1
        ):
            raise ValueError(f"consecutive {self.consecutive!r}: must be an integer >= 1")

    @classmethod
    def from_dict(cls, section: Mapping | CrossingRule) -> CrossingRule:
        """From the target.yaml section: {"rule": "lower_bound", "confidence": 0.95},
        {"rule": "consecutive", "checkpoints": 2} or {"rule": "first_crossing"}. A key the rule does
        not use is refused: a pre-registration should say exactly what it means."""
        if isinstance(section, CrossingRule):
            return section
        section = dict(section)
        kind = section.pop("rule", None)
        allowed = {"lower_bound": {"confidence"}, "consecutive": {"checkpoints"}}.get(kind, set())
        extra = set(section) - allowed
        if kind in KINDS and extra:
            raise ValueError(f"crossing rule {kind!r}: unexpected keys {sorted(extra)}")
        given = {field: section[key] for key, field in RULE_KEYS.items() if key in section}
        return cls(kind=kind, **given)

    def to_dict(self) -> dict:
        """The inverse of from_dict, for the outcome record."""
        if self.kind == "lower_bound":
            return {"rule": self.kind, "confidence": self.confidence}
        if self.kind == "consecutive":
            return {"rule": self.kind, "checkpoints": self.consecutive}
        return {"rule": self.kind}


@dataclass(frozen=True)
class Goal:
    """What counts as reaching the target: a held-out metric at or above a threshold, accepted
    by the pre-registered crossing rule."""

    metric: str
    threshold: float
    crossing: dict  # the target.yaml section; CrossingRule.from_dict reads it


@dataclass(frozen=True)
class EvaluationProtocol:
    """How every checkpoint of every arm is evaluated on the held-out tasks."""

    episodes_per_task: int
    seeds: tuple[int, ...]
    max_steps: int
    backend: str  # the arm whose environment runs every evaluation
    checkpoint_interval: int  # valid trajectories between checkpoints
    max_invalid_retries: int
    temperature: float  # 0: greedy


@dataclass(frozen=True)
class Budget:
    max_wall_clock_s: float
    max_valid_trajectories: int
    # An A/B run stops once the crossing rule and the confirmation have decided its fate
    # (analysis/stop_at_target.py); a control's budget never stops at target (budget_for).
    stop_at_target: bool = False


@dataclass(frozen=True)
class Prices:
    host_usd_per_hour: dict[str, float]  # per arm
    inference_usd_per_hour: float
    controls: dict[str, str] = field(default_factory=dict)  # a control's runs' name -> its arm

    def host(self, arm: str) -> float:
        """The host price of an arm; a control runs at its base arm's."""
        return self.host_usd_per_hour[self.controls.get(arm, arm)]


@dataclass(frozen=True)
class Coincidence:
    margin: float
    bootstrap_samples: int
    confidence: float


@dataclass(frozen=True)
class Equivalence:
    reference_start: float
    margin_fraction: float
    confidence: float
    bootstrap_samples: int
    convergence_band: float

    def margin(self, threshold: float) -> float:
        return self.margin_fraction * (threshold - self.reference_start)


@dataclass(frozen=True)
class ConfirmationProtocol:
    """The confirmatory evaluation of an accepted crossing (analysis/confirm.py)."""

    delta: float
    alpha: float
    power: float
    first_seed: int
    null_at: str = "threshold_minus_delta"  # or "threshold" (analysis/crossing.py)


@dataclass(frozen=True)
class PrimaryEndpoint:
    """The one comparison the outcome leads with (analysis/outcome.py); every other p-value is
    secondary, Holm-adjusted over its family."""

    endpoint: str  # paired_time_ratio | logrank | seconds_per_valid_trajectory
    alpha: float
    # seconds_per_valid_trajectory: the ratio (candidate / baseline) below which a speed-up
    # matters (a handicap control is sized to it); None for the time-to-target endpoints
    smallest_effect: float | None = None


@dataclass(frozen=True)
class ReplayRule:
    """The cross-arm trace replay of every A/B run (eval/replay.py, analysis/trace_replay.py):
    `sample` logged attempts per run, drawn from `seed`, played again on every A/B arm."""

    sample: int
    seed: int


@dataclass(frozen=True)
class TimingRule:
    """How speed is measured (analysis/blocks.py, trainer/timing.py): blocks in which every arm
    replays the same training seed for the same window of valid trajectories back to back, in an
    order drawn from `order_seed` (ABBA at least), so that load that lasts minutes lands on
    both arms of a block. A block is run again (up to `max_reruns` times; every execution is
    reported) where a window's outside demand (CPU time the machine's other threads ran, and the
    CPU-bound ones waited for, a share of the machine's that passes 1 where more wanted a CPU than
    it has: envab/machine_load.py) passed `max_outside_load` or its steal passed `max_steal`, or
    where its arms' outside demands differ by more than `max_load_difference`: steady load beside
    both arms is a condition the block measures under, load that came and went between them is
    not. A demand bound of None judges nothing (demand is shown only): a machine shared on
    purpose, such as the tests'."""

    blocks: int
    order_seed: int
    window_valid_trajectories: int
    max_outside_load: float | None
    max_load_difference: float | None
    max_steal: float
    max_reruns: int
    # how a timed A/A is judged: its interval covers 1, or lies inside the smallest effect of
    # interest both ways (an equivalence test); the schema's default is v12's rule
    aa_rule: str
    # a timed handicap's own run's added wall-clock: judged within tolerance, or shown (the
    # blocks alone judge its speed)
    handicap_run_time: str
    # the registered controls' runs (<arm>-<name>) timed in every block beside the arms, each
    # judged by the primary endpoint against its base arm (analysis/speed.py)
    controls: tuple[str, ...] = ()

    def judges_run_time(self, control: Control) -> bool:
        """Whether a handicap's own run's added wall-clock is judged (not only shown)."""
        return self.handicap_run_time == "judged" or control.run_arm not in self.controls


#: What each control's `expect` needs of its settings (envs/controls.py).
CONTROL_CHANGE = {
    "same": set(),
    "slower": {"reset_delay_s"},
    "differ": {"flip_rewards"},
    "eval_differs": {"flip_eval"},
}
#: The changes that act on training; the others act on the held-out evaluation of the control's
#: checkpoints alone (the eval rule's backend), so its training is its base arm's.
TRAINING_CHANGE = {"reset_delay_s", "flip_rewards"}
#: A control's settings that target.yaml may leave out, as the schema writes them.
CONTROL_DEFAULTS = {
    key: spec["default"]
    for key, spec in load_schema(TARGET_SCHEMA)["properties"]["controls"]["items"][
        "properties"
    ].items()
    if "default" in spec
}


@dataclass(frozen=True)
class Control:
    """A built-in control: `arm` run again as `<arm>-<name>` with one known change, judged
    against the registered `expect` (analysis/controls.py)."""

    name: str
    arm: str
    expect: str  # same | slower | differ | eval_differs
    reset_delay_s: float = 0.0  # none: this control changes no reset
    flip_rewards: float = 0.0  # none: this control flips no reward
    flip_eval: float = 0.0  # none: this control flips no held-out episode's score
    seed: int = CONTROL_DEFAULTS["seed"]
    tolerance: float = CONTROL_DEFAULTS["tolerance"]
    base_wall_clock_s: float | None = None  # a pilot's measure (slower only): check_budget_fit
    max_valid_trajectories: int | None = None  # its own trajectory budget; None: the A/B's

    @property
    def run_arm(self) -> str:
        """The name its runs go under."""
        return f"{self.arm}-{self.name}"

    def arm_config(self, base: Mapping) -> dict:
        """The base arm's config with this control's change to training (none for an A/A or
        an evaluation corruption)."""
        change = {k: getattr(self, k) for k in CONTROL_CHANGE[self.expect] & TRAINING_CHANGE}
        if change:
            change["seed"] = self.seed
        return {**base, "control": change} if change else dict(base)

    def eval_config(self, evaluation: Mapping) -> dict:
        """The evaluation arm's config as this control's checkpoints are evaluated: an
        evaluation corruption flips `flip_eval` of the valid held-out scores there
        (envs/controls.py's flip, drawn from `seed`); every other control is evaluated as its
        base arm is."""
        if not self.flip_eval:
            return dict(evaluation)
        return {**evaluation, "control": {"flip_rewards": self.flip_eval, "seed": self.seed}}


@dataclass(frozen=True)
class Preregistration:
    """preregistration/target.yaml, validated against its schema with the schema's defaults
    filled: what every stage reads, never the raw file."""

    experiment_id: str
    question: str
    target: Goal
    evaluation: EvaluationProtocol
    budget: Budget
    prices: Prices
    arms: tuple[str, ...]  # the first is the baseline of the coincidence check
    seeds: tuple[int, ...]
    coincidence: Coincidence
    equivalence: Equivalence | None  # None: registered before the equivalence test existed
    controls: tuple[Control, ...] = ()
    confirmation: ConfirmationProtocol | None = None
    primary: PrimaryEndpoint = PrimaryEndpoint("paired_time_ratio", 0.05)
    # expected | not_expected: which rules judge the controls when no A/A observes it
    # (analysis/controls.py)
    determinism: str = "expected"
    control_seeds: tuple[int, ...] | None = None  # None: every seed
    timing: TimingRule | None = None  # None: speed is read from the A/B runs' own clocks
    replay: ReplayRule | None = None  # None: no cross-arm trace replay (up to v15)

    @property
    def threshold(self) -> float:
        return self.target.threshold

    @classmethod
    def load(cls, path: str | Path) -> Preregistration:
        data = load_yaml(path)
        check_schema(data, TARGET_SCHEMA, str(path), fill_defaults=True)
        e, p = data["evaluation"], data["prices"]
        controls = tuple(Control(**c) for c in data.get("controls", ()))
        prereg = cls(
            experiment_id=data["experiment_id"],
            question=" ".join(data["question"].split()),
            target=Goal(
                data["target"]["metric"],
                float(data["target"]["threshold"]),
                data["target"]["crossing"],
            ),
            evaluation=EvaluationProtocol(
                episodes_per_task=e["episodes_per_task"],
                seeds=tuple(e["seeds"]),
                max_steps=e["max_steps"],
                backend=e["backend"],
                checkpoint_interval=e["checkpoint_interval"],
                max_invalid_retries=e["max_invalid_retries"],
                temperature=float(e["temperature"]),
            ),
            budget=Budget(**data["budget"]),
            prices=Prices(
                {arm: float(v) for arm, v in p["host_usd_per_hour"].items()},
                float(p["inference_usd_per_hour"]),
                {c.run_arm: c.arm for c in controls},
            ),
            arms=tuple(data["arms"]),
            seeds=tuple(data["seeds"]),
            coincidence=Coincidence(**data["coincidence"]),
            equivalence=Equivalence(**data["equivalence"]) if "equivalence" in data else None,
            controls=controls,
            confirmation=(
                ConfirmationProtocol(**data["confirmation"]) if "confirmation" in data else None
            ),
            primary=PrimaryEndpoint(**data["primary_endpoint"]),
            determinism=data["determinism"],
            control_seeds=tuple(data["control_seeds"]) if "control_seeds" in data else None,
            timing=(
                TimingRule(**{**data["timing"], "controls": tuple(data["timing"]["controls"])})
                if "timing" in data
                else None
            ),
            replay=ReplayRule(**data["replay"]) if "replay" in data else None,
        )
        prereg._cross_check(path)
        prereg._check_controls(path)
        prereg._check_confirmation(path)
        return prereg

    def _cross_check(self, path) -> None:
        """What the schema cannot say: the evaluation backend is an arm, every arm has a price."""
        if self.evaluation.backend not in self.arms:
            raise ConfigError(
                f"{path}: evaluation.backend: {self.evaluation.backend!r} is not one of the arms "
                f"{list(self.arms)}"
            )
        missing = [a for a in self.arms if a not in self.prices.host_usd_per_hour]
        if missing:
            raise ConfigError(f"{path}: prices.host_usd_per_hour: no price for arm(s) {missing}")
        try:
            CrossingRule.from_dict(self.target.crossing)
        except ValueError as e:
            raise ConfigError(f"{path}: target.crossing: {e}") from None
        # The schema keeps margin_fraction below 1, so the margin is narrower than the gain the
        # target asks for, provided the target asks for a gain at all.
        if (self.primary.endpoint == "seconds_per_valid_trajectory") != (self.timing is not None):
            raise ConfigError(
                f"{path}: primary_endpoint: seconds_per_valid_trajectory is measured in the "
                "registered timing blocks: register both, or neither"
            )
        if self.timing and self.primary.smallest_effect is None:
            raise ConfigError(
                f"{path}: primary_endpoint.smallest_effect: the speed endpoint needs the smallest "
                "ratio that matters (a handicap control is sized to it)"
            )
        if self.equivalence and self.equivalence.reference_start >= self.threshold:
            raise ConfigError(
                f"{path}: equivalence.reference_start: {self.equivalence.reference_start} is not "
                f"below the threshold {self.threshold}: the target asks for no gain, so no margin "
                "can tell a run that learned from one that did not"
            )

    def _check_confirmation(self, path) -> None:
        c = self.confirmation
        if c is None:
            return
        if c.first_seed <= max(self.evaluation.seeds):
            raise ConfigError(
                f"{path}: confirmation.first_seed: {c.first_seed} is not above every evaluation "
                f"seed {list(self.evaluation.seeds)}: a confirmation needs fresh seeds"
            )
        if self.threshold <= c.delta:
            raise ConfigError(f"{path}: confirmation.delta: {c.delta} leaves no rate to rule out")

    def _check_controls(self, path) -> None:
        runs_as = [c.run_arm for c in self.controls]
        for control in self.controls:
            where = f"{path}: controls: {control.name}"
            if runs_as.count(control.run_arm) > 1:
                raise ConfigError(f"{where}: two controls run as {control.run_arm!r}")
            if control.arm not in self.arms:
                raise ConfigError(f"{where}: arm {control.arm!r} is not one of {list(self.arms)}")
            if control.run_arm in self.arms:
                raise ConfigError(f"{where}: its runs' name {control.run_arm!r} is an arm's")
            own = control.max_valid_trajectories
            if own is not None:
                interval = self.evaluation.checkpoint_interval
                if own > self.budget.max_valid_trajectories or own % interval:
                    raise ConfigError(
                        f"{where}: max_valid_trajectories {own} must be a multiple of "
                        f"evaluation.checkpoint_interval ({interval}) no larger than "
                        f"budget.max_valid_trajectories ({self.budget.max_valid_trajectories}): "
                        "a control is compared with its base run at checkpoints both have"
                    )
            needed = CONTROL_CHANGE[control.expect]
            given = {
                k for k in ("reset_delay_s", "flip_rewards", "flip_eval") if getattr(control, k)
            }
            if given != needed:
                raise ConfigError(
                    f"{where}: expect {control.expect} takes "
                    f"{' and '.join(sorted(needed)) or 'no change'}, got "
                    f"{' and '.join(sorted(given)) or 'none'}"
                )
        strays = sorted(set(self.control_seeds or ()) - set(self.seeds))
        if strays:
            raise ConfigError(
                f"{path}: control_seeds: {strays} not among the seeds {list(self.seeds)}: a "
                "control is compared with its base arm's run on the same seed"
            )
        if self.controls and not self.equivalence:
            raise ConfigError(f"{path}: controls are judged by the equivalence test: register one")
        for name in self.timing.controls if self.timing else ():
            control = next((c for c in self.controls if c.run_arm == name), None)
            if control is None:
                raise ConfigError(
                    f"{path}: timing.controls: {name!r} is not a registered control's runs "
                    f"(<arm>-<name>: {runs_as})"
                )
            if control.expect not in ("same", "slower"):
                raise ConfigError(
                    f"{path}: timing.controls: {name!r} expects {control.expect}: the blocks "
                    "judge speed, so only an A/A (same) or a handicap (slower) is timed"
                )

    @property
    def timed_controls(self) -> tuple[Control, ...]:
        """The controls timed in every block beside the arms (timing.controls)."""
        names = self.timing.controls if self.timing else ()
        return tuple(c for c in self.controls if c.run_arm in names)

    @property
    def timed_arms(self) -> tuple[str, ...]:
        """Every window of a timing block: the arms, then the timed controls' runs."""
        return self.arms + tuple(c.run_arm for c in self.timed_controls)

    def check_budget_fit(self, setups_per_valid: Mapping[str, float]) -> None:
        """Refuse a handicap control whose registered delay cannot fit the wall-clock budget.

        `setups_per_valid`: per arm, the fewest environment set-ups a valid trajectory costs
        (1 / num_generations where the arm forks a group from one set-up, 1 where every attempt
        is set up), so the added time below is a lower bound. The handicapped run must reach
        its own last checkpoint (budget_for: its own trajectory budget) within max_wall_clock_s,
        with the added time up to `tolerance` above the prediction:
        base_wall_clock_s + (1 + tolerance) x reset_delay_s x set-ups <= max_wall_clock_s. The
        base arm's time is known at freeze only from a pilot (`base_wall_clock_s`); without it
        only the added time is checked (it alone must fit)."""
        for control in self.controls:
            if control.expect != "slower":
                continue
            per_valid = setups_per_valid.get(control.arm)
            if per_valid is None:
                raise ConfigError(f"controls: {control.name}: no set-up count for {control.arm}")
            valid = self.budget_for(control.run_arm).max_valid_trajectories
            setups = valid * per_valid
            added = control.reset_delay_s * setups
            worst = (1 + control.tolerance) * added
            base = control.base_wall_clock_s or 0.0
            if base + worst > self.budget.max_wall_clock_s:
                total = (
                    f"{base:g} s (the base arm's pilot) + {worst:g} s = {base + worst:g} s"
                    if control.base_wall_clock_s
                    else f"{worst:g} s"
                )
                raise ConfigError(
                    f"controls: {control.name}: {control.reset_delay_s:g} s x {setups:g} set-ups "
                    f"({valid} valid trajectories x {per_valid:g}) = {added:g} s added, "
                    f"{worst:g} s at its tolerance {control.tolerance:g}; {total} exceeds the "
                    f"wall-clock budget of {self.budget.max_wall_clock_s:g} s: the handicapped "
                    "run could run out of budget before the checkpoint it is judged at. Register "
                    "a smaller reset_delay_s or a larger budget."
                )

    def timing_window(self, valid: int) -> Preregistration:
        """The registration as a timing block's window runs it (trainer/timing.py): every run,
        a timed control's too (whose own trajectory budget would otherwise hold), trains `valid`
        valid trajectories and never stops at target, so every window of a block does the same
        amount of work."""
        window = replace(self.budget, max_valid_trajectories=valid, stop_at_target=False)
        controls = tuple(replace(c, max_valid_trajectories=None) for c in self.controls)
        return replace(self, budget=window, controls=controls)

    def budget_for(self, run_arm: str) -> Budget:
        """The budget a run under `run_arm` trains to: the A/B's, with a control's own
        max_valid_trajectories where it registers one."""
        for control in self.controls:
            if control.run_arm == run_arm:
                own = control.max_valid_trajectories or self.budget.max_valid_trajectories
                return replace(self.budget, max_valid_trajectories=own, stop_at_target=False)
        return self.budget

    def seeds_of_controls(self) -> tuple[int, ...]:
        """The training seeds the controls run on: control_seeds, or every seed."""
        return self.control_seeds or self.seeds

    def as_dict(self) -> dict:
        """A plain copy (for the report's workflow description)."""
        return asdict(self)


class FrozenTargetEdited(ConfigError):
    """target.yaml no longer matches the digest it was frozen with."""


def receipt_path(prereg: Preregistration, root: str | Path = ".") -> Path:
    return receipt_dir(prereg.experiment_id, root) / RECEIPT


def _edited_message(path: Path, prereg: Preregistration, frozen: str, now: str) -> str:
    return (
        f"{path} was edited after experiment '{prereg.experiment_id}' was frozen "
        f"(frozen sha256 {frozen[:12]}…, now {now[:12]}…). A frozen pre-registration is never "
        f"re-frozen or silently retrained: restore the frozen file, or register a new experiment "
        f"by giving it a new experiment_id."
    )


def check_frozen(target_path: str | Path, receipt: str | Path | None = None) -> Preregistration:
    """The frozen pre-registration, or ConfigError if it is not frozen yet or edited since.
    `receipt` is its freeze receipt (default: receipts/<experiment_id>/preregistration.json)."""
    target_path = Path(target_path)
    prereg = Preregistration.load(target_path)
    receipt = Path(receipt) if receipt else receipt_path(prereg)
    if not receipt.is_file():
        raise ConfigError(
            f"experiment '{prereg.experiment_id}' is not frozen yet ({receipt} missing): "
            f"run `snakemake --cores 1 freeze` first"
        )
    try:
        frozen = read_receipt(receipt)["subject"][0]["digest"]["sha256"]
    except (ValueError, KeyError, IndexError, TypeError) as e:  # not JSON, or not a receipt's
        raise ConfigError(
            f"MALFORMED {receipt}: the freeze receipt cannot be read ({type(e).__name__}); "
            "it was edited or damaged: restore it, or check it with `snakemake --cores 1 verify`"
        ) from None
    now = sha256_file(target_path)
    if now != frozen:
        raise FrozenTargetEdited(_edited_message(target_path, prereg, frozen, now))
    # A receipt deleted and frozen again from another target agrees with that target, not with
    # the committed anchor of the first freeze.
    anchor.check_receipt(target_path, prereg.experiment_id, frozen)
    return prereg


def add_frozen_arguments(parser: argparse.ArgumentParser) -> None:
    """`--target` and `--receipts`: what every job after the freeze is given."""
    parser.add_argument("--target", required=True, help="the frozen preregistration/target.yaml")
    parser.add_argument(
        "--receipts", nargs="+", required=True, help="the receipts this job builds on"
    )


def frozen_inputs(args: argparse.Namespace) -> tuple[Preregistration, Receipts]:
    """The frozen pre-registration (checked against its receipt among `--receipts`) and the
    receipts a job was given."""
    receipts = Receipts(args.receipts)
    return check_frozen(args.target, receipts[RECEIPT]), receipts


def frozen_utc(receipt: str | Path) -> str:
    """When the pre-registration was frozen, from its receipt."""
    return read_receipt(receipt)["predicate"]["frozen_utc"]


def freeze(target_path: str | Path, receipt: str | Path | None = None) -> Path:
    """Freeze target.yaml once; a repeat with the same bytes is a no-op, an edit is refused."""
    target_path = Path(target_path)
    prereg = Preregistration.load(target_path)
    receipt = Path(receipt) if receipt else receipt_path(prereg)
    if receipt.is_file():
        check_frozen(target_path, receipt)
        return receipt
    # Before anything is written: a target that contradicts the experiment's committed anchor is
    # refused; the experiment's first freeze writes the anchor.
    anchored, first = anchor.check_or_anchor(target_path, prereg.experiment_id)
    write_receipt(
        receipt,
        "preregistration",
        subjects=[subject(target_path)],
        predicate={
            "experiment_id": prereg.experiment_id,
            "frozen_utc": utc_now(),
            "source": repo_commit(Path(target_path).parent),
            "target": asdict(prereg.target),
            "anchor": anchored.as_posix(),
            # The experiment's first freeze: its code pins (the code receipt) are the registered
            # code, written into the anchor too (envab/anchor.py: register_code).
            "first_freeze": first,
            # What every run of this experiment must leave in receipts/<exp>/ (envab/verify.py
            # says MISSING for each one absent); an experiment frozen before this field existed
            # requires none.
            "run_receipts": list(RUN_RECEIPTS),
        },
    )
    return receipt
