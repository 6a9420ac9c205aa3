"""A real run that fails says why in the test's assertion message: the last lines of each failed
job's log are added to its stderr (tests/conftest.py, `Workflow.snakemake`), which a CI log keeps
where the job logs themselves are gone."""

from __future__ import annotations

from conftest import Workflow

SNAKEFILE = """
rule fails:
    output: "out.txt"
    log: "logs/fails.log"
    shell: "(echo preparing; echo 'the environment failed: gate setup') > {log}; exit 3"

rule passes:
    output: "ok.txt"
    log: "logs/passes.log"
    shell: "echo fine > {log}; touch {output}"
"""


def test_a_failed_jobs_log_tail_is_in_the_runs_stderr_and_a_passing_run_adds_nothing(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    workflow = Workflow(tmp_path)
    failed = workflow.snakemake("out.txt", timeout=120)
    assert failed.returncode != 0
    assert "--- logs/fails.log (last 2 lines) ---" in failed.stderr
    assert failed.stderr.rstrip().endswith("the environment failed: gate setup")
    passed = workflow.snakemake("ok.txt", timeout=120)
    assert passed.returncode == 0, passed.stderr[-2000:]
    assert "--- logs/" not in passed.stderr
