"""Reward consistency: the same task played with the same actions gets the same reward.

In a deterministic environment a reward is a function of the task and the actions sent to it, so
two valid attempts with equal (task_id, actions_sha256) (trainer/accounting.py) must agree. This
holds whether or not training is bit-deterministic, which makes it the check that can see a
corrupted reward on a GPU, where exact divergence cannot (analysis/controls.py), and a descriptive
diagnostic of a flaky verifier on every run (analysis/outcome.py).

Per run: valid attempts grouped by (task_id, actions_sha256); a group of two or more is
*comparable*; a comparable group *disagrees* when its rewards are not all equal. Comparable groups
are the unit: each is one independent look at whether the environment answered one question twice
the same way.

- `excess`: is a run's disagreement rate higher than another's? One-sided Fisher exact test on
  the 2 x 2 table of disagreeing / agreeing comparable groups (scipy's `fisher_exact`).
- `paired_episodes`, `pair_power`: the same question for evaluation (an evaluation corruption's
  control, analysis/controls.py): one checkpoint evaluated twice, reported and honestly, episode
  by episode; a pair with the same actions is comparable, and its scores must agree. Pairs
  disagreeing beyond the honest evaluations' own disagreement (`evaluation_lines`, grouped as
  above) is the evidence, by the same Fisher test; its power at a registered flip f is that of
  a Binomial(pairs, f) count, since only one side of a pair is corrupted.
- `flip_power`: the power of that test to see a `flip_rewards` corruption, given the groups the
  control run has and the base run's counts: each reward of a group of k is flipped with
  probability f independently, so the group disagrees with probability 1 - f^k - (1 - f)^k (no
  flip, or every one, leaves it agreeing); the count of disagreeing groups is a sum of binomials,
  one per group size, convolved exactly.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

import numpy as np
from scipy import stats

# Below this power a corruption the test does not see is "not powered", not "NOT as expected":
# the conventional 0.8, as the confirmation's sizing uses.
POWERED = 0.8


def consistency(trajectories: Iterable[Mapping] | None) -> dict:
    """One run's comparable groups and those whose rewards disagree."""
    if trajectories is None:
        return {"verdict": "not checked", "reason": "no trajectories.jsonl"}
    groups: dict[tuple, list] = defaultdict(list)
    valid = unrecorded = 0
    for line in trajectories:
        if line.get("verdict") != "valid":
            continue
        valid += 1
        if line.get("actions_sha256") is None:
            unrecorded += 1  # recorded before attempts carried their actions' digest
            continue
        groups[line["task_id"], line["actions_sha256"]].append(line["reward"])
    if valid and unrecorded == valid:
        return {"verdict": "not checked", "reason": "no attempt records actions_sha256"}
    comparable = {key: rewards for key, rewards in groups.items() if len(rewards) >= 2}
    disagreeing = {key: r for key, r in comparable.items() if len(set(r)) > 1}
    return {
        "verdict": "disagreement" if disagreeing else "consistent",
        "valid_attempts": valid,
        "comparable_groups": len(comparable),
        "comparable_attempts": sum(len(r) for r in comparable.values()),
        "disagreeing_groups": len(disagreeing),
        "disagreement_rate": len(disagreeing) / len(comparable) if comparable else None,
        # group size -> how many comparable groups have it (what the power depends on)
        "group_sizes": {
            str(k): n for k, n in sorted(Counter(map(len, comparable.values())).items())
        },
        "examples": [
            {"task_id": task, "actions_sha256": digest, "rewards": rewards}
            for (task, digest), rewards in sorted(disagreeing.items())[:3]
        ],
    }


def pooled(per_run: Iterable[Mapping]) -> dict:
    """Counts summed over runs (comparable groups are independent across runs)."""
    checked = [c for c in per_run if "comparable_groups" in c]
    sizes: Counter = Counter()
    for c in checked:
        sizes.update({int(k): n for k, n in c["group_sizes"].items()})
    comparable = sum(c["comparable_groups"] for c in checked)
    disagreeing = sum(c["disagreeing_groups"] for c in checked)
    return {
        "runs": len(checked),
        "comparable_groups": comparable,
        "disagreeing_groups": disagreeing,
        "disagreement_rate": disagreeing / comparable if comparable else None,
        "group_sizes": dict(sorted(sizes.items())),
    }


