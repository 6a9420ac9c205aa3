"""The small run's golden checkpoint digests are data, per machine kind, and a command compares a
run with them: a moved digest fails it, an unknown machine kind says that nothing was compared."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from envab import digests

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16
processor\t: 1
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16
"""


def small_run(root: Path, weights: dict[str, str]) -> None:
    (root / "config.yaml").write_text("preregistration: target.yaml\n")
    (root / "target.yaml").write_text("experiment_id: test-small-v1\n")
    run = root / "results" / "test-small-v1" / "drums" / "seed1"
    run.mkdir(parents=True)
    lines = [
        json.dumps({"checkpoint": k, "files": {"model.safetensors": v}}) for k, v in weights.items()
    ]
    (run / "checkpoints.jsonl").write_text("\n".join(lines) + "\n")


def test_the_machine_kind_is_the_cpu_its_instruction_set_and_threads():
    kind = digests.machine_kind(CPUINFO, threads=2)
    assert kind == {
        "cpu": "AMD EPYC 9B14",
        "isa": ["avx", "avx2", "fma", "avx512f", "avx512_bf16"],
        "threads": 2,
    }
    assert digests.machine_kind(CPUINFO, threads=1) != kind  # other threads: another kind


def test_recorded_digests_pass_and_a_moved_one_fails(tmp_path, monkeypatch, capsys):
    small_run(tmp_path, {"valid-000000": "a" * 64, "valid-000016": "b" * 64})
    real = digests.machine_kind
    monkeypatch.setattr(digests, "machine_kind", lambda threads=None: real(CPUINFO, 2))
    assert digests.main(["check", str(tmp_path)]) == 0
    assert "nothing compared" in capsys.readouterr().out  # no entry yet: says so, claims nothing
    assert digests.main(["record", str(tmp_path)]) == 0
    entry = yaml.safe_load((tmp_path / "digests.yaml").read_text())["machines"][0]
    assert entry["checkpoints"]["valid-000016"] == "b" * 64
    assert digests.main(["check", str(tmp_path)]) == 0
    assert "unchanged (2 checkpoints" in capsys.readouterr().out
    records = tmp_path / "results" / "test-small-v1" / "drums" / "seed1" / "checkpoints.jsonl"
    records.write_text(records.read_text().replace("b" * 64, "c" * 64))
    assert digests.main(["check", str(tmp_path)]) == 1
    assert "valid-000016: recorded bbbbbbbbbbbb, this run cccccccccccc" in capsys.readouterr().out


def test_a_missing_run_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("preregistration: target.yaml\n")
    (tmp_path / "target.yaml").write_text("experiment_id: test-small-v1\n")
    assert digests.main(["check", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "run the small workflow first" in err and "\n" not in err


def test_the_shipped_digests_file_names_its_machine_kinds():
    shipped = Path(__file__).resolve().parent.parent / ".test" / digests.DIGESTS
    entries = digests.load(shipped)
    assert entries, "the .test digests are data, not prose"
    for entry in entries:
        assert set(entry["machine"]) == {"cpu", "isa", "threads"}
        assert all(len(v) == 64 for v in entry["checkpoints"].values())
