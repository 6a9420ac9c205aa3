"""A checkpoint's episodes played by several processes at once, where the job has the cores.

An evaluation plays its episodes one after another, and the tiny model's turns use little of a
core each, so a CPU evaluation job cuts the held-out tasks into contiguous shards, one per core,
and each process loads the checkpoint, opens its own evaluation arm and plays its shard exactly
as one process plays every task (eval/episodes.py `play_tasks`). The draws do not depend on the
split: each turn's sampler is seeded by (task, evaluation seed, episode, turn), never by what was
played before, so the shards' records put back in order are the records one process would have
made (a worker runs torch on its share of the cores; v10's records came out the same on one thread
as on two: docs/results/2026-12-04-evaluation-on-every-core.md). Processes, not threads: the policy
seeds torch's global generator before each turn. They are spawned, not forked: a worker forked
from a parent that had imported torch played four times slower here, and started no sooner.

A GPU evaluation plays in one process: one device, whose memory a second copy of the model would
double, and whose batch a second process would not make faster.

What crosses between the processes is the project's own: the frozen tasks as parsed, the arm's
settings and the episode records (JSON values); nothing a task or an environment sent is run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envab.envs.arms import host_log_beside
from envab.trainer.compute import Compute

if TYPE_CHECKING:
    from envab.eval.episodes import Protocol

_DONE = None  # ends the progress queue


@dataclass(frozen=True)
class Player:
    """What a process needs to play episodes of one checkpoint: all plain data."""

    checkpoint: str
    tools: str  # training.tools, as pinned
    compute: Compute
    base_expected: dict[str, str] | None  # a LoRA checkpoint's base model's files
    protocol: Protocol
    backend: dict  # the evaluation arm's config
    files: Path | None  # the tasks' frozen downloads
    host_log: str | None = None  # where an embedded host appends its log (every process)


@dataclass(frozen=True)
class Played:
    episodes: list[dict]  # every attempt's record, in the order one process plays them
    inference_s: float  # generation time, every process's added up
    generation: dict  # the protocol's generation settings, suppressed tokens too


def add_cores_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cores",
        type=int,
        default=1,
        help="the job's cores (Snakemake's threads): a CPU evaluation plays on that many processes",
    )


def add_host_log_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host-log",
        help="where an embedded host appends its log (by default beside --log: <log>.host.log); "
        "the stop-at-target judge gives its own, whose evaluations keep no job log",
    )


def host_log_of(args: argparse.Namespace) -> str | None:
    """The embedded host's log a job keeps: --host-log, else beside its --log, else none."""
    return args.host_log or host_log_beside(args.log)


def processes_for(compute: Compute, cores: int, tasks: int, backend: dict) -> int:
    """One process per core on the CPU, one on a GPU; never more than there are tasks. An arm
    under a control (an evaluation corruption, envs/controls.py) plays in one process: its flips
    are drawn in the order its episodes are verified, which shards would change."""
    if not compute.cpu or "control" in backend:
        return 1
    return max(1, min(cores, tasks))


def shards(tasks: list[dict], n: int) -> list[list[dict]]:
    """`n` contiguous runs of the tasks, as even as they can be, in order."""
    size, extra = divmod(len(tasks), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(tasks[start:end])
        start = end
    return [shard for shard in out if shard]


def play(
    player: Player, tasks: list[dict], processes: int, cores: int, log: Callable[[dict], None]
) -> Played:
    """Every episode of `player.protocol` on `tasks`, in `processes` processes (1: this one),
    each with an equal part of the `cores`; `log` hears each record as it is played."""
    if processes == 1:
        return play_shard(player, tasks, log)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    listener = threading.Thread(target=_relay, args=(queue, log), daemon=True)
    listener.start()
    try:
        with ProcessPoolExecutor(
            max_workers=processes,
            mp_context=context,
            initializer=_start_worker,
            initargs=(queue, max(1, cores // processes)),
        ) as pool:
            futures = [pool.submit(_worker, player, shard) for shard in shards(tasks, processes)]
            parts = [future.result() for future in futures]
    finally:
        queue.put(_DONE)
        listener.join()
    return Played(
        episodes=[record for part in parts for record in part.episodes],
        inference_s=sum(part.inference_s for part in parts),
        generation=parts[0].generation,
    )


def play_shard(player: Player, tasks: list[dict], log: Callable[[dict], None]) -> Played:
    """Load the policy, open the evaluation arm, play `tasks`. The arm's host starts while torch
    and the checkpoint load: most of a process's start-up is importing them."""
    from envab.envs.arms import open_arm
    from envab.eval.episodes import play_tasks

    protocol = player.protocol
    with ThreadPoolExecutor(max_workers=1) as loader:
        loading = loader.submit(_policy, player)
        with open_arm(player.backend, files=player.files, log_path=player.host_log) as arm:
            policy = loading.result()
            episodes = play_tasks(policy, arm, tasks, protocol, log=log)
    return Played(episodes, policy.generation_s, protocol.generation.settings(policy.tokenizer))


def _policy(player: Player):
    # torch loads only where episodes are played: a reused or refused evaluation never needs it
    from envab.eval.policy import Policy
    from envab.trainer import agent

    if _threads is not None:  # a worker's share of the job's cores
        import torch

        torch.set_num_threads(_threads)
    return Policy(
        player.checkpoint,
        agent.tool_set(player.tools),
        player.protocol.generation,
        compute=player.compute,
        base_expected=player.base_expected,
    )


_progress = None  # a worker's queue back to the parent's log
_threads = None  # a worker's torch threads


def _start_worker(queue, threads: int) -> None:
    global _progress, _threads
    _progress, _threads = queue, threads


def _worker(player: Player, tasks: list[dict]) -> Played:
    return play_shard(player, tasks, _progress.put)


def _relay(queue, log: Callable[[dict], None]) -> None:
    while (record := queue.get()) is not _DONE:
        log(record)
