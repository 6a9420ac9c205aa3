"""Learning-curve equivalence, the margin rule and the x-axis convergence ratio, as pure functions.

Why this replaces the mean-difference coincidence check: a curve comparison has to look at every
matched checkpoint, not at the mean of their differences (curves that swap 0.5 and 0.9 have mean
difference 0), and its margin has to be narrower than the gain the target asks for (a margin as
wide as threshold - warm start cannot tell a run that learned from one that did not).

`curve_equivalence` compares the arms' held-out success at every matched checkpoint with a
simultaneous bootstrap band and two one-sided questions against the margin m (TOST-like):

- ``equivalent``: the band lies inside [-m, m] at every checkpoint;
- ``differ``: the band excludes 0 at some checkpoint — the environment changed what is learned,
  a correctness finding that outranks any speed result;
- ``inconclusive``: neither — too few seeds, tasks or episodes to tell at this margin. Said as
  such, never rounded to either side.

`convergence_ratio` is the x-axis check (MLPerf's reference-convergence idea): the candidate's
valid trajectories to target over the baseline's must lie in a pre-registered band.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# arm[seed][valid_trajectories][task_id] -> episode outcomes (0/1)
Arm = Mapping[Hashable, Mapping[int, Mapping[str, Sequence[int]]]]


@dataclass(frozen=True)
class CheckpointDifference:
    valid_trajectories: int
    difference: float  # rate_a - rate_b, pooled over seeds and tasks
    band: tuple[float, float]  # difference ± q: jointly with all other checkpoints
    rate_a: float
    rate_b: float
    episodes_a: int
    episodes_b: int

    def to_dict(self) -> dict:
        return {
            "valid_trajectories": self.valid_trajectories,
            "difference": self.difference,
            "band": list(self.band),
            "rate_a": self.rate_a,
            "rate_b": self.rate_b,
            "episodes_a": self.episodes_a,
            "episodes_b": self.episodes_b,
        }


@dataclass(frozen=True)
class Equivalence:
    verdict: str  # equivalent | differ | inconclusive
    margin: float
    half_width: float  # q: the simultaneous band is d_c ± q at every checkpoint
    checkpoints: list[CheckpointDifference]
    max_abs_difference: float
    max_at: int  # valid trajectories of the checkpoint with the largest |d_c|
    excludes_zero_at: list[
        int
    ]  # checkpoints whose band excludes 0 (may be non-empty if equivalent)
    matched_checkpoints: list[int]
    unmatched_checkpoints: list[int]  # in one arm only, or missing from some seed
    tasks: int
    dropped_tasks: list[str]  # not evaluated with episodes at every seed x checkpoint x arm
    seeds_a: list
    seeds_b: list
    paired_seeds: bool
    samples: int
    confidence: float

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "margin": self.margin,
            "half_width": self.half_width,
            "checkpoints": [c.to_dict() for c in self.checkpoints],
            "max_abs_difference": self.max_abs_difference,
            "max_at_valid_trajectories": self.max_at,
            "band_excludes_zero_at": self.excludes_zero_at,
            "matched_valid_trajectories": self.matched_checkpoints,
            "unmatched_valid_trajectories": self.unmatched_checkpoints,
            "heldout_tasks": self.tasks,
            "dropped_tasks": self.dropped_tasks,
            "seeds_a": self.seeds_a,
            "seeds_b": self.seeds_b,
            "paired_seeds": self.paired_seeds,
            "bootstrap_samples": self.samples,
            "confidence": self.confidence,
        }


def _tables(arm: Arm, seeds: list, matched: list[int], tasks: list[str]):
    """Successes and episodes as (seed, checkpoint, task) arrays."""
    shape = (len(seeds), len(matched), len(tasks))
    successes, episodes = np.zeros(shape), np.zeros(shape)
    for i, s in enumerate(seeds):
        for j, c in enumerate(matched):
            for k, t in enumerate(tasks):
                outcomes = list(arm[s][c][t])
                if any(o not in (0, 1) for o in outcomes):
                    raise ValueError(f"seed {s!r}, checkpoint {c}, task {t!r}: outcomes not 0/1")
                successes[i, j, k], episodes[i, j, k] = sum(outcomes), len(outcomes)
    return successes, episodes


def _counts(rng: np.random.Generator, n: int, samples: int) -> np.ndarray:
    """Bootstrap multiplicities: how often each of n clusters is drawn, per resample."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=samples).astype(float)