def excess(run: Mapping, base: Mapping) -> float | None:
    """One-sided p-value that `run` disagrees more often than `base` (None: nothing comparable
    in one of them)."""
    if not run["comparable_groups"] or not base["comparable_groups"]:
        return None
    table = [
        [run["disagreeing_groups"], run["comparable_groups"] - run["disagreeing_groups"]],
        [base["disagreeing_groups"], base["comparable_groups"] - base["disagreeing_groups"]],
    ]
    return float(stats.fisher_exact(table, alternative="greater").pvalue)


def flip_power(run: Mapping, base: Mapping, flip: float, alpha: float) -> float:
    """The probability that `excess(run, base) <= alpha` when every reward of `run`'s comparable
    groups is flipped with probability `flip`, `run`'s group sizes and `base`'s counts held."""
    n = run["comparable_groups"]
    if not n or not base["comparable_groups"]:
        return 0.0
    pmf = np.array([1.0])
    for size, count in run["group_sizes"].items():
        k = int(size)
        q = 1 - flip**k - (1 - flip) ** k
        pmf = np.convolve(pmf, stats.binom.pmf(np.arange(count + 1), count, q))
    return _power(pmf, n, base, alpha)


def pair_power(pairs: int, flip: float, base: Mapping, alpha: float) -> float:
    """The probability that `excess` of `pairs` comparable pairs over `base` is at most `alpha`
    when one side of each pair has its score flipped with probability `flip` (an evaluation
    corruption against an honest evaluation): each pair disagrees with probability `flip`."""
    if not pairs or not base["comparable_groups"]:
        return 0.0
    return _power(stats.binom.pmf(np.arange(pairs + 1), pairs, flip), pairs, base, alpha)


def _power(pmf: np.ndarray, n: int, base: Mapping, alpha: float) -> float:
    """P(excess <= alpha) for a disagreeing count with this pmf over 0..n."""

    def significant(d: int) -> bool:
        return excess({"comparable_groups": n, "disagreeing_groups": d}, base) <= alpha

    # The p-value falls as d rises: the smallest significant count, by bisection.
    if not significant(n):
        return 0.0
    low, high = 0, n
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if significant(mid) else (mid + 1, high)
    return float(pmf[low:].sum())


def evaluation_lines(evaluations: Mapping[str, Mapping]) -> list[dict]:
    """Held-out episodes (eval/<checkpoint>.json's episode_records) as `consistency` reads
    attempts: one task played with the same actions gets the same score, on any checkpoint."""
    return [
        {
            "verdict": e["verdict"],
            "task_id": e["task_id"],
            "actions_sha256": e.get("actions_sha256"),
            "reward": e["score"],
        }
        for record in evaluations.values()
        for e in record.get("episode_records", ())
    ]


def paired_episodes(reported: Mapping[str, Mapping], honest: Mapping[str, Mapping]) -> dict:
    """Two evaluations of the same checkpoints, episode by episode (checkpoint, task, episode
    seed; the valid attempt of each): a pair valid in both with the same actions_sha256 is
    *comparable* and, in a deterministic environment, must score alike whether or not the
    policy's sampling is bit-deterministic; it *disagrees* when the scores differ."""

    def valid(record: Mapping) -> dict:
        return {
            (e["task_id"], e["seed"]): e
            for e in record.get("episode_records", ())
            if e["verdict"] == "valid"
        }

    checkpoints = sorted(set(reported) & set(honest))
    pairs = comparable = disagreeing = unrecorded = 0
    examples = []
    for name in checkpoints:
        mine, theirs = valid(reported[name]), valid(honest[name])
        for key in sorted(set(mine) & set(theirs)):
            a, b = mine[key], theirs[key]
            pairs += 1
            if a.get("actions_sha256") is None or b.get("actions_sha256") is None:
                unrecorded += 1
                continue
            if a["actions_sha256"] != b["actions_sha256"]:
                continue
            comparable += 1
            if a["score"] != b["score"]:
                disagreeing += 1
                if len(examples) < 3:
                    examples.append(
                        {
                            "checkpoint": name,
                            "task_id": key[0],
                            "seed": key[1],
                            "reported": a["score"],
                            "honest": b["score"],
                        }
                    )
    return {
        "checkpoints": checkpoints,
        "pairs": pairs,
        "unrecorded": unrecorded,
        "comparable_groups": comparable,
        "disagreeing_groups": disagreeing,
        "disagreement_rate": disagreeing / comparable if comparable else None,
        "examples": examples,
    }
