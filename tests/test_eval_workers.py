"""An evaluation played by several processes makes the records one process makes, in its order."""

from __future__ import annotations

import pytest

from envab.envs.tasks.build import build
from envab.eval import workers
from envab.eval.episodes import Protocol, summary
from envab.trainer import model as pin
from envab.trainer.compute import Compute

# Sampled turns (temperature 1): two processes draw the same only because each turn's sampler is
# seeded by its task, evaluation seed, episode and turn.
PROTOCOL = Protocol(
    episodes_per_task=1,
    seeds=(0, 1),
    max_steps=1,
    max_invalid_retries=1,
    temperature=1.0,
    max_new_tokens=24,
)
ARM = {"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "process"}


@pytest.mark.parametrize("n, size", [(7, 1), (7, 2), (7, 3), (7, 7), (2, 5)])
def test_shards_are_contiguous_even_and_in_order(n, size):
    tasks = [{"id": f"t{i}"} for i in range(n)]
    parts = workers.shards(tasks, size)
    assert [t for part in parts for t in part] == tasks
    assert len(parts) == min(n, size)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_a_cpu_evaluation_plays_on_its_cores_and_a_gpu_one_on_one_process():
    cpu, gpu = Compute(device="cpu"), Compute(device="cuda", dtype="bfloat16")
    assert workers.processes_for(cpu, 2, 128, ARM) == 2
    assert workers.processes_for(cpu, 16, 3, ARM) == 3  # never more than tasks
    assert workers.processes_for(cpu, 1, 128, ARM) == 1
    assert workers.processes_for(gpu, 16, 128, ARM) == 1
    # an evaluation corruption draws its flips in episode order: one process keeps that order
    corrupted = {**ARM, "control": {"name": "eval-corruption", "flip_rewards": 0.1}}
    assert workers.processes_for(cpu, 2, 128, corrupted) == 1


@pytest.mark.integration  # spawns processes that load torch and start an embedded host each
def test_two_processes_play_the_episodes_one_process_plays(tmp_path):
    tasks, _ = build(1, 6, families=["click_button"], layout="templated", templates=2)
    model = pin.build_builtin(
        pin.BuiltinSource(), [t["instruction"] for t in tasks], tmp_path / "model"
    )
    player = workers.Player(
        checkpoint=str(model),
        tools="click",
        compute=Compute(),
        base_expected=None,
        protocol=PROTOCOL,
        backend=ARM,
        files=None,
    )
    heard = {1: [], 2: []}
    one = workers.play(player, tasks, 1, 1, heard[1].append)
    two = workers.play(player, tasks, 2, 2, heard[2].append)

    assert len(one.episodes) >= len(tasks) * len(PROTOCOL.seeds)
    assert two.episodes == one.episodes  # the same draws, verdicts and order
    assert len({r["replies_sha256"] for r in one.episodes}) > 1  # the draws differ by episode
    # every record reached the job's log, in whatever order the processes played them
    assert (
        sorted(map(repr, heard[2]))
        == sorted(map(repr, one.episodes))
        == sorted(map(repr, heard[1]))
    )
    assert two.generation == one.generation and two.inference_s > 0
    assert summary(two.episodes, PROTOCOL) == summary(one.episodes, PROTOCOL)
