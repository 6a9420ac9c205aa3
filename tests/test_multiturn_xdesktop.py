"""Multi-turn GRPO on the real X desktop, on both sandboxes: TRL's own tool loop plays each turn's
call in a real application (Mousepad), a screenshot comes back after each, OSWorld's metric
scores the saved file, and the rewards reach the update.

The policy is scripted (the tiny model does not yet make these calls on its own): in each group
one completion plays the task's oracle (type, then Ctrl+S) and the other a near miss (the wrong
text, saved), each as tool calls TRL parses, runs and tokenises as usual. So the group's rewards
are 1 and 0 on a working arm, and anything lost on the way (a turn not played, a screenshot not
returned, a score not read back) shows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_grpo import grpo_args, record_batches

from envab.envs.arms import open_arm
from envab.envs.osworld.source import load_dir
from envab.trainer import agent
from envab.trainer import model as pin
from envab.trainer.accounting import Ledger, Prices
from envab.trainer.environment import GenerationClock, Run, environment_factory
from envab.trainer.forkgroups import ForkGroups
from envab.trainer.generation import GuardedGenerationMixin
from envab.trainer.guards import HeldoutGuard
from envab.trainer.preflight import _unbatched

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "envs" / "xdesktop" / "tasks"
TASK_ID = "xd-mousepad-type-save"
GROUP = 2
COMPUTER_13 = agent.tool_set("computer_13")

pytestmark = [
    pytest.mark.integration,  # an X desktop per session, on gVisor and on QEMU
    pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc not found (setup installs it)"),
    pytest.mark.skipif(
        shutil.which("debootstrap") is None,
        reason="debootstrap not found: the X desktop's root is built with it (setup installs it)",
    ),
]


def scripts() -> list[list[tuple[str, dict]]]:
    """The calls of each completion of a group: the oracle, then a near miss of as many turns."""
    (solution,) = [
        json.loads(line)
        for line in (TASKS / "solutions.jsonl").read_text().splitlines()
        if json.loads(line)["id"] == TASK_ID
    ]
    miss = next(m for m in solution["near_misses"] if len(m["actions"]) == len(solution["oracle"]))
    return [
        [agent.call_for(a, COMPUTER_13) for a in solution["oracle"]],
        [agent.call_for(a, COMPUTER_13) for a in miss["actions"]],
    ]


class Scripted:
    """Each completion makes its script's call on turn k, then ends its last turn without one."""

    turn = 0
    script: list[list[tuple[str, dict]]] = []

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        tokenizer = self.processing_class.tokenizer
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        turn, self.turn = self.turn, self.turn + 1
        render = self.processing_class.apply_chat_template
        user = [{"role": "user", "content": [{"type": "text", "text": "-"}]}]
        prompt = _unbatched(render(user, add_generation_prompt=True, tokenize=True))
        out = []
        for j in range(len(prompt_ids)):
            calls = self.script[j % GROUP]
            if turn < len(calls):
                full = _unbatched(
                    render([*user, agent.assistant_call(*calls[turn])], tokenize=True)
                )
                ids = list(full[len(prompt) :])
                out.append(ids[: ids.index(end) + 1])
            else:
                out.append([*tokenizer.encode("done"), end])
        return out, None


@pytest.fixture(scope="module")
def task():
    (frozen,) = [t.task for t in load_dir(TASKS).tasks if t.task["id"] == TASK_ID]
    return frozen


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, task):
    out = tmp_path_factory.mktemp("tiny") / "model"
    return pin.build_builtin(pin.BuiltinSource(), [task["instruction"]], out)


def grpo_step(tiny, task, backend, tmp_path: Path):
    """One GRPO step of one group, each completion as many turns as its script."""
    from datasets import Dataset
    from trl import GRPOTrainer

    turns = len(scripts()[0])
    model, processor = pin.load(tiny)
    args = grpo_args(tmp_path / "trl", processor.tokenizer, num_generations=GROUP,
                     prompts_per_step=1, max_turns=turns, max_completion_length=512)  # fmt: skip
    args.max_steps = 1
    ledger = Ledger(str(tmp_path / "trajectories.jsonl"), str(tmp_path / "checkpoints.jsonl"),
                    arm="drums", seed=1, checkpoint_interval=100,
                    prices=Prices(0.1, 0.2))  # fmt: skip
    run = Run({task["id"]: task}, None, HeldoutGuard(frozenset()), ledger,
              ForkGroups(backend, GROUP, parallel=GROUP), tools=COMPUTER_13, max_turns=turns,
              clock=GenerationClock())  # fmt: skip
    cls = type("Trainer", (GuardedGenerationMixin, Scripted, GRPOTrainer), {"script": scripts()})
    trainer = cls(model=model, processing_class=processor, args=args,
                  train_dataset=Dataset.from_list(agent.training_rows({task["id"]: task})),
                  environment_factory=environment_factory(run))  # fmt: skip
    batches = record_batches(trainer)
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    return batches[0], lines, turns


@pytest.mark.parametrize(
    "arm",
    [
        {"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "gvisor"},
        {"backend": "drums", "url": "embedded", "mode": "restore", "sandbox": "qemu"},
    ],
    ids=["gvisor-fork", "qemu-restore"],
)
def test_grpo_plays_several_turns_in_a_real_application_and_learns_from_its_score(
    arm, tiny, task, tmp_path
):
    if arm["sandbox"] == "qemu" and shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 not found: the QEMU arm needs it (setup installs it)")
    with open_arm({**arm, "world": "xdesktop"}) as backend:
        batch, lines, turns = grpo_step(tiny, task, backend, tmp_path)

    assert [line["task_id"] for line in lines] == [TASK_ID] * GROUP
    why = [(line["verdict"], line["failed_gates"], line["audit_flags"]) for line in lines]
    assert all(line["verdict"] == "valid" for line in lines), why
    # every call was played, in its own session: the oracle saved "buy milk", the miss did not
    assert [(line["turns"], line["actions"]) for line in lines] == [(turns, turns)] * GROUP
    assert [line["score"] for line in lines] == [1.0, 0.0]
    assert lines[0]["actions_sha256"] != lines[1]["actions_sha256"]
    # the first screen and one screenshot after each turn, as images of the trained batch
    assert len(batch["image_grid_thw"]) == GROUP * (1 + turns)
    assert int(batch["tool_mask"].eq(0).sum()) > 0  # the tool results, masked out of the loss
    # rewards 1 and 0 in one group: advantages of opposite sign, so the step moves the policy
    advantages = batch["advantages"].flatten().tolist()
    assert advantages[0] > 0 > advantages[1]
