"""The census of an OSWorld set (bench/osworld_census.py, issue 49 item 1): per image and sandbox,
loaded, runnable by the freeze's judgement, the no-op record's results, and the rest blocked by
reason. Small set (test_xdesktop_images' one task an application), nothing built or played: a
record stands in for the play, and an image without one says it was not played and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_xdesktop_images import write_set

REPO = Path(__file__).resolve().parent.parent


def play(score, valid=True, verdict="valid"):
    return {"score": score, "valid": valid, "verdict": verdict}


def test_the_census_counts_per_image_and_sandbox_and_names_what_was_not_played(tmp_path):
    root = write_set(tmp_path / "set")
    record = {  # the full image's six runnable tasks, as noop_check would record them
        "image": "full",
        "tasks": {
            "os-1": {"gvisor": play(1.0), "qemu": play(1.0)},
            "os-2": {"gvisor": play(0.0), "qemu": play(None, False, "env_failure")},
            "calc-1": {"gvisor": play(0.0), "qemu": play(0.0)},
            "chrome-1": {"gvisor": play(0.0)},  # never played on QEMU
            "gimp-1": {"gvisor": play(0.0), "qemu": play(0.0)},
            "vlc-1": {"gvisor": play(0.0), "qemu": play(0.0)},
        },
    }
    (tmp_path / "noop.json").write_text(json.dumps(record))
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "osworld_census.py"), "--dir", str(root),
         "--noop", f"full={tmp_path / 'noop.json'}", "--out", str(tmp_path / "c.json"),
         "--cache", str(tmp_path / "no-build")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    c = json.loads((tmp_path / "c.json").read_text())
    base, full = c["images"]["base"], c["images"]["full"]
    assert (base["loaded"], base["runnable"], base["blocked"]) == (8, 2, 6)
    assert base["reasons"]["app:libreoffice"] == 1 and "app:vscode" in base["reasons"]
    assert (full["loaded"], full["runnable"], full["blocked"]) == (8, 7, 1)
    assert full["reasons"] == {"app:vscode": 1} and full["kinds"] == {"app": 1}
    # tb-1 is runnable on full but not in the record: counted as not played there
    assert full["noop"]["gvisor"] == {"played": 6, "scores_0": 5, "scores_1": 1,
                                      "not_played": 1, "invalid": {}}  # fmt: skip
    assert full["noop"]["qemu"] == {"played": 5, "scores_0": 3, "scores_1": 1,
                                    "not_played": 2, "invalid": {"env_failure": 1}}  # fmt: skip
    assert base["noop"] == {"gvisor": {}, "qemu": {}}
    assert base["noop_not_played"] == "not played (no --play, no --noop record)"
    assert "| full | qemu | 8 | 7 | 0 | 5 | 3 | 1 | 1 env_failure | 1 |" in out.stdout
    assert "- base on gvisor: not played (no --play, no --noop record)" in out.stdout

    # --play on an image that is not built plays nothing, and says so
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "osworld_census.py"), "--dir", str(root),
         "--images", "full", "--play", "--cache", str(tmp_path / "no-build")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"not played: the full image is not built under {tmp_path / 'no-build'}" in out.stdout
