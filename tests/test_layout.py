"""The run layout's one home (envab/layout.py): the paths it gives, the runs it reads back from a
receipt's names, and no other module of the pipeline spelling results/ or receipts/ itself."""

from __future__ import annotations

import re
from pathlib import Path

from envab.layout import Layout, judged_beside

REPO = Path(__file__).resolve().parent.parent
# A path built by hand: "results" or "receipts" joined with `/`, or an f-string that starts there.
SPELLED = re.compile(r'"(results|receipts)" */|/ *"(results|receipts)"|f"(results|receipts)/')


def test_the_layout_names_every_folder_of_an_experiment():
    layout = Layout("exp-v1")
    assert layout.results == Path("results/exp-v1")
    assert layout.receipts == Path("receipts/exp-v1")
    assert (layout.logs, layout.benchmarks) == (Path("logs/exp-v1"), Path("benchmarks/exp-v1"))
    assert layout.run("drums", 3) == Path("results/exp-v1/drums/seed3")
    assert layout.evaluations == Path("results/exp-v1/evaluations")
    # the judge's records beside the store, never inside the run's folder
    assert layout.judged("qemu", 2) == Path("results/exp-v1/judged/qemu/seed2")
    assert judged_beside(layout.evaluations, "qemu", 2) == layout.judged("qemu", 2)
    # a Snakemake pattern where the wildcards stand for the arm and the seed
    assert layout.run("{arm}", "{seed}").as_posix() == "results/exp-v1/{arm}/seed{seed}"
    assert Layout("exp-v1", Path("bundle")).receipts == Path("bundle/receipts/exp-v1")


def test_a_run_is_read_back_only_from_its_own_file_of_its_own_experiment():
    layout = Layout("exp-v1")
    assert layout.run_of("results/exp-v1/drums-aa/seed12/run.json", "run.json") == (
        "drums-aa",
        "12",
    )
    for other in (
        "results/exp-v2/drums/seed1/run.json",  # another experiment
        "results/exp-v1/drums/seed1/steps.jsonl",  # another file
        "results/exp-v1/drums/seed1/checkpoints/run.json",  # deeper
        "results/exp-v1/selections/arm-drums/run.json",  # not a run
        "../results/exp-v1/drums/seed1/run.json",
    ):
        assert layout.run_of(other, "run.json") is None, other


def test_the_layout_has_one_home():
    """No module of the pipeline, rule, stage or benchmark spells the layout itself; and the
    check names a module that does."""
    stages = ("envab", "trainer", "eval", "analysis", "envs", "bench")
    files = [p for d in stages for p in (REPO / d).rglob("*.py")]
    files += [*(REPO / "rules").glob("*.smk"), REPO / "Snakefile"]
    spelled = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in files
        if path.name != "layout.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if SPELLED.search(line) and not line.lstrip().startswith("#")
    ]
    assert not spelled, "the run layout spelled outside envab/layout.py:\n" + "\n".join(spelled)
    for by_hand in ('root / "results" / exp', 'f"receipts/{EXP}/code.json"'):
        assert SPELLED.search(by_hand), by_hand
