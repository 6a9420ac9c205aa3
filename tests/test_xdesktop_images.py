"""The X desktop's two images and what the task freeze reads of them: which applications each has
(a task naming one the arms' image lacks is `app:<name>`), an arm's `image`, and the registered
rule that leaves out a task whose untouched desktop already scores 1 (`select.noop: exclude`,
from the no-op record bench/noop_check.py writes). Nothing here builds an image: the full one is
built on request only (python -m envab.envs.xdesktop.image --image full)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envab.envs.arms import ArmError, open_arm
from envab.envs.osworld.source import TaskSourceError, load_dir, select
from envab.envs.xdesktop import apps, image

CHECK = {
    "func": "exact_match",
    "result": {"type": "vm_command_line", "command": "cat /root/out.txt"},
    "expected": {"type": "rule", "rules": {"expected": "done"}},
}


def task(tid: str, *related) -> dict:
    return {"id": tid, "instruction": f"Do {tid}.", "config": [], "evaluator": CHECK,
            "related_apps": list(related)}  # fmt: skip


SET = {
    "libreoffice_calc": [task("calc-1", "libreoffice_calc")],
    "chrome": [task("chrome-1", "chrome")],
    "gimp": [task("gimp-1", "gimp")],
    "vlc": [task("vlc-1", "vlc")],
    "thunderbird": [task("tb-1", "thunderbird")],
    "vs_code": [task("code-1", "vscode")],
    "os": [task("os-1", "os"), task("os-2", "terminal")],
}


def write_set(root: Path) -> Path:
    for domain, tasks in SET.items():
        for t in tasks:
            path = root / "examples" / domain / f"{t['id']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(t))
    return root


def test_the_full_image_has_osworlds_applications_but_vs_code_and_the_base_has_none():
    needs = {d: ts[0] for d, ts in SET.items()}
    assert apps.apps_missing(needs["libreoffice_calc"]) == ["libreoffice"]
    assert apps.apps_missing(needs["os"]) == []
    for domain in ("libreoffice_calc", "chrome", "gimp", "vlc", "thunderbird"):
        assert apps.apps_missing(needs[domain], "full") == [], domain
    # Debian has no build of VS Code: its tasks stay blocked on every image
    assert apps.apps_missing(needs["vs_code"], "full") == ["vscode"]
    assert apps.APPS["base"] < apps.APPS["full"]
    with pytest.raises(ValueError, match="image must be one of"):
        apps.apps_missing(needs["os"], "huge")


def test_the_report_judges_the_applications_of_the_image_it_is_told(tmp_path):
    frozen = load_dir(write_set(tmp_path), strict=False)
    rule = {"runnable": True}
    base = select(frozen, rule, "xdesktop").report()
    full = select(frozen, rule, "xdesktop", image="full").report()
    assert "image" not in base["selection"] and full["selection"]["image"] == "full"
    assert base["tasks"] == 2  # the os tasks
    assert base["per_task"]["gimp/gimp-1"]["reasons"]["xdesktop"] == ["app:gimp"]
    assert full["tasks"] == 7  # all but VS Code's
    assert full["per_task"]["vs_code/code-1"]["reasons"]["xdesktop"] == ["app:vscode"]
    assert full["reasons"]["xdesktop"] == {"app:vscode": 1}


def record(image_name: str = "base", **tasks) -> dict:
    return {"image": image_name, "tasks": tasks}


def both(gvisor, qemu=None, valid=True) -> dict:
    plays = {"gvisor": {"score": gvisor, "valid": valid}}
    if qemu is not None:
        plays["qemu"] = {"score": qemu, "valid": True}
    return plays


def test_noop_exclude_leaves_out_a_task_whose_untouched_desktop_scores_1(tmp_path):
    frozen = load_dir(write_set(tmp_path), strict=False)
    rule = {"runnable": True, "noop": "exclude"}
    noop = record(**{"os-1": both(0.0, 1.0), "os-2": both(0.0, 0.0)})
    report = select(frozen, rule, "xdesktop", noop=noop).report()
    assert list(report["source_sha256"]) == ["os-2"]
    assert report["per_task"]["os/os-1"]["reasons"]["xdesktop"] == ["noop:scores_1"]
    assert report["per_task"]["os/os-1"]["selected"] is False
    # a task never played, or played but not validly, is out too: the rule checks, not assumes
    noop = record(**{"os-1": both(None, valid=False), "os-2": both(0.5, 0.0)})
    report = select(frozen, rule, "xdesktop", noop=noop).report()
    assert report["per_task"]["os/os-1"]["reasons"]["xdesktop"] == ["noop:invalid"]
    assert report["per_task"]["os/os-2"]["selected"] is True  # partial credit is not 1
    report = select(frozen, rule, "xdesktop", noop=record(**{"os-1": both(0.0)})).report()
    assert report["per_task"]["os/os-2"]["reasons"]["xdesktop"] == ["noop:unchecked"]
    # a task left out for another reason is not asked about: its no-op was never due
    assert report["per_task"]["gimp/gimp-1"]["reasons"]["xdesktop"] == ["app:gimp"]


def test_noop_exclude_refuses_a_missing_malformed_or_other_images_record(tmp_path):
    frozen = load_dir(write_set(tmp_path), strict=False)
    rule = {"runnable": True, "noop": "exclude"}
    with pytest.raises(TaskSourceError, match="needs the no-op record"):
        select(frozen, rule, "xdesktop")
    with pytest.raises(TaskSourceError, match="played on the 'full' image"):
        select(frozen, rule, "xdesktop", noop=record("full"))
    with pytest.raises(TaskSourceError, match="must be"):
        select(frozen, rule, "xdesktop", noop={"image": "base", "tasks": {"os-1": {"gvisor": 1}}})
    with pytest.raises(TaskSourceError, match="select.noop must be"):
        select(frozen, {"noop": "keep"}, "xdesktop")


def test_the_cli_reads_the_image_and_the_noop_record(tmp_path):
    root = write_set(tmp_path / "set")
    noop = tmp_path / "noop.json"
    noop.write_text(
        json.dumps(
            record("full", **{t: both(0.0, 0.0) for t in ("calc-1", "chrome-1", "os-1", "os-2")})
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "envab.envs.osworld", "--dir", str(root), "--tasks",
         str(tmp_path / "t.jsonl"), "--report", str(tmp_path / "r.json"), "--runnable",
         "xdesktop", "--image", "full", "--noop", str(noop), "--select",
         '{"runnable": true, "noop": "exclude"}'],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["tasks"] == 4
    assert report["reasons"]["xdesktop"] == {"noop:unchecked": 3, "app:vscode": 1}


@pytest.mark.parametrize(
    "arm, message",
    [
        ({"world": "pillow", "image": "full"}, "needs world: xdesktop"),
        ({"world": "xdesktop", "image": "full", "rootfs": "/x"}, "give one"),
    ],
)
def test_an_arms_image_is_the_x_desktops_and_not_beside_a_rootfs(arm, message):
    arm = {"backend": "drums", "url": "embedded", "mode": "fork", **arm}
    with pytest.raises(ArmError, match=message), open_arm(arm):
        pass


def test_the_full_image_is_keyed_by_the_base_and_its_packages_and_never_the_default():
    import inspect

    base = "0" * 64
    assert image.full_inputs(base)["base"] == base
    assert image.full_inputs(base) != image.full_inputs("1" * 64)
    # what a bare call or command builds is the base: the full image is about 400 MB of packages
    assert inspect.signature(image.ensure_desktop).parameters["image"].default == "base"
    assert apps.DEFAULT_IMAGE == "base"


@pytest.mark.parametrize(
    "argv, runs_as",
    [
        (["-S", "sh", "-c", "cat; echo ran"], "ran"),  # the password line is sudo's, not CMD's
        (["-S", "-u", "charles", "--", "sh", "-c", "cat; echo ran"], "ran"),
        (["-E", "sh", "-c", "cat"], "password"),  # no -S: standard input stays the command's
    ],
)
def test_the_full_images_sudo_runs_the_command_reading_the_password_as_sudo_does(
    tmp_path, argv, runs_as
):
    """OSWorld's set-ups pipe a password into `sudo -S`; the stand-in (Debian's sudo cannot run
    in a gVisor sandbox) runs the command and leaves it none of that line."""
    sudo = tmp_path / "sudo"
    sudo.write_text(image.SUDO)
    done = subprocess.run(["sh", str(sudo), *argv], input="password\n", capture_output=True,
                          text=True, timeout=10)  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, runs_as), done.stderr
