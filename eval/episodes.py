"""The episodes of an evaluation: what the frozen protocol plays, one episode at a time, and what
the episodes add up to. eval/heldout.py is the job that plays a checkpoint's; eval/workers.py
shares them among processes.

Per the frozen protocol: every held-out task, `episodes_per_task` episodes for each evaluation
seed, at most `max_steps` actions each. The prompt, the tools and the action mapping are the
trainer's (trainer/agent.py), so the policy is asked exactly what it was trained on. Decoding is
greedy unless the protocol sets a temperature; then each turn's sampler is seeded by (task,
evaluation seed, episode, turn), so episodes draw independently and a rerun draws the same. An
invalid episode (any gate failed) is retried up to `max_invalid_retries` times and counted; a
checkpoint left short of valid episodes on any task is `scored: false` and gets no rate (never a 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from envab.envs.protocol import Gate, Verification
from envab.hashing import sha256_bytes, sha256_json
from envab.preregistration import EvaluationProtocol
from envab.trainer import agent
from envab.trainer.generation import Generation, UnsampleableToken

if TYPE_CHECKING:
    from envab.eval.policy import Policy


@dataclass(frozen=True)
class Protocol:
    """What an evaluation plays: the frozen protocol's episode settings, and how long a turn may
    be (the run's pinned `max_completion_length`: as long at evaluation as in training)."""

    episodes_per_task: int
    seeds: tuple[int, ...]
    max_steps: int
    max_invalid_retries: int
    temperature: float
    max_new_tokens: int
    turn_end: str = "bias"  # the run's pinned training.grpo.turn_end: a turn ends as in training

    @classmethod
    def frozen(cls, evaluation: EvaluationProtocol, training: dict) -> Protocol:
        """The pre-registered protocol, with a turn generated as the run's pinned `training`
        generated one (trainer/generation.py) at the protocol's temperature."""
        generation = Generation.pinned(training, evaluation.temperature)
        return cls(
            episodes_per_task=evaluation.episodes_per_task,
            seeds=evaluation.seeds,
            max_steps=evaluation.max_steps,
            max_invalid_retries=evaluation.max_invalid_retries,
            temperature=generation.temperature,
            max_new_tokens=generation.max_new_tokens,
            turn_end=generation.turn_end,
        )

    @property
    def generation(self) -> Generation:
        return Generation(self.temperature, self.max_new_tokens, self.turn_end)


def sampler_seed(task_id: str, seed: int, turn: int) -> int:
    """One seed per (task, episode seed, turn). A seed shared by every task would give all of
    them the same random draws, so episodes of similar tasks would succeed or fail together."""
    return int(sha256_bytes(f"{task_id}/{seed}/{turn}".encode())[:15], 16)


def play(policy: Policy, backend, task: dict, protocol: Protocol, seed: int) -> dict:
    """One episode: its verdict, if valid its score, a digest of the actions it sent (as
    training's `actions_sha256`: one task played with the same actions must get the same score,
    which is how two evaluations of one checkpoint are compared, analysis/controls.py) and one of
    the policy's replies (what it drew, a tool call or not)."""
    session = backend.create(task)
    sent: list[dict] = []
    replies: list[dict] = []
    try:
        observation = session.observation
        turns = 0
        rejected = False  # a turn held an unsampleable token: invalid (eval/policy.py)
        if observation.valid:
            messages = agent.task_prompt(task, observation.screenshot)
            while turns < protocol.max_steps and observation.valid and not observation.done:
                try:
                    reply = policy.act(messages, sampler_seed(task["id"], seed, turns))
                except UnsampleableToken:
                    rejected = True
                    break
                replies.append(reply)
                calls = reply.get("tool_calls") or []
                if not calls:
                    break  # the policy answered in prose: the episode ends, the checker decides
                messages.append(agent.plain_reply(reply))
                # Every call of the reply, in order, each one action of max_steps: what TRL
                # does in training (it runs all tool calls of a turn; trainer/environment.py
                # counts each against max_turns).
                for call in (c.get("function") or {} for c in calls):
                    if turns >= protocol.max_steps or observation.done:
                        break  # the episode is over; nothing more is asked of the policy
                    turns += 1
                    # A call the tools refuse (a wrong argument, a click off the screen) is the
                    # policy's mistake: nothing happens and it is told so, as in training, never
                    # an invalid episode and never a crash.
                    try:
                        action = policy.tools.action_for(call.get("name"), call.get("arguments"))
                        sent.append(dict(action))
                        observation = session.step(action)
                    except ValueError as e:  # ActionRejected is a ValueError on every backend
                        messages.append(
                            agent.tool_message(str(call.get("name")), note=f"Refused: {e}")
                        )
                        continue
                    messages.append(agent.tool_message(call["name"], observation.screenshot))
                    if not observation.valid:
                        break
        if rejected:
            verification = Verification.invalid([Gate.COMPLETION_TOKENS])
        else:
            verification = session.verify()
    finally:
        session.close()
    return {
        "task_id": task["id"],
        "seed": seed,
        "verdict": verification.verdict,
        "failed_gates": list(verification.failed_gates),
        "score": verification.score,
        "turns": turns,
        "actions_sha256": sha256_json(sent),
        "replies_sha256": sha256_json(replies),
    }


def evaluate(policy: Policy, backend, tasks: list[dict], protocol: Protocol, log=None) -> dict:
    """Every episode of `protocol` on every task, one after another, and what they add up to."""
    return summary(play_tasks(policy, backend, tasks, protocol, log), protocol)


def play_tasks(policy: Policy, backend, tasks: list[dict], protocol: Protocol, log=None) -> list:
    """The episode records of `tasks` in order: for each task, evaluation seed and episode, the
    attempts until one is valid or `max_invalid_retries` retries are spent."""
    episodes = []
    for task in tasks:
        for seed in protocol.seeds:
            for episode in range(protocol.episodes_per_task):
                for attempt in range(protocol.max_invalid_retries + 1):
                    record = play(policy, backend, task, protocol, seed * 1000 + episode)
                    record["attempt"] = attempt
                    episodes.append(record)
                    if log:
                        log(record)
                    if record["verdict"] == "valid":
                        break
    return episodes


def summary(episodes: list[dict], protocol: Protocol) -> dict:
    """The success rate of the valid episodes, or none where a task is short of them."""
    outcomes: dict[str, list[int]] = {}
    invalid = retries = 0
    for record in episodes:
        results = outcomes.setdefault(record["task_id"], [])
        if record["verdict"] == "valid":
            results.append(int(record["score"] == 1.0))
        else:
            invalid += 1
            retries += record["attempt"] < protocol.max_invalid_retries
    wanted = protocol.episodes_per_task * len(protocol.seeds)
    short = sorted(t for t, r in outcomes.items() if len(r) < wanted)
    successes = sum(sum(r) for r in outcomes.values())
    n = sum(len(r) for r in outcomes.values())
    scored = not short and n > 0
    return {
        "scored": scored,
        "success_rate": successes / n if scored else None,
        "successes": successes,
        "episodes": n,
        "invalid": invalid,
        "retries": retries,
        "short_of_valid_episodes": short,
        "tasks": outcomes,
        "episode_records": episodes,
    }
