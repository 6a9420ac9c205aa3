"""The evaluation corruption control (issue 36, item 4: "add a corruption of the evaluation
path"): an arm's training replayed, the held-out evaluation of its checkpoints silently flipping
a registered fraction of valid scores, and its checkpoints evaluated once more honestly. The
check (analysis/controls.py) compares the two evaluations of each checkpoint episode by episode,
pairs that sent the same actions, against the honest evaluations' own disagreement; it passes
with or without bit-determinism for what the corruption changed, fails where nothing was
flipped, and is "not powered", never a pass, where too few pairs could show the flip.

Simulated as the analysis reads the records: a deterministic environment whose score is a
function of the task and the actions; a policy that samples one of a task's action sequences
(seeded per episode, so a replay of a checkpoint takes the same actions where sampling is
bit-deterministic, and another draw for some episodes where it is not)."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

from envab.analysis.controls import DETERMINISTIC, NOT_DETERMINISTIC, judge, render_markdown
from envab.analysis.runs import RunRecords
from envab.envs.controls import ControlBackend
from envab.envs.protocol import Verification
from envab.preregistration import Control
from envab.run_pins import RunPins

SEEDS = (1, 2, 3)
TASKS, EVAL_SEEDS, SEQUENCES = 16, 4, 3
CHECKPOINTS = (0, 64, 128)


def _digest(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def prereg() -> SimpleNamespace:
    return SimpleNamespace(
        threshold=0.7,
        target=SimpleNamespace(crossing={"rule": "first_crossing"}),
        equivalence=SimpleNamespace(
            margin=lambda threshold: 0.075, bootstrap_samples=100, confidence=0.95
        ),
        primary=SimpleNamespace(alpha=0.05),
        determinism="expected",
        controls=(),
    )


def evaluation(name: str, policy: int, *, flip=0.0, resample=0.0, draw=0, flip_seed=0) -> dict:
    """One checkpoint's eval record: per task and evaluation seed, one episode. `policy`: which
    run's checkpoint (its preferences); `resample`: the fraction of episodes whose sampling
    comes out otherwise on this play (not bit-deterministic); `flip`: the fraction of valid
    scores the evaluation flips."""
    world = np.random.default_rng(2026)
    answers = world.integers(0, SEQUENCES, TASKS)
    prefs = np.random.default_rng([policy, len(name)]).dirichlet(np.ones(SEQUENCES), TASKS)
    noise = np.random.default_rng([policy, len(name), draw])
    flips = np.random.default_rng([flip_seed, len(name), 7])
    episodes, tasks = [], {}
    for t in range(TASKS):
        for seed in range(EVAL_SEEDS):
            sampler = np.random.default_rng([policy, len(name), t, seed])
            sequence = int(sampler.choice(SEQUENCES, p=prefs[t]))
            if resample and noise.random() < resample:
                sequence = int(noise.integers(SEQUENCES))
            score = float(sequence == answers[t])
            if flip and flips.random() < flip:
                score = 1.0 - score
            episodes.append(
                {
                    "task_id": f"h{t}",
                    "seed": seed * 1000,
                    "verdict": "valid",
                    "score": score,
                    "actions_sha256": _digest(t, sequence),
                }
            )
            tasks.setdefault(f"h{t}", []).append(int(score))
    n = len(episodes)
    wins = sum(e["score"] for e in episodes)
    return {
        "scored": True,
        "tasks": tasks,
        "success_rate": wins / n,
        "episode_records": episodes,
        "evaluation_key": _digest(name, policy, flip, draw),
    }


def run(arm: str, seed: int, *, policy: int, flip=0.0, resample=0.0, honest=False) -> RunRecords:
    """A run whose checkpoints are `policy`'s (a replay shares its base run's policy and step
    digests); `honest`: its checkpoints evaluated once more, honestly (eval-honest/)."""
    names = [f"ckpt-{c:03d}" for c in CHECKPOINTS]
    checkpoints = [
        {
            "checkpoint": n,
            "due_at_valid": c,
            "valid_trajectories": c,
            "invalid_discarded": 0,
            "wall_clock_s": float(c),
        }
        for n, c in zip(names, CHECKPOINTS, strict=True)
    ]
    evaluations = {n: evaluation(n, policy, flip=flip, flip_seed=seed) for n in names}
    honest_evaluations = (
        {n: evaluation(n, policy, resample=resample, draw=1) for n in names} if honest else None
    )
    return RunRecords(
        arm=arm,
        seed=seed,
        pins=RunPins.make("exp", {}, {}, {}, arm, seed, {}),
        checkpoints=checkpoints,
        evaluations=evaluations,
        final={**checkpoints[-1], "stop_reason": "max_valid_trajectories"},
        inputs={},
        steps=[{"step": k, "rewards": _digest(policy, k)} for k in range(1, 5)],
        trajectories=[],
        honest_evaluations=honest_evaluations,
    )


CONTROL = Control("evalflip", "drums", "eval_differs", flip_eval=0.2)


def experiment(*, replay: bool, flip: float, resample: float = 0.0, seeds=SEEDS):
    """The base arm and the evaluation corruption's runs. `replay`: training bit-deterministic
    (the control's checkpoints are its base run's)."""
    base = [run("drums", s, policy=s) for s in seeds]
    control = [
        run(
            CONTROL.run_arm,
            s,
            policy=s if replay else 100 + s,
            flip=flip,
            resample=resample,
            honest=True,
        )
        for s in seeds
    ]
    return base, control


@pytest.mark.parametrize("rules", [DETERMINISTIC, NOT_DETERMINISTIC])
def test_an_evaluation_corruption_is_caught_with_or_without_determinism(rules):
    replay = rules == DETERMINISTIC
    # Not deterministic: the control's own checkpoints, and a third of the honest replays
    # sample otherwise (those pairs are not comparable, never counted as disagreeing).
    base, control = experiment(replay=replay, flip=0.2, resample=0.0 if replay else 0.3)
    judged = judge(CONTROL, base, control, prereg(), rules=rules)
    assert judged["verdict"] == "as expected", judged["reasons"]
    check = judged["evaluation"]
    reported = check["reported"]
    assert reported["pairs"] == len(SEEDS) * len(CHECKPOINTS) * TASKS * EVAL_SEEDS
    if not replay:
        assert reported["comparable_groups"] < reported["pairs"]  # resampled pairs left out
    assert reported["disagreeing_groups"] > 0 and check["excess_p"] <= 0.05
    assert check["honest"]["disagreeing_groups"] == 0 and check["power"] >= 0.8
    assert judged["rules"] == rules
    table = render_markdown([judged])
    assert "reported vs honest evaluation" in table and "**as expected**" in table


@pytest.mark.parametrize("rules", [DETERMINISTIC, NOT_DETERMINISTIC])
def test_an_evaluation_that_flips_nothing_is_not_as_expected(rules):
    base, control = experiment(replay=rules == DETERMINISTIC, flip=0.0, resample=0.3)
    judged = judge(CONTROL, base, control, prereg(), rules=rules)
    assert judged["evaluation"]["reported"]["disagreeing_groups"] == 0
    assert judged["evaluation"]["power"] >= 0.8
    assert judged["verdict"] == "NOT as expected"
    assert judged["reasons"][0].startswith("no excess disagreement between the reported")


def test_too_few_episode_pairs_are_not_powered_never_a_pass():
    base, control = experiment(replay=True, flip=0.0, seeds=(1,))
    for r in control:  # one checkpoint's honest evaluation, two tasks of it
        name = next(iter(r.honest_evaluations))
        record = r.honest_evaluations[name]
        kept = [e for e in record["episode_records"] if e["task_id"] in ("h0", "h1")]
        r.honest_evaluations = {name: {**record, "episode_records": kept}}
    judged = judge(CONTROL, base, control, prereg(), rules=NOT_DETERMINISTIC)
    assert judged["evaluation"]["reported"]["comparable_groups"] == 8
    assert judged["evaluation"]["power"] < 0.8
    assert judged["verdict"] == "not powered"


def test_with_determinism_a_corruption_that_reached_training_is_not_as_expected():
    base, control = experiment(replay=False, flip=0.2)  # the control's training diverged
    judged = judge(CONTROL, base, control, prereg(), rules=DETERMINISTIC)
    assert judged["evaluation"]["excess_p"] <= 0.05
    assert judged["verdict"] == "NOT as expected"
    assert judged["reasons"] == ["training diverged: the corruption reached training"]


def test_without_an_honest_evaluation_nothing_is_compared():
    base, control = experiment(replay=True, flip=0.2)
    for r in control:
        r.honest_evaluations = None
    judged = judge(CONTROL, base, control, prereg(), rules=NOT_DETERMINISTIC)
    assert judged["evaluation"]["reported"]["comparable_groups"] == 0
    assert judged["verdict"] == "not powered"


def test_the_control_trains_as_its_base_and_evaluates_with_the_flip():
    base = {"backend": "drums", "url": "embedded", "mode": "fork"}
    assert CONTROL.arm_config(base) == base  # training: a replay of the base arm
    evaluated = CONTROL.eval_config(base)
    assert evaluated["control"] == {"flip_rewards": 0.2, "seed": 0}
    assert Control("aa", "drums", "same").eval_config(base) == base

    class Inner:
        can_fork = False

    backend = ControlBackend(Inner(), evaluated["control"])
    flipped = [backend.corrupt(Verification(1.0, True, "valid")).score for _ in range(2000)]
    assert flipped.count(0.0) / 2000 == pytest.approx(0.2, abs=0.03)
