"""Bad inputs, each met with one clear line and a non-zero exit, losing nothing already written:
files that are not YAML, a malformed task line, an unreachable host or a refused token, a
checkpoint write that runs out of room. (Bad values in valid YAML, unknown arms and seeds:
test_config.py; a model folder with a missing, extra or corrupt file: test_model.py.)"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap

import pytest
from conftest import SHIPPED_EXP as EXP

from envab.envs.arms import ArmError, open_arm
from envab.envs.host import serve_embedded, write_token_file


def env_ab_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("env-ab:")]


@pytest.mark.parametrize("name", ["preregistration/target.yaml", "config.yaml"])
def test_a_file_that_is_not_yaml_is_one_line_saying_where(workflow, name):
    (workflow.root / name).write_text("experiment_id: x\narms: [qemu, drums\n")
    result = workflow.snakemake("-n")
    assert result.returncode != 0
    lines = env_ab_lines(result)
    assert lines == [lines[0]] and lines[0].startswith(f"env-ab: {name}: line 3 not valid YAML")
    assert "Traceback" not in result.stderr


def test_a_malformed_task_line_is_named_and_nothing_frozen_is_lost(workflow):
    """An existing task set (tasks.path) whose fourth line is cut short: the task set's freeze
    stops with one line naming the line; the frozen pre-registration stays as it was."""
    source = workflow.root / "tasks-in.jsonl"
    lines = [
        json.dumps(
            {
                "id": f"t{n}",
                "instruction": "Click OK.",
                "config": [],
                "evaluator": {"func": "values_match"},
            }
        )
        for n in range(3)
    ]
    source.write_text("\n".join([*lines, '{"id": "t3", "instr']) + "\n")

    def config(c):  # a task set of its own has no oracle demonstrations to warm-start on
        c.update(tasks={"path": "tasks-in.jsonl"})
        c["training"]["sft"]["enabled"] = False

    workflow.edit_config(config)
    result = workflow.snakemake("--until", "split")
    assert result.returncode != 0
    log = (workflow.root / "logs" / EXP / "tasks.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "tasks-in.jsonl:4: not JSON" in errors[0], log
    assert "Traceback" not in log
    receipt = workflow.root / "receipts" / EXP / "preregistration.json"
    verified = workflow.python("-m", "envab.verify", "--receipts", str(receipt))
    assert verified.returncode == 0, verified.stdout


def test_an_unreachable_host_is_one_line_before_any_work(monkeypatch):
    monkeypatch.setenv("DRUMS_TOKEN", "t")
    arm = {"backend": "drums", "url": "http://127.0.0.1:9"}
    with pytest.raises(ArmError) as refused, open_arm(arm):
        pass
    message = str(refused.value)
    assert "\n" not in message and "http://127.0.0.1:9 does not answer" in message


def test_a_refused_token_is_one_line_and_never_shows_the_token(tmp_path):
    right = write_token_file(tmp_path / "right.token")
    wrong = write_token_file(tmp_path / "wrong.token")
    with serve_embedded("fork", right) as url:
        arm = {"backend": "drums", "url": url, "token_file": str(wrong)}
        with pytest.raises(ArmError) as refused, open_arm(arm):
            pass
    message = str(refused.value)
    assert "\n" not in message and "refused the token (401)" in message
    for token in (right, wrong):
        assert token.read_text().strip() not in message


def test_no_token_at_all_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("DRUMS_TOKEN", raising=False)
    monkeypatch.delenv("DRUMS_TOKEN_FILE", raising=False)
    arm = {"backend": "drums", "url": "http://127.0.0.1:9", "token_file": str(tmp_path / "none")}
    with pytest.raises(ArmError, match="token file .*none: No such file"), open_arm(arm):
        pass


def test_a_checkpoint_write_that_runs_out_of_room_leaves_nothing_half_written(tmp_path):
    """Files limited to 64 KiB (RLIMIT_FSIZE, the kernel refusing as a full disk would): the
    model's weights cannot be written. The error is an OSError naming the cause, and neither the
    checkpoint nor its temporary folder is left behind."""
    script = textwrap.dedent(
        f"""
        import resource, sys
        from pathlib import Path
        from envab.trainer.callback import save_checkpoint
        from envab.trainer.model import load
        from envab.trainer.tiny_model import build
        model, processor = load(build(["Click OK."], {str(tmp_path / "model")!r}))
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        try:
            save_checkpoint(model, processor, Path({str(tmp_path / "ckpt" / "valid-000002")!r}))
        except OSError as e:  # what the trainer's main turns into one line and exit status 2
            print("error:", e)
            sys.exit(2)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 2, result.stdout + result.stderr[-3000:]
    assert result.stdout.startswith("error: checkpoint valid-000002 not written: ")
    assert "File too large" in result.stdout
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == []  # no half-written folder
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY
