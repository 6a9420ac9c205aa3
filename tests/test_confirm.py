"""The confirmatory evaluation: fresh seeds, as many episodes as the test needs, and a verdict that
a policy at the threshold earns and one well below it does not."""

from __future__ import annotations

import pytest
import yaml
from test_controls import REPO
from test_heldout import PROTOCOL, Scripted

from envab.analysis.confirm import confirmation, fresh_protocol, fresh_seeds
from envab.envs.tasks.build import build
from envab.envs.tasks.local import LocalBackend
from envab.eval.episodes import evaluate
from envab.preregistration import ConfirmationProtocol, Preregistration
from envab.schema import ConfigError
from envab.trainer import agent

SETTINGS = ConfirmationProtocol(delta=0.2, alpha=0.05, power=0.8, first_seed=1000)


class Clicking(Scripted):
    """Clicks the oracle's spot on the screens it knows (by their digest), a corner elsewhere."""

    def __init__(self, clicks):
        super().__init__([])
        self.clicks = clicks

    def act(self, messages, seed):
        image = next(c["image"] for c in messages[0]["content"] if c["type"] == "image")
        x, y = self.clicks.get(agent.screenshot_sha256(image), (1, 1))
        call = {"type": "function", "function": {"name": "click", "arguments": {"x": x, "y": y}}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}


@pytest.fixture(scope="module")
def tasks_and_clicks():
    tasks, solutions = build(1, 8, families=["click_button"], layout="templated", templates=2)
    clicks = {}
    for task, solution in zip(tasks, solutions, strict=True):
        with LocalBackend().create(task) as session:
            screen = agent.screenshot_sha256(session.observation.screenshot)
        p = solution["oracle"][0]["parameters"]
        clicks[screen] = (p["x"], p["y"])
    return tasks, clicks


def confirmed(policy, tasks, frozen, threshold):
    """What the confirm job judges: the fresh episodes played, then the test."""
    protocol, wanted = fresh_protocol(frozen, len(tasks), threshold, SETTINGS)
    result = evaluate(policy, LocalBackend(), tasks, protocol)
    return confirmation(result, threshold, wanted, protocol.seeds, SETTINGS)


def test_fresh_seeds_cover_the_episodes_wanted():
    assert fresh_seeds(1000, 493, 25, 1) == tuple(range(1000, 1020))  # 20 x 25 = 500 >= 493
    assert fresh_seeds(1000, 50, 25, 2) == (1000,)


def test_a_policy_that_always_succeeds_is_confirmed_and_one_that_never_does_is_not(
    tasks_and_clicks,
):
    tasks, clicks = tasks_and_clicks
    protocol = PROTOCOL.__class__(**{**PROTOCOL.__dict__, "max_steps": 1})
    always = Clicking(clicks)
    never = Clicking({})
    # delta 0.2 at threshold 0.5: 0.3 is ruled out with a few dozen episodes
    good, bad = (confirmed(policy, tasks, protocol, 0.5) for policy in (always, never))
    assert good["episodes_wanted"] <= good["test"]["episodes"] == len(tasks) * len(good["seeds"])
    assert good["seeds"][0] == 1000
    assert good["evaluation"]["success_rate"] > 0.5 and good["verdict"] == "confirmed"
    assert bad["test"]["successes"] == 0 and bad["verdict"] == "not confirmed"


def test_a_confirmation_must_use_seeds_the_evaluation_never_did(tmp_path):
    target = yaml.safe_load((REPO / "preregistration" / "target.yaml").read_text())
    target["confirmation"] = {"delta": 0.05, "first_seed": 1}
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(target))
    with pytest.raises(ConfigError, match="needs fresh seeds"):
        Preregistration.load(path)
    target["confirmation"] = {"delta": 0.05}
    path.write_text(yaml.safe_dump(target))
    assert Preregistration.load(path).confirmation.first_seed == 1000
