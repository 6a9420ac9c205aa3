"""A whole OSWorld task set loads: what a task file leaves out takes OSWorld's meaning, every task
gets a per-task report (runnable on the X desktop, or why not, by named reasons), and a
registered rule (config `tasks.osworld.select`) chooses the frozen subset instead of the loader
stopping at the first task it cannot run. The sets here are written by the tests in OSWorld's
shape; the last test runs on OSWorld's own `evaluation_examples` when ENVAB_OSWORLD_EXAMPLES
names that folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHIPPED_EXP as EXP

from envab.envs.osworld.source import (
    TaskSourceError,
    check_rule,
    is_infeasible,
    load_dir,
    load_jsonl,
    original,
    select,
)

DESKTOP_CHECK = {  # what OSWorld's os tasks score with, all of it served by the X desktop
    "func": "exact_match",
    "result": {"type": "vm_command_line", "command": "cat /root/out.txt"},
    "expected": {"type": "rule", "rules": {"expected": "done"}},
}
DOWNLOAD = {
    "type": "download",
    "parameters": {"files": [{"url": "http://127.0.0.1:9/notes.docx", "path": "/root/n.docx"}]},
}


def task(tid: str, **fields) -> dict:
    return {"id": tid, "instruction": f"Do {tid}.", "config": [], "evaluator": DESKTOP_CHECK,
            **fields}  # fmt: skip


# domain -> tasks; `None` for the field a file leaves out
SET = {
    "os": [
        task("plain-1", config=[{"type": "execute", "parameters": {"command": ["true"]}}]),
        {
            "id": "infeasible-1",
            "instruction": "Do the impossible.",
            "evaluator": {"func": "infeasible"},
        },  # fmt: skip
        task("download-1", config=[DOWNLOAD]),
        task("unsafe-1", evaluator={**DESKTOP_CHECK, "func": "check_gnome_favorite_apps"}),
    ],
    "chrome": [task("shared-1", related_apps=["chrome"])],
    "thunderbird": [task("shared-1", instruction="Another task.", related_apps=["thunderbird"])],
}


def write_set(root: Path, tasks: dict = SET, listing: dict | None = None) -> Path:
    for domain, items in tasks.items():
        for t in items:
            path = root / "examples" / domain / f"{t['id']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(t, indent=2))
    listing = listing or {d: [t["id"] for t in items] for d, items in tasks.items()}
    (root / "test_all.json").write_text(json.dumps(listing))
    return root


def freeze(root: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envab.envs.osworld", "--dir", str(root),
         "--index", str(root / "test_all.json"), "--tasks", str(out / "tasks.jsonl"),
         "--sources", str(out / "sources"), "--report", str(out / "index.json"), *extra],
        capture_output=True, text=True,
    )  # fmt: skip


def test_unless_the_rule_says_runnable_only_every_task_it_cannot_score_is_named(tmp_path):
    root = write_set(tmp_path / "set")
    with pytest.raises(TaskSourceError, match="task unsafe-1: metric 'check_gnome_favorite_apps'"):
        load_dir(root, root / "test_all.json")  # no rule: the unscorable task refuses
    result = freeze(root, tmp_path / "out")
    assert result.returncode == 2 and "task unsafe-1" in result.stderr
    assert "shared-1" not in result.stderr  # two contents under one id: renamed, not refused
    rule = {"runnable": False}
    result = freeze(root, tmp_path / "out", "--select", json.dumps(rule))
    assert result.returncode == 2 and not (tmp_path / "out" / "tasks.jsonl").exists()
    errors = result.stderr.splitlines()
    assert errors == [
        "error: examples/os/unsafe-1.json: task unsafe-1: metric 'check_gnome_favorite_apps' "
        "runs code on the host (eval)",
        "error: 1 of 6 tasks cannot be scored here; nothing written (a registered rule, "
        "tasks.osworld.select: {runnable: true}, leaves them out and reports why)",
    ]
    result = freeze(root, tmp_path / "out", "--select", "{}", "--runnable", "xdesktop")
    assert result.returncode == 2
    assert "cannot run on the X desktop; nothing written" in result.stderr.splitlines()[-1]
    for named in (
        "download-1.json: task download-1: config[0].parameters.files[0]: "
        "http://127.0.0.1:9/notes.docx: not frozen (the tasks job freezes it with --files)",
        "unsafe-1.json: task unsafe-1: metric 'check_gnome_favorite_apps' runs code",
    ):
        assert named in result.stderr


def test_a_rule_selects_what_runs_and_the_report_says_why_each_other_task_is_out(tmp_path):
    root = write_set(tmp_path / "set")
    rule = json.dumps({"runnable": True})
    out = [tmp_path / "a", tmp_path / "b"]
    for o in out:
        result = freeze(root, o, "--select", rule, "--runnable", "xdesktop")
        assert result.returncode == 0, result.stderr
    for name in ("tasks.jsonl", "index.json"):  # byte for byte, freeze after freeze
        assert (out[0] / name).read_bytes() == (out[1] / name).read_bytes()
    frozen = [json.loads(line) for line in (out[0] / "tasks.jsonl").read_text().splitlines()]
    # an infeasible task runs: the host scores it from the agent's last action
    assert [t["id"] for t in frozen] == ["infeasible-1", "plain-1"]
    report = json.loads((out[0] / "index.json").read_text())
    assert report["loaded"] == 6 and report["tasks"] == 2
    assert report["selection"] == {
        "rule": {"runnable": True}, "world": "xdesktop", "selected": 2, "left_out": 4,
    }  # fmt: skip
    reasons = {key: row["reasons"]["xdesktop"] for key, row in report["per_task"].items()}
    assert reasons == {
        "chrome/shared-1": ["app:chrome"],
        "os/download-1": ["file:not_frozen"],  # no --files here: tests/test_task_files.py
        "os/infeasible-1": [],
        "os/plain-1": [],
        "os/unsafe-1": ["unsafe:metric:check_gnome_favorite_apps"],
        "thunderbird/shared-1": ["app:thunderbird"],
    }
    assert not report["per_task"]["os/unsafe-1"]["selected"]  # never, whatever the rule
    assert report["runnable"]["xdesktop"]["os"] == {"runnable": 2, "total": 4}
    assert report["per_task"]["chrome/shared-1"]["domain"] == "chrome"
    assert report["per_task"]["chrome/shared-1"]["id"] == "chrome.shared-1"
    assert report["reasons"]["xdesktop"]["file:not_frozen"] == 1
    # the infeasible task counted apart: runnable, but no getter or metric of it ever runs
    assert report["infeasible"] == {"total": 1, "runnable": {"xdesktop": 1}, "selected": 1}
    assert report["per_task"]["os/infeasible-1"]["infeasible"] is True
    assert "infeasible" not in report["per_task"]["os/plain-1"]
    assert "1 of those frozen infeasible" in result.stdout
    # every file is kept byte for byte, the ones the rule left out too
    copies = sorted(str(p.relative_to(out[0] / "sources")) for p in out[0].rglob("*.json")
                    if "sources" in p.parts)  # fmt: skip
    assert copies == sorted(str(p.relative_to(root)) for p in root.glob("examples/*/*.json"))


def test_a_sample_named_by_ids_keeps_those_and_an_unknown_id_refuses_the_rule(tmp_path):
    frozen = load_dir(write_set(tmp_path), strict=False)
    chosen = select(frozen, {"runnable": True, "ids": ["plain-1"]}, "xdesktop")
    assert [t.task["id"] for t in chosen.tasks] == ["plain-1"]
    everything = select(frozen, {"runnable": True}, "xdesktop")
    assert len(everything.tasks) > 1 and "plain-1" in {t.task["id"] for t in everything.tasks}
    with pytest.raises(TaskSourceError, match=r"select.ids: \['plain-2'\] not in the task set"):
        select(frozen, {"runnable": True, "ids": ["plain-2"]}, "xdesktop")
    with pytest.raises(TaskSourceError, match="select.ids must be a non-empty list of task ids"):
        check_rule({"ids": ["../x"]})


@pytest.mark.parametrize("strict", [False, True], ids=["under a rule", "strict"])
def test_a_file_without_config_has_no_set_up_and_one_id_with_two_contents_is_two_tasks(
    tmp_path, strict
):
    # strict refuses an unscorable task, never two contents under one id: a set without the
    # unscorable one freezes as it is, the collision renamed
    scorable = {**SET, "os": [t for t in SET["os"] if t["id"] != "unsafe-1"]}
    root = write_set(tmp_path / "set", scorable if strict else SET)
    frozen = load_dir(root, root / "test_all.json", strict=strict)
    by_id = {t.task["id"]: t for t in frozen.tasks}
    infeasible = by_id["infeasible-1"].task
    assert infeasible["config"] == [] and infeasible["defaulted"] == ["config"]
    assert original(infeasible) == json.loads((root / "examples/os/infeasible-1.json").read_text())
    # OSWorld names a task by domain and id: each content keeps its file's id in source_id
    assert {"chrome.shared-1", "thunderbird.shared-1"} <= set(by_id) and "shared-1" not in by_id
    assert original(by_id["thunderbird.shared-1"].task)["id"] == "shared-1"
    renamed = ["chrome.shared-1", "thunderbird.shared-1"]
    assert {"id": "shared-1", "domains": ["chrome", "thunderbird"], "renamed": renamed} in (
        frozen.duplicates
    )
    chosen = select(frozen, {"domains": ["chrome", "thunderbird"]})
    assert [t.task["id"] for t in chosen.tasks] == ["chrome.shared-1", "thunderbird.shared-1"]
    with pytest.raises(TaskSourceError, match=r"select.domains: \['vlc'\] not in the task set"):
        select(frozen, {"domains": ["vlc"]})
    for bad in ({"domain": ["os"]}, {"domains": []}, {"runnable": "yes"}, ["os"]):
        with pytest.raises(TaskSourceError, match="select"):
            check_rule(bad)


@pytest.mark.parametrize(
    ("listing", "named"),
    [
        ({"os": ["plain-1", "../x"]}, "id '../x' is not a plain name"),
        ({"os/../chrome": ["plain-1"]}, "domain 'os/../chrome' is not a plain name"),
        ({"chrome/extra": ["plain-1"]}, "domain 'chrome/extra' is not a plain name"),
        ({"os": [""]}, "id '' is not a plain name"),
        ({"..": ["plain-1"]}, "domain '..' is not a plain name"),
    ],
    ids=["id ../x", "domain with ..", "domain with a slash", "empty id", "domain .."],
)
def test_an_id_or_domain_that_is_not_a_plain_name_is_refused_with_the_file(
    tmp_path, listing, named
):
    root = write_set(tmp_path / "set", listing=listing)
    for strict in (True, False):
        with pytest.raises(TaskSourceError) as refused:
            load_dir(root, root / "test_all.json", strict=strict)
        assert str(refused.value) == f"{root / 'test_all.json'}: {named} " + (
            "(no path separator, not empty, . or ..)"
        )
    result = freeze(root, tmp_path / "out", "--select", '{"runnable": true}')
    assert result.returncode == 2 and named in result.stderr


def test_a_task_id_that_is_not_a_plain_name_is_refused_with_its_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task("ok")) + "\n" + json.dumps(task("../x")) + "\n")
    with pytest.raises(TaskSourceError, match=r"^tasks.jsonl:2: id '../x' is not a plain name"):
        load_jsonl(path)
    path.write_text(json.dumps({k: v for k, v in task("ok").items() if k != "config"}) + "\n")
    with pytest.raises(TaskSourceError, match=r"^tasks.jsonl:1: task ok: .* must name its set-up"):
        load_jsonl(path)  # kept line for line: a line says its set-up itself


def test_every_official_task_loads_and_the_report_names_why_each_other_one_is_out(
    tmp_path, osworld_examples
):
    root = osworld_examples
    listing = json.loads((root / "test_all.json").read_text())
    entries = {(d, i) for d, ids in listing.items() for i in ids}
    out = [tmp_path / "a", tmp_path / "b"]
    for o in out:
        result = freeze(root, o, "--select", '{"runnable": true}', "--runnable", "xdesktop")
        assert result.returncode == 0, result.stderr
    for name in ("tasks.jsonl", "index.json"):
        assert (out[0] / name).read_bytes() == (out[1] / name).read_bytes()
    report = json.loads((out[0] / "index.json").read_text())
    assert set(report["per_task"]) == {f"{d}/{i}" for d, i in entries}  # every task, reported
    assert report["tasks"] >= 1
    for key, row in report["per_task"].items():
        reasons = row["reasons"]["xdesktop"]
        assert row["selected"] == (not reasons), key  # out only with a named reason
        assert all(":" in r for r in reasons), key
    unsafe = [k for k, r in report["per_task"].items() if any(
        x.startswith("unsafe:") for x in r["reasons"]["xdesktop"])]  # fmt: skip
    assert unsafe and not any(report["per_task"][k]["selected"] for k in unsafe)


def test_on_the_full_image_a_live_page_and_an_infeasible_task_are_counted_apart(
    tmp_path, osworld_examples
):
    """OSWorld's set on the full image: a task scored on a live page's content is left out by
    its host (`web:<host>`), never counted runnable, and infeasible tasks (scored from the last
    action, no getter or metric run) are counted apart among those frozen."""
    result = freeze(osworld_examples, tmp_path, "--select", '{"runnable": true}',
                    "--runnable", "xdesktop", "--image", "full")  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "index.json").read_text())
    web = {r for row in report["per_task"].values() for r in row["reasons"]["xdesktop"]
           if r.startswith("web:")}  # fmt: skip
    assert web and "web:page" not in web  # each named by its host
    for key, row in report["per_task"].items():
        if any(r.startswith("web:") for r in row["reasons"]["xdesktop"]):
            assert not row["selected"], key
    frozen = [json.loads(line) for line in (tmp_path / "tasks.jsonl").open()]
    infeasible = [t for t in frozen if is_infeasible(t)]
    assert infeasible and report["infeasible"]["selected"] == len(infeasible)
    assert "frozen infeasible (scored from the last action)" in result.stdout + result.stderr


def test_the_workflow_freezes_what_the_registered_rule_selects(workflow):
    """With an arm on the X desktop and `select: {runnable: true}`, the fixture set freezes the
    tasks that desktop can run; the split receipt records the rule and what it left out."""
    import shutil

    fixture = Path(__file__).parent / "fixtures" / "osworld"
    shutil.copytree(fixture, workflow.root / "osworld")

    def config(c):
        c["tasks"] = {"osworld": {"dir": "osworld", "index": "osworld/test_all.json",
                                  "select": {"runnable": True}}}  # fmt: skip
        c["split"].update(stratify="domain", heldout_fraction=0.25)
        c["arms"]["drums"]["world"] = "xdesktop"
        c["training"]["sft"]["enabled"] = False  # no oracle demonstrations in this set

    workflow.edit_config(config)
    result = workflow.snakemake("--until", "split")
    assert result.returncode == 0, result.stderr[-3000:]
    receipt = json.loads((workflow.root / "receipts" / EXP / "split.json").read_text())
    selection = receipt["predicate"]["selection"]
    # the infeasible task among them runs: the host scores it from the agent's last action
    assert selection == {"rule": {"runnable": True}, "world": "xdesktop", "selected": 5,
                         "left_out": 6, "loaded": 11}  # fmt: skip
    assert receipt["predicate"]["tasks"] == 5
    assert any(s["name"].endswith("tasks/index.json") for s in receipt["subject"])


def test_the_noop_rule_reads_every_play_and_names_a_task_whose_plays_disagree():
    from envab.envs.osworld.source import check_noop_record, noop_gaps

    def entry(*scores):
        plays = [{"score": s, "valid": s is not None, "verdict": "valid"} for s in scores]
        return {**plays[0], "plays": plays}

    record = check_noop_record(
        {
            "image": "full",
            "tasks": {
                "steady-0": {"gvisor": entry(0.0, 0.0, 0.0), "qemu": entry(0.0, 0.0, 0.0)},
                "steady-1": {"gvisor": entry(1.0, 1.0, 1.0), "qemu": entry(1.0, 1.0, 1.0)},
                "flips": {"gvisor": entry(1.0, 0.0, 0.0), "qemu": entry(0.0, 0.0, 0.0)},
                "once": {"gvisor": {"score": 0.0, "valid": True}, "qemu": entry(0.0)},
                "broken": {"gvisor": entry(0.0, None, 0.0), "qemu": entry(0.0, 0.0, 0.0)},
            },
        },
        "full",
    )
    reasons = {tid: sorted({r for r, _ in noop_gaps(record, tid, 3)}) for tid in record["tasks"]}
    assert reasons == {
        "steady-0": [],
        "steady-1": ["noop:scores_1"],
        "flips": ["noop:nondeterministic"],
        "once": ["noop:unchecked"],  # one play where the rule reads three
        "broken": ["noop:invalid"],
    }
    # one play a sandbox, as before: the flip would not have been seen
    assert noop_gaps(record, "once", 1) == []
    with pytest.raises(TaskSourceError, match="noop_plays"):
        check_rule({"noop": "exclude", "noop_plays": 0})


PAGE = "https://www.example.org/flights"


def chrome_task(tid: str, getter: dict, opens: str = PAGE) -> dict:
    return task(
        tid,
        related_apps=["chrome"],
        config=[{"type": "chrome_open_tabs", "parameters": {"urls_to_open": [opens]}}],
        evaluator={"func": "exact_match", "result": getter,
                   "expected": {"type": "rule", "rules": {"expected": "x"}}},
    )  # fmt: skip


def test_a_task_scored_on_a_live_pages_content_is_named_by_its_host_one_on_its_address_is_not():
    from envab.envs.xdesktop.evaluate import blockers

    content = chrome_task("content", {"type": "active_tab_html_parse"})
    address = chrome_task("address", {"type": "active_url_from_accessTree"})
    named = chrome_task("named", {"type": "info_from_website", "url": "https://www.example.com/"})
    local = chrome_task("local", {"type": "active_tab_html_parse"}, opens="http://localhost:8080/")
    web = lambda t: [name for name, _ in blockers(t, "full") if name.startswith("web:")]  # noqa: E731
    assert web(content) == ["web:www.example.org"]  # the page the set-up opened
    assert web(address) == []  # a page that never loaded keeps its address
    assert web(named) == ["web:www.example.com"]  # the page the getter itself loads
    assert web(local) == []  # a page of this machine's
    filed = chrome_task("file", {"type": "active_tab_info"}, opens="file:///root/list.html")
    assert web(filed) == []  # a file the set-up wrote: this machine's too, not `web:page`
    unnamed = {**content, "config": []}
    assert web(unnamed) == ["web:page"]  # no address at all: the page the agent is to open
    # and the census counts it by its reason, the task left out under the runnable rule
    frozen = load_jsonl_text([content, address])
    report = select(frozen, {"runnable": True}, "xdesktop", image="full").report()
    assert report["reasons"]["xdesktop"].get("web:www.example.org") == 1
    assert [t.task["id"] for t in select(frozen, {"runnable": True}, "xdesktop",
                                         image="full").tasks] == ["address"]  # fmt: skip


def load_jsonl_text(tasks: list[dict]):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tasks.jsonl"
        path.write_text("".join(json.dumps({**t, "domain": "chrome"}) + "\n" for t in tasks))
        return load_jsonl(path)
