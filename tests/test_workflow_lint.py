"""The workflow as Snakemake's own linter and planner see it: lint-clean (every file a job reads
or writes declared, a log and a software definition per rule, no functions among the rules), and
the small `.test/` config plans the whole workflow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLEAN = "Congratulations, your workflow is in a good condition!"


def snakemake(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("where", [[], ["--directory", ".test"]], ids=["default", "test"])
def test_lint_is_clean(where):
    result = snakemake(*where, "--lint")
    assert result.returncode == 0 and CLEAN in result.stdout + result.stderr, (
        result.stdout[-3000:] + result.stderr[-3000:]
    )


def test_the_test_config_plans_every_stage():
    result = snakemake("--directory", ".test", "-n", "--forceall")
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("freeze_target", "tasks", "split", "model", "code_pins", "pins", "sft", "train"):
        assert f"rule {job}:" in result.stdout or f"checkpoint {job}:" in result.stdout, job
    assert "results/test-small-v1/drums/seed1/pins.json" in result.stdout


def test_lint_finds_an_undeclared_file(tmp_path):
    """The linter this test relies on does fail: a rule that reads a global path in its shell."""
    (tmp_path / "Snakefile").write_text(
        'SECRET = "x"\n\nrule a:\n    output: "a"\n    log: "a.log"\n'
        '    conda: "env.yaml"\n    shell: "cat {SECRET} > {output}"\n'
    )
    (tmp_path / "env.yaml").write_text("dependencies: [python]\n")
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert CLEAN not in result.stdout + result.stderr
    assert "SECRET" in result.stdout + result.stderr
