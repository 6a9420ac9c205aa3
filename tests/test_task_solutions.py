"""A task source's oracle solutions, frozen with its tasks: the warm start for any task source
that carries them (the X desktop's do), and a clear refusal where it carries none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envab.config import ConfigError, check_config
from envab.envs.osworld.source import freeze_solutions, load_dir
from envab.errors import Refusal
from envab.preregistration import Preregistration

REPO = Path(__file__).resolve().parent.parent
XDESKTOP = REPO / "envs" / "xdesktop" / "tasks"


def freeze(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envab.envs.osworld", "--dir", str(XDESKTOP),
         "--tasks", str(tmp_path / "tasks.jsonl"), "--report", str(tmp_path / "index.json"),
         *extra],
        capture_output=True, text=True,
    )  # fmt: skip


def test_the_x_desktop_solutions_are_frozen_line_for_line_in_task_order(tmp_path):
    out = tmp_path / "solutions.jsonl"
    result = freeze(tmp_path, "--solutions-from", str(XDESKTOP / "solutions.jsonl"),
                    "--solutions", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    tasks = [json.loads(line)["id"] for line in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    frozen = out.read_bytes().splitlines()
    assert [json.loads(line)["id"] for line in frozen] == tasks
    originals = {
        json.loads(line)["id"]: line
        for line in (XDESKTOP / "solutions.jsonl").read_bytes().splitlines()
    }
    assert all(line == originals[json.loads(line)["id"]] for line in frozen)


@pytest.mark.parametrize(
    "bad, message",
    [
        (b'{"id": "x", "oracle": "rm -rf /"}\n', "a solution is {id, oracle: [action, ...]}"),
        (b'{"id": "x", "oracle": [1]}\n', "a solution is {id, oracle: [action, ...]}"),
        (b"not json\n", "not JSON"),
        (b'{"id": "xd-mousepad-type-save", "oracle": []}\n', "a second solution"),
    ],
)
def test_a_malformed_solutions_line_is_refused_with_its_line(tmp_path, bad, message):
    source = tmp_path / "solutions.jsonl"
    source.write_bytes((XDESKTOP / "solutions.jsonl").read_bytes() + bad)
    tasks = [t.task for t in load_dir(XDESKTOP).tasks]
    with pytest.raises(Refusal, match=r"solutions\.jsonl:\d+: " + message.replace("[", r"\[")
                       .replace("{", r"\{").replace("(", r"\(")):  # fmt: skip
        freeze_solutions(source, tasks, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_task_without_a_solution_is_refused_by_name(tmp_path):
    source = tmp_path / "solutions.jsonl"
    lines = (XDESKTOP / "solutions.jsonl").read_text().splitlines()
    source.write_text("\n".join(line for line in lines if "gnumeric" not in line) + "\n")
    result = freeze(tmp_path, "--solutions-from", str(source), "--solutions",
                    str(tmp_path / "out.jsonl"))  # fmt: skip
    assert result.returncode == 2
    assert "no oracle solution for 1 frozen task(s): ['xd-gnumeric-set-cell']" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_warm_start_without_demonstrations_is_refused_before_any_job():
    config = {
        "arms": {"drums": {}},
        "tasks": {"osworld": {"dir": "examples"}},
        "training": {"sft": {"enabled": True}},
    }
    prereg = Preregistration.load(REPO / ".test" / "target.yaml")
    with pytest.raises(ConfigError, match="training.sft.enabled: false to start GRPO"):
        check_config(config, prereg)
    config["training"]["sft"]["enabled"] = False
    check_config(config, prereg)
    config["tasks"]["osworld"]["solutions"] = "solutions.jsonl"
    config["training"]["sft"]["enabled"] = True
    check_config(config, prereg)


def test_a_renamed_task_finds_its_solution_by_its_frozen_id_before_osworlds(tmp_path):
    """OSWorld has ids under two domains with other content (a chrome and a thunderbird task):
    the freeze names them `<domain>.<id>`. A solution under the frozen name is that task's alone;
    one under OSWorld's id serves a task that has no solution of its own."""
    tasks = [{"id": "chrome.shared-1", "source_id": "shared-1"},
             {"id": "thunderbird.shared-1", "source_id": "shared-1"}]  # fmt: skip
    press = {"action_type": "PRESS", "parameters": {"key": "enter"}}
    source = tmp_path / "solutions.jsonl"
    source.write_text(json.dumps({"id": "chrome.shared-1", "oracle": [press]}) + "\n"
                      + json.dumps({"id": "shared-1", "oracle": []}) + "\n")  # fmt: skip
    out = tmp_path / "frozen.jsonl"
    assert freeze_solutions(source, tasks, out) == 2
    frozen = [json.loads(line) for line in out.read_text().splitlines()]
    assert frozen == [{"id": "chrome.shared-1", "oracle": [press]},
                      {"id": "thunderbird.shared-1", "oracle": []}]  # fmt: skip
    source.write_text(json.dumps({"id": "chrome.shared-1", "oracle": [press]}) + "\n")
    with pytest.raises(Refusal, match=r"no oracle solution for 1 frozen task\(s\): \['shared-1'\]"):
        freeze_solutions(source, tasks, out)
