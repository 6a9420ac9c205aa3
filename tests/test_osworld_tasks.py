"""OSWorld-format task sources: a folder of task files (with or without test_all.json) or a
tasks.jsonl, frozen byte for byte, split by domain, and refused where malformed with the file
and the reason. The fixture set (tests/fixtures/osworld) was written here in OSWorld's format:
11 tasks in four domains, one id listed under two, evaluators with postconfig, lists of metrics
and getters, options, and an infeasible task."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHIPPED_EXP as EXP

from envab.envs.osworld.source import TaskSourceError, load_dir, load_jsonl, original
from envab.split import split_tasks

REPO = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "osworld"
INDEX = FIXTURE / "test_all.json"


def files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(root.glob("examples/*/*.json"))}


def shared_id() -> str:
    listing = json.loads(INDEX.read_text())
    (tid,) = set(listing["os"]) & set(listing["multi_apps"])
    return tid


@pytest.mark.parametrize("index", [INDEX, None], ids=["index", "no-index"])
def test_a_folder_is_frozen_byte_for_byte_and_a_shared_id_is_one_task(index):
    frozen = load_dir(FIXTURE, index)
    ids = [t.task["id"] for t in frozen.tasks]
    assert len(ids) == len(set(ids)) == 11
    assert frozen.report()["per_domain"] == {
        "libreoffice_calc": 3,
        "libreoffice_writer": 2,
        "multi_apps": 1,  # the shared task, kept under the first domain in sorted order
        "os": 5,
    }
    assert frozen.duplicates == [
        {"id": shared_id(), "domains": ["multi_apps", "os"], "kept": "multi_apps"}
    ]
    for t in frozen.tasks:
        path = FIXTURE / "examples" / t.task["domain"] / f"{t.task['id']}.json"
        raw = path.read_bytes()
        assert t.raw == raw
        assert t.task["source_sha256"] == hashlib.sha256(raw).hexdigest()
        assert original(t.task) == json.loads(raw)  # nothing but the two added fields


def test_the_cli_gives_the_same_bytes_every_time_and_copies_every_file_unchanged(tmp_path):
    outs = []
    for run in ("a", "b"):
        out = tmp_path / run
        result = subprocess.run(
            [sys.executable, "-m", "envab.envs.osworld", "--dir", str(FIXTURE),
             "--index", str(INDEX), "--tasks", str(out / "tasks.jsonl"),
             "--sources", str(out / "osworld"), "--report", str(out / "index.json")],
            capture_output=True, text=True,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "11 frozen" in result.stdout and "1 ids named by two domains" in result.stdout
        outs.append({p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*.json*"))})
    assert outs[0] == outs[1]
    copies = files(tmp_path / "a" / "osworld")
    originals = files(FIXTURE)
    assert len(copies) == 11
    for name, copy in copies.items():
        assert copy.read_bytes() == originals[name].read_bytes()


def test_a_folder_frozen_without_copies_still_gives_one_line_a_task(tmp_path):
    """Without --sources a folder's tasks are still written one JSON object a line (not the
    files' own pretty-printed bytes, which a tasks.jsonl reader cannot read)."""
    out = tmp_path / "tasks.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "envab.envs.osworld", "--dir", str(FIXTURE),
         "--index", str(INDEX), "--tasks", str(out), "--report", str(tmp_path / "index.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 11
    assert [original(json.loads(line)) for line in lines] == [
        original(t.task) for t in load_dir(FIXTURE, INDEX).tasks
    ]


def test_a_task_the_x_desktop_cannot_run_or_score_is_refused_at_freeze(tmp_path):
    """--runnable xdesktop: an application the image lacks or a route this desktop lacks is
    named at freeze with its file, and nothing is written; a cloud_file expectation is not among
    them (the store serves it, tests/test_task_files.py), nor a Writer metric (its module's
    dependencies are pinned); the project's own X desktop tasks pass."""
    out = tmp_path / "tasks.jsonl"
    cli = [sys.executable, "-m", "envab.envs.osworld", "--runnable", "xdesktop",
           "--tasks", str(out), "--report", str(tmp_path / "index.json")]  # fmt: skip
    result = subprocess.run([*cli, "--dir", str(FIXTURE), "--index", str(INDEX)],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 2 and not out.exists()
    errors = result.stderr.splitlines()
    assert not any("compare_docx_files" in e for e in errors), errors
    assert any("application 'libreoffice'" in e for e in errors), errors
    assert not any("getter 'cloud_file'" in e for e in errors), errors
    assert all(e.startswith("error: ") for e in errors)
    assert "cannot run on the X desktop; nothing written" in errors[-1]
    ours = REPO / "envs" / "xdesktop" / "tasks"
    result = subprocess.run([*cli, "--dir", str(ours)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(out.read_text().splitlines()) == len(list((ours / "examples").rglob("*.json")))


def test_the_split_stratifies_by_domain_deterministically():
    tasks = [t.task for t in load_dir(FIXTURE, INDEX).tasks]
    a = split_tasks(tasks, seed=0, heldout_fraction=0.25, stratify="domain")
    b = split_tasks(list(reversed(tasks)), seed=0, heldout_fraction=0.25, stratify="domain")
    assert a == b
    held = {t["domain"] for t in a.heldout}
    assert held == {"libreoffice_calc", "libreoffice_writer", "os"}  # multi_apps has one task
    assert not set(a.train_ids) & set(a.heldout_ids)
    assert len(a.train) + len(a.heldout) == 11


def _malformed(tmp_path: Path, edit) -> Path:
    """A copy of the fixture folder with one edit made by `edit(root, listing)`."""
    root = tmp_path / "src"
    shutil.copytree(FIXTURE, root)
    listing = json.loads((root / "test_all.json").read_text())
    edit(root, listing)
    (root / "test_all.json").write_text(json.dumps(listing))
    return root


def _task_file(root: Path, domain: str, n: int = 0) -> Path:
    return sorted((root / "examples" / domain).glob("*.json"))[n]


def _edit_json(path: Path, change) -> None:
    task = json.loads(path.read_text())
    change(task)
    path.write_text(json.dumps(task))


MALFORMED = {
    "not JSON": (
        lambda root, _: _task_file(root, "os").write_text('{"id": "x", "instr'),
        "not JSON",
    ),
    "no instruction": (
        lambda root, _: _edit_json(_task_file(root, "os", 1), lambda t: t.pop("instruction")),
        "'instruction' must be a non-empty string",
    ),
    "config not a list": (
        lambda root, _: _edit_json(
            _task_file(root, "libreoffice_writer"), lambda t: t.update(config={"type": "open"})
        ),
        "config must be a list of steps",
    ),
    "a step without type": (
        lambda root, _: _edit_json(
            _task_file(root, "libreoffice_writer"), lambda t: t["config"][0].pop("type")
        ),
        "config[0] must be an object with a string 'type'",
    ),
    "results fewer than metrics": (
        lambda root, _: _edit_json(
            next(
                p
                for p in (root / "examples" / "libreoffice_calc").glob("*.json")
                if isinstance(json.loads(p.read_text())["evaluator"]["func"], list)
            ),
            lambda t: t["evaluator"]["result"].pop(),
        ),
        "evaluator.result must be a list of 2, one per metric",
    ),
    "postconfig not a list": (
        lambda root, _: _edit_json(
            _task_file(root, "libreoffice_writer", 1),
            lambda t: t["evaluator"].update(postconfig={"type": "sleep"}),
        ),
        "evaluator.postconfig must be a list of steps",
    ),
    "a getter without type": (
        lambda root, _: _edit_json(
            _task_file(root, "libreoffice_writer", 1),
            lambda t: t["evaluator"]["result"].pop("type"),
        ),
        "evaluator.result must be a getter",
    ),
    "options not an object": (
        lambda root, _: _edit_json(
            _task_file(root, "libreoffice_writer", 1),
            lambda t: t["evaluator"].update(options=["ignore_blanks"]),
        ),
        "evaluator.options must be an object",
    ),
    "bad conj": (
        lambda root, _: _edit_json(
            _task_file(root, "multi_apps"), lambda t: t["evaluator"].update(conj="xor")
        ),
        "evaluator.conj must be 'and' or 'or'",
    ),
    "id not its file name": (
        lambda root, _: _edit_json(_task_file(root, "os", 1), lambda t: t.update(id="renamed")),
        "its id 'renamed' is not its file name",
    ),
    "listed, no file": (
        lambda root, listing: listing["os"].append("0000-missing"),
        "listed in the index under os, but no such file",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_source_is_refused_with_its_file_and_reason(tmp_path, case):
    edit, reason = MALFORMED[case]
    root = _malformed(tmp_path, edit)
    with pytest.raises(TaskSourceError) as refused:
        load_dir(root, root / "test_all.json")
    message = str(refused.value)
    assert reason in message
    assert message.startswith("examples/") or message.startswith(str(root))
    result = subprocess.run(
        [sys.executable, "-m", "envab.envs.osworld", "--dir", str(root),
         "--index", str(root / "test_all.json"), "--tasks", str(tmp_path / "t.jsonl"),
         "--sources", str(tmp_path / "s"), "--report", str(tmp_path / "r.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"error: {message}"]
    assert not (tmp_path / "t.jsonl").exists()  # nothing half-frozen


def test_a_tasks_jsonl_is_kept_line_for_line_and_a_bad_line_is_named(tmp_path):
    tasks = [original(t.task) for t in load_dir(FIXTURE, INDEX).tasks]
    lines = [json.dumps(t, indent=None, separators=(", ", ": ")) for t in tasks[:4]]
    source = tmp_path / "tasks.jsonl"
    source.write_text("\n".join(lines) + "\n")
    frozen = load_jsonl(source)
    assert [t.raw.decode().rstrip("\n") for t in frozen.tasks] == lines
    source.write_text("\n".join([*lines[:3], '{"id": "t3", "instr']) + "\n")
    with pytest.raises(TaskSourceError, match=r"^tasks.jsonl:4: not JSON"):
        load_jsonl(source)
    source.write_text("\n".join([*lines[:3], lines[0]]) + "\n")
    with pytest.raises(TaskSourceError, match=r"^tasks.jsonl:4: id .* is also line 1"):
        load_jsonl(source)


def test_the_workflow_freezes_and_splits_an_osworld_folder_by_domain(workflow):
    shutil.copytree(FIXTURE, workflow.root / "osworld")

    def config(c):
        c["tasks"] = {"osworld": {"dir": "osworld", "index": "osworld/test_all.json"}}
        c["split"].update(stratify="domain", heldout_fraction=0.25)
        c["training"]["sft"]["enabled"] = False  # no oracle demonstrations in this set

    workflow.edit_config(config)
    result = workflow.snakemake("--until", "split")
    assert result.returncode == 0, result.stderr[-3000:]
    receipt = json.loads((workflow.root / "receipts" / EXP / "split.json").read_text())
    predicate = receipt["predicate"]
    assert predicate["stratify"] == "domain" and "``domain``" in predicate["rule"]
    assert predicate["tasks"] == 11
    assert set(predicate["per_domain"]["heldout"]) == {
        "libreoffice_calc",
        "libreoffice_writer",
        "os",
    }
    copies = files(workflow.root / "results" / EXP / "tasks" / "osworld")
    assert sorted(copies) == sorted(
        n for n in files(FIXTURE) if not n.startswith("examples/os/" + shared_id())
    )
    verified = workflow.python("-m", "envab.verify", f"receipts/{EXP}")
    assert verified.returncode == 0, verified.stdout


def test_with_an_arm_on_the_x_desktop_the_workflow_refuses_what_it_cannot_run(workflow):
    shutil.copytree(FIXTURE, workflow.root / "osworld")

    def config(c):
        c["tasks"] = {"osworld": {"dir": "osworld", "index": "osworld/test_all.json"}}
        c["arms"]["drums"]["world"] = "xdesktop"
        c["training"]["sft"]["enabled"] = False  # no oracle demonstrations in this set

    workflow.edit_config(config)
    result = workflow.snakemake("--until", "tasks")
    assert result.returncode != 0
    log = (workflow.root / "logs" / EXP / "tasks.log").read_text()
    assert "cannot run on the X desktop; nothing written" in log
    assert "application 'libreoffice' (related_apps) is not in the base image" in log


def test_every_fixture_task_names_metrics_and_getters_desktop_env_has():
    from envab.envs.tasks.evaluators import registry

    reg = registry()
    for t in load_dir(FIXTURE, INDEX).tasks:
        assert reg.missing(t.task) == [], t.task["id"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda ev: ev.update(func="no_such_metric"), "metric 'no_such_metric'"),
        (lambda ev: ev["result"].update(type="no_such_getter"), "result getter 'no_such_getter'"),
        (lambda ev: ev["expected"].update(type="lost_file"), "expected getter 'lost_file'"),
    ],
    ids=["metric", "result getter", "expected getter"],
)
def test_a_task_no_verifier_can_score_is_refused_at_freeze(tmp_path, change, named):
    """A metric or getter that neither desktop-env nor this project's checkers provide would
    fail at the first verification, hours into training: the freeze refuses it, naming it."""
    from envab.envs.tasks.evaluators import registry

    root = _malformed(
        tmp_path,
        lambda root, _: _edit_json(
            _task_file(root, "libreoffice_writer"), lambda t: change(t["evaluator"])
        ),
    )
    with pytest.raises(TaskSourceError) as refused:
        load_dir(root, root / "test_all.json")
    message = str(refused.value)
    assert message.startswith("examples/libreoffice_writer/")
    assert named in message and f"desktop-env {registry().version}" in message


def test_every_metric_module_of_desktop_env_loads_here():
    """The metrics' dependencies are pinned (pyproject.toml), so every module of desktop-env's
    metrics imports here, unchanged; one that cannot is a named reason at freeze."""
    from envab.envs.xdesktop import evaluate

    reg = evaluate.registry()
    first = {}
    for (kind, name), module in sorted(reg.modules.items()):
        if kind == "metrics":
            first.setdefault(module, name)
    assert set(first) >= {"docs", "slides", "chrome", "pdf", "others", "vscode", "vlc", "table"}
    for name in first.values():
        evaluate.load("metrics", name)


def test_every_getter_the_x_desktop_serves_loads_and_reads_only_the_servers_routes():
    """A served getter is loaded in the checker before it drops root (evaluate.preload): each
    loads here, and what each reads is a route the in-environment server has, the host's
    cloud-file route, or the browser's port; only the port's getters open it."""
    from envab.envs.tasks.staging import CLOUD_FILE_ROUTE
    from envab.envs.xdesktop import evaluate, server

    def served(route: str) -> bool:  # as the server dispatches a route (Routes.handle)
        return route in (CLOUD_FILE_ROUTE, evaluate.BROWSER) or hasattr(
            server.Routes, "r_" + route.strip("/").replace("/", "_")
        )

    for getter, reads in evaluate.SERVED_GETTERS.items():
        evaluate.load("getters", f"get_{getter}")
        assert all(served(route) for route in reads), getter
    ev = {"func": "is_expected_tabs", "result": {"type": "open_tabs_info"},
          "expected": {"type": "rule", "rules": {"type": "url", "urls": []}}}  # fmt: skip
    assert evaluate.asks_browser(ev)
    assert not evaluate.asks_browser({**ev, "result": {"type": "bookmarks"}})
    assert not evaluate.asks_browser({"func": "infeasible"})
    assert evaluate.BROWSER not in evaluate.ROUTES


def test_a_metric_whose_module_cannot_load_is_a_named_reason(monkeypatch):
    from envab.envs.xdesktop import evaluate

    monkeypatch.setitem(sys.modules, "librosa", None)  # as on a machine without it
    monkeypatch.delitem(sys.modules, "desktop_env.evaluators.metrics.vlc", raising=False)
    with pytest.raises(evaluate.Unavailable, match=r"'compare_images' \(vlc.py\) cannot load here"):
        evaluate.load("metrics", "compare_images")
    task = {
        "id": "t",
        "related_apps": [],
        "evaluator": {
            "func": "compare_images",
            "result": {"type": "vm_file", "path": "/a.png", "dest": "a.png"},
            "expected": {"type": "vm_file", "path": "/b.png", "dest": "b.png"},
        },
    }
    reasons = dict(evaluate.blockers(task))
    assert "cannot load here" in reasons["metric:compare_images"], reasons