def curve_equivalence(
    arm_a: Arm,
    arm_b: Arm,
    margin: float,
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Equivalence:
    """Are arm A's and arm B's held-out learning curves equivalent within ±margin?

    `arm_x[seed][valid_trajectories][task_id]` is a list of episode outcomes (0/1): per training
    seed, per checkpoint, per held-out task. At each matched checkpoint c (present in every seed of
    both arms) d_c = rate_a(c) - rate_b(c), each rate pooled over seeds and tasks (tasks evaluated
    at every seed x checkpoint x arm). Uncertainty comes from two sources, so the bootstrap
    resamples both clusters: training seeds (jointly when both arms have the same seed ids — the
    runs are paired, so a seed's shared luck cancels — otherwise each arm's independently) and
    held-out tasks (one task resample for both arms: they are evaluated on the same tasks). Each
    resample recomputes every d*_c. The band is simultaneous: q is the `confidence` quantile of
    max_c |d*_c - d_c|, so d_c ± q covers all checkpoints jointly and a curve that differs at one
    checkpoint cannot hide behind the others.

    Verdict (TOST-like, against the margin m): "equivalent" if max_c |d_c| + q <= m (every band
    inside [-m, m]: both one-sided "difference beyond ±m" hypotheses rejected at every checkpoint);
    else "differ" if some |d_c| > q (that band excludes 0); else "inconclusive". A band that
    excludes 0 yet lies inside [-m, m] is "equivalent" (the margin says what difference is too small
    to matter); such checkpoints are still listed in `excludes_zero_at`.

    scipy.stats.bootstrap is not used: it refuses samples of one observation ("each sample in
    `data` must contain two or more observations"), and one training seed per arm is a
    pre-registered design here; its intervals are per statistic, and the band's q is a quantile of
    a max over a crossed seeds x tasks resample, which numpy expresses directly.
    """
    if margin < 0:
        raise ValueError(f"margin must be non-negative, got {margin}")
    if samples < 1 or not 0 < confidence < 1:
        raise ValueError(f"need samples >= 1 and 0 < confidence < 1, got {samples}, {confidence}")
    if not arm_a or not arm_b:
        raise ValueError("an arm has no seeds")
    seeds_a, seeds_b = sorted(arm_a), sorted(arm_b)

    def common_checkpoints(arm: Arm) -> set[int]:
        return set.intersection(*(set(arm[s]) for s in arm))

    every = set().union(*(set(arm_a[s]) for s in arm_a), *(set(arm_b[s]) for s in arm_b))
    matched = sorted(common_checkpoints(arm_a) & common_checkpoints(arm_b))
    if not matched:
        raise ValueError("no checkpoint at a matched number of valid trajectories in every run")
    cells = [arm[s][c] for arm in (arm_a, arm_b) for s in arm for c in matched]
    all_tasks = set().union(*(set(cell) for cell in cells))
    tasks = sorted(t for t in all_tasks if all(len(cell.get(t, ())) > 0 for cell in cells))
    if not tasks:
        raise ValueError("no held-out task evaluated at every matched checkpoint in every run")

    sa, na = _tables(arm_a, seeds_a, matched, tasks)
    sb, nb = _tables(arm_b, seeds_b, matched, tasks)
    rate_a = sa.sum(axis=(0, 2)) / na.sum(axis=(0, 2))
    rate_b = sb.sum(axis=(0, 2)) / nb.sum(axis=(0, 2))
    point = rate_a - rate_b

    rng = np.random.default_rng(seed)
    task_w = _counts(rng, len(tasks), samples)  # (samples, tasks), shared by both arms
    paired = seeds_a == seeds_b
    seed_wa = _counts(rng, len(seeds_a), samples)  # (samples, seeds)
    seed_wb = seed_wa if paired else _counts(rng, len(seeds_b), samples)

    def resampled_rate(s, n, seed_w) -> np.ndarray:  # (samples, checkpoints)
        num = np.einsum("bs,sct,bt->bc", seed_w, s, task_w, optimize=True)
        den = np.einsum("bs,sct,bt->bc", seed_w, n, task_w, optimize=True)
        return num / den  # den > 0: every kept cell has episodes, every resample draws some

    draws = resampled_rate(sa, na, seed_wa) - resampled_rate(sb, nb, seed_wb)
    deviation = np.abs(draws - point).max(axis=1)
    # "higher": an observed draw, with at least `confidence` of the draws at or below it.
    q = float(np.quantile(deviation, confidence, method="higher"))

    largest = int(np.argmax(np.abs(point)))
    max_abs = float(abs(point[largest]))
    excludes_zero = [c for c, d in zip(matched, point, strict=True) if abs(d) > q]
    if max_abs + q <= margin:
        verdict = "equivalent"
    elif excludes_zero:
        verdict = "differ"
    else:
        verdict = "inconclusive"
    rows = [
        CheckpointDifference(
            valid_trajectories=c,
            difference=float(point[j]),
            band=(float(point[j] - q), float(point[j] + q)),
            rate_a=float(rate_a[j]),
            rate_b=float(rate_b[j]),
            episodes_a=int(na[:, j].sum()),
            episodes_b=int(nb[:, j].sum()),
        )
        for j, c in enumerate(matched)
    ]
    return Equivalence(
        verdict=verdict,
        margin=margin,
        half_width=q,
        checkpoints=rows,
        max_abs_difference=max_abs,
        max_at=matched[largest],
        excludes_zero_at=excludes_zero,
        matched_checkpoints=matched,
        unmatched_checkpoints=sorted(every - set(matched)),
        tasks=len(tasks),
        dropped_tasks=sorted(all_tasks - set(tasks)),
        seeds_a=seeds_a,
        seeds_b=seeds_b,
        paired_seeds=paired,
        samples=samples,
        confidence=confidence,
    )


def check_margin(margin: float, threshold: float, warm_start: float) -> float:
    """Refuse a margin that cannot tell a run that learned from one that did not; return it.

    The target asks for a gain of threshold - warm_start. A margin at least that wide calls a
    curve that reached the threshold "equivalent" to a flat curve that never left the warm start.
    """
    gain = threshold - warm_start
    if gain <= 0:
        raise ValueError(
            f"threshold {threshold} is not above the warm start {warm_start}: the target asks for "
            "no gain, so no margin can tell learning from not learning"
        )
    if margin <= 0:
        raise ValueError(f"margin must be positive, got {margin}")
    if margin >= gain:
        raise ValueError(
            f"margin {margin} is not narrower than the gain the target asks for "
            f"(threshold {threshold} - warm start {warm_start} = {gain:.6g}): a run that reached "
            "the target and one that never learned would count as equivalent"
        )
    return margin


def margin_for(threshold: float, warm_start: float, fraction: float) -> float:
    """The margin as a pre-registered fraction of the gain the target asks for; check_margin
    refuses a fraction outside (0, 1), which gives no margin or one at least the whole gain."""
    return check_margin(fraction * (threshold - warm_start), threshold, warm_start)


@dataclass(frozen=True)
class ConvergenceRatio:
    verdict: str  # within band | outside band | not reached by one arm | not reached by either arm
    ratio: float | None  # candidate / baseline valid trajectories to target
    band: float
    bounds: tuple[float, float]  # [1/band, band]
    candidate: int | None  # valid trajectories to target; None: not reached
    baseline: int | None
    not_reached: list[str]  # "candidate" and/or "baseline"

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "ratio": self.ratio,
            "band": self.band,
            "bounds": list(self.bounds),
            "candidate_valid_to_target": self.candidate,
            "baseline_valid_to_target": self.baseline,
            "not_reached": self.not_reached,
        }


