"""The run's journal on its own: a roll back to the last resume point, the outputs as links that
outlive their deletion, the sampler a resumed run draws the same order from. The whole resume
(a real run killed and rerun by Snakemake) is in test_train.py."""

from __future__ import annotations

import json

import pytest
from trl.trainer.utils import RepeatSampler

from envab.io import append_jsonl
from envab.trainer.resume import EpochSeededSampler, Journal, ResumePoint, moment


def point(journal: Journal, checkpoint: str, trl: str | None, wall: float) -> ResumePoint:
    return ResumePoint(
        checkpoint=checkpoint,
        global_step=3,
        trl_checkpoint=trl,
        offsets=journal.offsets(),
        ledger={"wall_clock_s": wall},
        draws=[{"resets": 12, "backend": None}],
        utc="2026-01-01T00:00:00.000000Z",
    )


def test_a_restart_cuts_every_record_back_to_the_resume_point(tmp_path):
    journal = Journal(tmp_path)
    assert journal.open() is None  # nothing to resume: an empty journal
    records = journal.records
    append_jsonl(records["trajectories"], {"n": 0, "verdict": "valid"})
    append_jsonl(records["checkpoints"], {"checkpoint": "valid-000002"})
    append_jsonl(records["steps"], {"step": 1})
    (journal.checkpoints / "valid-000002").mkdir()
    (journal.trl / "checkpoint-1").mkdir()
    journal.save_point(point(journal, "valid-000002", "checkpoint-1", wall=10.0))
    # What the process did after the point, then died in the middle of a line.
    append_jsonl(records["trajectories"], {"n": 1, "verdict": "valid"})
    append_jsonl(records["trajectories"], {"n": 2, "verdict": "env_failure"})
    with records["trajectories"].open("a") as f:
        f.write('{"n": 3, "verd')
    append_jsonl(records["checkpoints"], {"checkpoint": "valid-000004"})
    append_jsonl(records["steps"], {"step": 2})
    (journal.checkpoints / "valid-000004").mkdir()
    (journal.checkpoints / ".valid-000006.tmp").mkdir()  # a checkpoint write cut short
    (journal.trl / "checkpoint-2").mkdir()
    (journal.trl / "README.md").write_text("TRL's model card")
    journal.beat(14.5)

    restart = Journal(tmp_path).open()
    assert (restart.lost, restart.lost_s, restart.wall_clock_s) == (2, 4.5, 14.5)
    assert restart.point.draws == [{"resets": 12, "backend": None}]
    read = lambda stem: [json.loads(x) for x in records[stem].read_text().splitlines()]  # noqa: E731
    assert read("trajectories") == [{"n": 0, "verdict": "valid"}]
    assert read("checkpoints") == [{"checkpoint": "valid-000002"}]
    assert read("steps") == [{"step": 1}]
    assert [p.name for p in journal.checkpoints.iterdir()] == ["valid-000002"]
    assert sorted(p.name for p in journal.trl.iterdir()) == ["README.md", "checkpoint-1"]
    lost = [json.loads(x) for x in journal.lost_path.read_text().splitlines()]
    assert [(a["n"], a["lost"]) for a in lost] == [(1, True), (2, True)]


def test_outputs_are_links_that_outlive_their_deletion(tmp_path):
    journal = Journal(tmp_path / "run")
    journal.open()
    (journal.checkpoints / "valid-000000" / "sub").mkdir(parents=True)
    (journal.checkpoints / "valid-000000" / "sub" / "w.bin").write_bytes(b"weights")
    outputs = {stem: tmp_path / "run" / f"{stem}.jsonl" for stem in journal.records}
    checkpoints = tmp_path / "run" / "checkpoints"
    journal.link_outputs(outputs, checkpoints)
    append_jsonl(outputs["trajectories"], {"n": 0})  # through the output's name
    for path in outputs.values():  # what Snakemake does to a failed job's outputs
        path.unlink()
    assert journal.records["trajectories"].read_text() == '{"n": 0}\n'
    journal.link_outputs(outputs, checkpoints)  # and back, on the restart
    assert outputs["trajectories"].read_text() == '{"n": 0}\n'
    assert (checkpoints / "valid-000000" / "sub" / "w.bin").read_bytes() == b"weights"
    assert journal.restarts() == []
    journal.close(tmp_path / "run")
    assert not journal.dir.exists()
    assert outputs["trajectories"].read_text() == '{"n": 0}\n'  # the data outlives the journal


def test_an_epochs_order_is_trls_whatever_ran_before():
    def drawn(sampler, epochs):
        for epoch in epochs:
            if epoch is not None:
                sampler.set_epoch(epoch)
            order = list(sampler)
        return order

    make = lambda cls: cls(range(10), mini_repeat_count=2, batch_size=2, seed=7)  # noqa: E731
    trl = [drawn(make(RepeatSampler), [None] * (e + 1)) for e in range(3)]  # one process
    assert trl[0] != trl[1] != trl[2]
    for e in range(3):
        assert drawn(make(EpochSeededSampler), [e]) == trl[e]  # a run resumed in epoch e
        assert drawn(make(EpochSeededSampler), list(range(e + 1))) == trl[e]


def test_an_unknown_kill_moment_is_refused(monkeypatch):
    monkeypatch.setenv("ENVAB_KILL_AT", "lunch:1")
    with pytest.raises(ValueError, match="not one of"):
        moment("generation")