def convergence_ratio(
    valid_to_target_a: int | None, valid_to_target_b: int | None, band: float
) -> ConvergenceRatio:
    """Does the candidate (a) need about as many valid trajectories to target as the baseline (b)?

    MLPerf's reference-convergence idea on the x-axis: an environment change should not change
    how much data reaches the target, so candidate / baseline must lie in [1/band, band]. None
    means that arm never reached the target; then there is no ratio and the verdict says which.
    """
    if not band >= 1:
        raise ValueError(f"band must be at least 1 (the bounds are [1/band, band]), got {band}")
    bounds = (1.0 / band, float(band))
    missing = [
        name
        for name, value in (("candidate", valid_to_target_a), ("baseline", valid_to_target_b))
        if value is None
    ]
    for name, value in (("candidate", valid_to_target_a), ("baseline", valid_to_target_b)):
        if value is not None and value <= 0:
            raise ValueError(
                f"{name} reached the target at {value} valid trajectories: met before training, "
                "so a ratio of data to target says nothing"
            )
    if missing:
        verdict = "not reached by either arm" if len(missing) == 2 else "not reached by one arm"
        return ConvergenceRatio(
            verdict, None, band, bounds, valid_to_target_a, valid_to_target_b, missing
        )
    ratio = valid_to_target_a / valid_to_target_b
    # max(a/b, b/a) <= band: each quotient correctly rounded, so a ratio exactly at 1/band counts
    # as within, like one exactly at band (a/b >= 1/band could miss it by one ulp).
    within = max(ratio, valid_to_target_b / valid_to_target_a) <= band
    verdict = "within band" if within else "outside band"
    return ConvergenceRatio(verdict, ratio, band, bounds, valid_to_target_a, valid_to_target_b, [])
