"""OSWorld-format task sources, frozen byte for byte: a directory of task files or a tasks.jsonl.

    python -m envab.envs.osworld --dir DIR [--index test_all.json] --tasks OUT.jsonl \
        --sources OUT_DIR --report OUT.json
    python -m envab.envs.osworld --jsonl tasks.jsonl --tasks OUT.jsonl --report OUT.json

A directory is OSWorld's `evaluation_examples` layout: `examples/<domain>/<id>.json`, with or
without an index mapping domains to ids (OSWorld's `test_all.json`). Without an index every file
under `examples/` is a task. Each task file is copied unchanged to `--sources` (same layout), and
its line in the frozen tasks.jsonl is the file's JSON plus two fields the pipeline adds:
`domain` (the folder; the split can stratify by it) and `source_sha256` (the sha256 of the
file's original bytes). A tasks.jsonl is kept line for line; its tasks keep their own fields.

An id listed under two domains (or found in two domain folders) is one task when the files are
byte-identical: it is kept under the first domain in sorted order, and the report says which
domains named it. Two different files with one id, an id that is not its file's name, an index
entry without a file, a malformed task, and a task naming a metric or getter that no verifier
here provides (envs/tasks/evaluators.py: OSWorld's desktop-env, or this project's checkers) are
refused with the file (or line) and the reason. The same inputs always give the same bytes out.

A field a file leaves out takes OSWorld's meaning (no `config`: no set-up). With a registered
rule (`--select`, config `tasks.osworld.select`: domains, runnable only) every task loads, every
file is copied, and the rule chooses the frozen subset: the report says, per task, whether it
runs on each world or why not, by named reasons (`setup:chrome_open_tabs`, `getter:cache_file`,
`metric:compare_pptx_files`, `app:libreoffice` (against the X desktop image `--image` names),
`file:missing`, `noop:scores_1`, `unsafe:...`); a task no verifier may score is never selected.
With `--files` the files the chosen tasks download are frozen by content beside the set
(envs/tasks/fetch.py), their URL map in the report. Without a rule a task that cannot be
scored (or run on the `--runnable` world) refuses the freeze, every such task named.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envab.envs.tasks import fetch
from envab.envs.tasks.evaluators import INFEASIBLE, bare_file_name, missing_named, unsafe_named
from envab.envs.tasks.source import SourcedTask, TaskSourceError
from envab.envs.xdesktop.apps import DEFAULT_IMAGE, IMAGES, check_image
from envab.errors import Refusal
from envab.hashing import sha256_bytes
from envab.io import atomic_write_bytes, atomic_write_json, write_jsonl

ADDED = (
    "domain",
    "source_sha256",
    "defaulted",
    "source_id",
)  # the fields the freeze adds to a task's JSON
# OSWorld's meaning of an optional field a task file leaves out (desktop_env.py reads
# `task_config.get("config", [])`): no set-up. The frozen line says which it filled in.
DEFAULTS = {"config": []}
WORLDS = ("xdesktop",)  # the worlds a per-task report says each task can run on (or why not)
CONJ = ("and", "or")


@dataclass
class Frozen:
    tasks: list[SourcedTask]  # what is frozen: after `select`, the tasks the rule chose
    duplicates: list[dict] = field(default_factory=list)
    from_dir: bool = False  # an OSWorld folder (one file a task), not a tasks.jsonl
    # after `select`: every task loaded, and the per-task report (see `select`)
    loaded: list[SourcedTask] | None = None
    selection: dict | None = None
    # the frozen files of the tasks (url -> {sha256, size}; envs/tasks/fetch.py), when frozen
    files: dict | None = None

    def report(self) -> dict:
        by_domain: dict[str, int] = {}
        for t in self.tasks:
            domain = t.task.get("domain") or "_none"
            by_domain[domain] = by_domain.get(domain, 0) + 1
        return {
            "tasks": len(self.tasks),
            "per_domain": dict(sorted(by_domain.items())),
            "duplicates": self.duplicates,
            "source_sha256": {t.task["id"]: sha256_bytes(t.raw) for t in self.tasks},
            **(self.selection or {}),
            **({"files": self.files} if self.files is not None else {}),
        }


# --- one task -----------------------------------------------------------------------------------


def _steps(steps: Any, where: str) -> None:
    if not isinstance(steps, list):
        raise TaskSourceError(f"{where} must be a list of steps")
    for i, step in enumerate(steps):
        if not isinstance(step, Mapping) or not isinstance(step.get("type"), str):
            raise TaskSourceError(f"{where}[{i}] must be an object with a string 'type'")
        if not isinstance(step.get("parameters", {}), Mapping):
            raise TaskSourceError(f"{where}[{i}].parameters must be an object")


def _getters(value: Any, where: str) -> None:
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise TaskSourceError(f"{where} must be a getter: an object with a string 'type'")


def check_task(task: Any) -> dict:
    """`task` if it has OSWorld's shape, else TaskSourceError naming the first field that is wrong.

    id (a plain name), instruction, config (a list of {type, parameters} steps; absent, none)
    and evaluator: `func` a metric
    name or a list of them; with a list, `result`, `expected` and `options` (where given) are
    lists of the same length, one per metric; `conj` and or or; `postconfig` a list of steps.
    Only the shape: whether each metric and getter can run is the verifier's check."""
    if not isinstance(task, Mapping):
        raise TaskSourceError("a task must be a JSON object")
    tid = task.get("id")
    if not isinstance(tid, str) or not tid.strip():
        raise TaskSourceError("'id' must be a non-empty string")
    if not plain_name(tid):  # an id names files and folders downstream
        raise TaskSourceError(f"id {tid!r} is not a plain name (no path separator, not . or ..)")
    if not isinstance(task.get("instruction"), str) or not task["instruction"].strip():
        raise TaskSourceError(f"task {tid}: 'instruction' must be a non-empty string")
    if "config" in task:  # absent: no set-up (DEFAULTS)
        _steps(task["config"], f"task {tid}: config")
        from envab.envs.xdesktop.evaluate import screen_of  # the bounds a host will hold it to

        try:
            screen_of(task["config"])
        except ValueError as e:
            raise TaskSourceError(f"task {tid}: config: {e}") from None
    ev = task.get("evaluator")
    if not isinstance(ev, Mapping):
        raise TaskSourceError(f"task {tid}: 'evaluator' must be an object")
    func = ev.get("func")
    funcs = func if isinstance(func, list) else [func]
    if not funcs or not all(isinstance(f, str) and f for f in funcs):
        raise TaskSourceError(f"task {tid}: evaluator.func must be a metric name or a list of them")
    if "conj" in ev and ev["conj"] not in CONJ:
        raise TaskSourceError(f"task {tid}: evaluator.conj must be 'and' or 'or'")
    if "postconfig" in ev:
        _steps(ev["postconfig"], f"task {tid}: evaluator.postconfig")
    for key in ("result", "expected", "options"):
        if key not in ev:
            continue
        value = ev[key]
        if isinstance(func, list):
            if not isinstance(value, list) or len(value) != len(func):
                raise TaskSourceError(
                    f"task {tid}: evaluator.{key} must be a list of {len(func)}, one per metric"
                )
            items = value
        else:
            items = [value]
        for i, item in enumerate(items):
            where = f"task {tid}: evaluator.{key}" + (f"[{i}]" if isinstance(func, list) else "")
            if key == "options":
                if not isinstance(item, Mapping):
                    raise TaskSourceError(f"{where} must be an object")
            elif item is not None and item != {}:  # OSWorld writes {} or null for "none"
                _getters(item, where)
    return dict(task)


def plain_name(name: Any) -> bool:
    """An id or domain that can name a file or folder: no path separator, not empty, . or .."""
    return bare_file_name(name) and name.strip() == name and bool(name)


def _parse(raw: bytes, origin: str) -> dict:
    try:
        task = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TaskSourceError(f"{origin}: not JSON ({e})") from None
    try:
        return check_task(task)
    except TaskSourceError as e:
        raise TaskSourceError(f"{origin}: {e}") from None


def unscorable(task: Mapping) -> tuple[tuple[str, str], ...]:
    """Why no verifier here may score `task` on any world: a metric or getter neither
    desktop-env nor this project's checkers provide, or one that would act on the host."""
    missing = [(name, f"no {text}") for name, text in missing_named(task)]
    return (*missing, *unsafe_named(task))


def _refuse_unscorable(tasks: Iterable[SourcedTask]) -> None:
    """Every task no verifier may score, each with its file (or line) and reasons, in one
    refusal: a rule that selects runnable tasks only leaves them out instead (`select`)."""
    lines = [_named(t, t.unscorable) for t in tasks if t.unscorable]
    if lines:
        raise TaskSourceError("\n".join(lines))


def _named(t: SourcedTask, reasons: Iterable[tuple[str, str]]) -> str:
    return f"{t.origin}: task {t.task['id']}: {'; '.join(detail for _, detail in reasons)}"


# --- sources ------------------------------------------------------------------------------------


def load_dir(root: str | Path, index: str | Path | None = None, strict: bool = True) -> Frozen:
    """The tasks of an OSWorld `evaluation_examples` folder (see the module's docstring).

    strict: a task no verifier here may score is refused (every such task named); otherwise
    it loads with its reasons (`SourcedTask.unscorable`) for a registered rule to leave out."""
    root = Path(root)
    examples = root / "examples"
    if not examples.is_dir():
        raise TaskSourceError(f"{root}: no examples/ folder (expected examples/<domain>/<id>.json)")
    listed = _index(Path(index) if index else None, examples)
    by_id: dict[str, list[SourcedTask]] = {}  # an id's tasks: one, or several contents
    named_by: dict[str, list[str]] = {}
    for domain, tid in listed:
        path = examples / domain / f"{tid}.json"
        origin = str(path.relative_to(root))
        if not path.is_file():
            raise TaskSourceError(f"{origin}: listed in the index under {domain}, but no such file")
        raw = path.read_bytes()
        task = _parse(raw, origin)
        if task["id"] != tid:
            raise TaskSourceError(f"{origin}: its id {task['id']!r} is not its file name")
        named_by.setdefault(tid, []).append(domain)
        if tid in by_id and any(t.raw == raw for t in by_id[tid]):
            continue
        defaulted = sorted(key for key in DEFAULTS if key not in task)
        task.update({key: json.loads(json.dumps(DEFAULTS[key])) for key in defaulted})
        task.update(domain=domain, source_sha256=sha256_bytes(raw))
        if defaulted:
            task["defaulted"] = defaulted
        by_id.setdefault(tid, []).append(SourcedTask(task, raw, origin, unscorable(task)))
    duplicates = [
        {"id": tid, "domains": domains, "kept": domains[0]}
        for tid, domains in sorted(named_by.items())
        if len(domains) > 1 and len(by_id[tid]) == 1
    ]
    # One id, several contents (OSWorld's test_all.json has eleven: each a chrome task and a
    # thunderbird task; OSWorld names a task by its domain and id together). Each is kept under
    # `<domain>.<id>`, the frozen line saying its file's id in `source_id`, and the report lists
    # them (`duplicates`): the frozen set, its split and receipts need one id a task, and
    # OSWorld's own folder freezes as it is.
    tasks, ids = [], {tid for tid, variants in by_id.items() if len(variants) == 1}
    for tid, variants in sorted(by_id.items()):
        if len(variants) == 1:
            tasks.append(variants[0])
            continue
        renamed = []
        for t in variants:
            new_id = f"{t.task['domain']}.{tid}"
            if new_id in ids:
                raise TaskSourceError(f"{t.origin}: id {tid} has other contents elsewhere, and "
                                      f"{new_id}, its name here, is another task's id")  # fmt: skip
            ids.add(new_id)
            renamed.append(new_id)
            tasks.append(replace(t, task={**t.task, "id": new_id, "source_id": tid}))
        duplicates.append({"id": tid, "domains": named_by[tid], "renamed": renamed})
    duplicates.sort(key=lambda d: d["id"])
    tasks.sort(key=lambda t: t.task["id"])
    if strict:
        _refuse_unscorable(tasks)
    return Frozen(tasks, duplicates, from_dir=True)


def _index(index: Path | None, examples: Path) -> list[tuple[str, str]]:
    """(domain, id) pairs in sorted order: from the index, or every file under examples/; a
    domain or id that is not a plain name (a path separator, .., empty) is refused, naming the
    index (or the file)."""
    if index is None:
        pairs = sorted((p.parent.name, p.stem) for p in examples.glob("*/*.json"))
        where = {pair: f"examples/{pair[0]}/{pair[1]}.json" for pair in pairs}
    else:
        try:
            listing = json.loads(index.read_bytes())
        except (OSError, json.JSONDecodeError) as e:
            raise TaskSourceError(f"{index}: cannot read the index ({e})") from None
        ok = isinstance(listing, Mapping) and all(
            isinstance(ids, list) and all(isinstance(i, str) for i in ids)
            for ids in listing.values()
        )
        if not ok:
            raise TaskSourceError(f"{index}: the index must map each domain to a list of task ids")
        pairs = sorted((domain, tid) for domain, ids in listing.items() for tid in ids)
        where = {pair: str(index) for pair in pairs}
    for domain, tid in pairs:
        for kind, name in (("domain", domain), ("id", tid)):
            if not plain_name(name):
                raise TaskSourceError(
                    f"{where[domain, tid]}: {kind} {name!r} is not a plain name "
                    "(no path separator, not empty, . or ..)"
                )
    return pairs


def load_jsonl(path: str | Path, strict: bool = True) -> Frozen:
    """A tasks.jsonl, one task per line, kept line for line; a duplicated id is refused, and so
    is a line without `config` (the line is kept as it is, so it must say its set-up)."""
    path = Path(path)
    tasks, seen = [], {}
    for n, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
        if not line.strip():
            continue
        origin = f"{path.name}:{n}"
        task = _parse(line, origin)
        if "config" not in task:
            raise TaskSourceError(
                f"{origin}: task {task['id']}: a tasks.jsonl line is kept as it is, so it must "
                "name its set-up ('config': [] for none)"
            )
        if task["id"] in seen:
            raise TaskSourceError(f"{origin}: id {task['id']} is also line {seen[task['id']]}")
        seen[task["id"]] = n
        tasks.append(SourcedTask(task, line, origin, unscorable(task)))
    if not tasks:
        raise TaskSourceError(f"{path}: no tasks")
    if strict:
        _refuse_unscorable(tasks)
    return Frozen(tasks)


# --- the registered rule that chooses the frozen subset -----------------------------------------

RULE_KEYS = {"domains", "ids", "runnable", "noop", "noop_plays"}
NOOP_RULES = ("exclude",)


def check_rule(rule: Any) -> dict:
    """A selection rule (config `tasks.osworld.select`): `domains`, a list of the set's domains
    to keep (absent: all); `ids`, a list of task ids (as frozen) to keep (absent: all): a
    sample named in advance, as the OSWorld rehearsal's; `runnable`, true to leave out, and
    report, every task the arms' world cannot set up or score (false or absent: such a task
    refuses the whole freeze);
    `noop: exclude`, to leave out every task whose untouched desktop already scores 1 (`noop`
    in `select`); `noop_plays`, how many no-op plays per sandbox that rule reads (default 1): a
    task played fewer times is unchecked, one whose plays disagree is nondeterministic."""
    if not isinstance(rule, Mapping) or set(rule) - RULE_KEYS:
        raise TaskSourceError(f"select: a rule is an object with keys among {sorted(RULE_KEYS)}")
    doms = rule.get("domains")
    if doms is not None and (
        not isinstance(doms, list) or not doms or not all(plain_name(d) for d in doms)
    ):
        raise TaskSourceError("select.domains must be a non-empty list of domain names")
    ids = rule.get("ids")
    if ids is not None and (
        not isinstance(ids, list) or not ids or not all(plain_name(i) for i in ids)
    ):
        raise TaskSourceError("select.ids must be a non-empty list of task ids")
    if not isinstance(rule.get("runnable", False), bool):
        raise TaskSourceError("select.runnable must be true or false")
    if "noop" in rule and rule["noop"] not in NOOP_RULES:
        raise TaskSourceError(f"select.noop must be one of {list(NOOP_RULES)}")
    plays = rule.get("noop_plays", 1)
    if not isinstance(plays, int) or isinstance(plays, bool) or plays < 1:
        raise TaskSourceError("select.noop_plays must be a whole number of plays, at least 1")
    return dict(rule)


def check_noop_record(record: Any, image: str) -> dict:
    """The no-op record (bench/noop_check.py's --out): {image, tasks: {id: {sandbox: {score,
    valid}}}}, played on `image`; anything else is refused, so that a rule never reads a record
    of another image or a malformed one as "nothing scored 1"."""
    ok = isinstance(record, Mapping) and isinstance(record.get("tasks"), Mapping)
    if not ok:
        raise TaskSourceError("the no-op record must be {image, tasks: {id: {sandbox: {score, "
                              "valid}}}} (bench/noop_check.py --out)")  # fmt: skip
    if record.get("image") != image:
        raise TaskSourceError(f"the no-op record was played on the {record.get('image')!r} "
                              f"image, the freeze judges the {image!r} one")  # fmt: skip

    def one(p) -> bool:
        return isinstance(p, Mapping) and "score" in p and isinstance(p.get("valid"), bool)

    for tid, plays in record["tasks"].items():
        if (
            not isinstance(plays, Mapping)
            or not plays
            or not all(one(p) for p in plays.values())
            or not all(
                isinstance(p.get("plays", [p]), list) and all(map(one, p.get("plays", [p])))
                for p in plays.values()
            )
        ):
            raise TaskSourceError(f"the no-op record's task {tid!r}: each sandbox's play must "
                                  "be {score, valid}")  # fmt: skip
    return dict(record)


def noop_gaps(record: Mapping, task_id: str, needed: int = 1) -> list[tuple[str, str]]:
    """Why the no-op record keeps `task_id` out under `noop: exclude`: its untouched desktop
    scored 1 on a sandbox (`noop:scores_1`), its plays there disagree (`noop:nondeterministic`:
    one play cannot decide such a task), its no-op could not be played or scored validly
    (`noop:invalid`: the set-up failed there), or it was not played, or fewer times than the
    rule's `needed` plays (`noop:unchecked`). A sandbox's entry holds its plays under `plays`
    (bench/noop_check.py --plays), or is one play itself."""
    by_sandbox = record["tasks"].get(task_id)
    if by_sandbox is None:
        return [("noop:unchecked", "its no-op was not played (not in the no-op record)")]
    gaps = []
    for sandbox, entry in sorted(by_sandbox.items()):
        plays = entry.get("plays", [entry])
        scores = sorted({p["score"] for p in plays if p["valid"] and p["score"] is not None})
        if len(plays) < needed:
            gaps.append(("noop:unchecked", f"its no-op was played {len(plays)} time(s) on "
                                           f"{sandbox}, the rule reads {needed}"))  # fmt: skip
        elif any(not p["valid"] or p["score"] is None for p in plays):
            gaps.append(("noop:invalid", f"its no-op on {sandbox} was not a valid play"))
        elif len(scores) > 1:
            gaps.append(("noop:nondeterministic", f"its no-op on {sandbox} scored {scores} in "
                                                  f"{len(plays)} plays"))  # fmt: skip
        elif scores[0] >= 1.0:
            gaps.append(("noop:scores_1", f"its untouched desktop scores 1 on {sandbox}"))
    return _unique(gaps)


def assess(task: SourcedTask, image: str = DEFAULT_IMAGE) -> dict[str, list[tuple[str, str]]]:
    """Per world in WORLDS, why `task` cannot run there (empty: it can): what no verifier may
    score anywhere, then what the world lacks (the X desktop: with `image`'s applications)."""
    from envab.envs.xdesktop.evaluate import blockers  # the X desktop's routes, getters, apps

    return {"xdesktop": _unique([*task.unscorable, *blockers(task.task, image)])}


def is_infeasible(task: Mapping) -> bool:
    """Whether `task` is one of OSWorld's infeasible tasks: scored 1 when the agent answers
    FAIL, from its last action alone (metric `infeasible`)."""
    ev = task.get("evaluator")
    funcs = ev.get("func") if isinstance(ev, Mapping) else None
    return INFEASIBLE in (funcs if isinstance(funcs, list) else [funcs])


def _unique(reasons: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen, out = set(), []
    for reason in reasons:
        if reason not in seen:
            seen.add(reason)
            out.append(reason)
    return out


def _names(reasons: list[tuple[str, str]]) -> list[str]:
    """The reasons' names, each once (a task whose files are missing has one reason a URL)."""
    return list(dict.fromkeys(name for name, _ in reasons))


class Unselectable(TaskSourceError):
    """Tasks the rule keeps that cannot be scored (or run on the arms' world): `lines`, one a
    task, each with its file and reasons."""

    def __init__(self, lines: list[str], summary: str):
        super().__init__("\n".join([*lines, summary]))
        self.lines, self.summary = lines, summary


FilesCheck = Callable[[SourcedTask], list[tuple[str, str]]]


def select(
    frozen: Frozen,
    rule: Mapping | None = None,
    world: str | None = None,
    files: FilesCheck | None = None,
    image: str = DEFAULT_IMAGE,
    noop: Mapping | None = None,
) -> Frozen:
    """The tasks `rule` (check_rule) chooses from `frozen`, with the per-task report.

    `world` is the arms' world ("xdesktop" when an arm plays the X desktop, else None): a task
    is usable when a verifier may score it and, with a world, that world can set it up and
    score it. Without `runnable: true` an unusable task the rule keeps refuses the freeze,
    every such task named (Unselectable); with it, it is left out and the report says why. A
    task no verifier may score (unsafe, unknown metric) is never selected. The report has,
    per task, its domain, whether it is runnable on each world in WORLDS or its reasons' names
    (`setup:download`, `getter:cloud_file`, `metric:compare_pptx_files`, `app:libreoffice`,
    `unsafe:...`), and whether the rule selected it; per world, runnable / total per domain
    and each reason's count.

    `files`, when given, freezes the files a task downloads (envs/tasks/fetch.py's Freezer) and
    says why they cannot be (`file:missing`, ...): it is asked only for a task the rule would
    otherwise choose, so nothing is fetched for a task left out anyway, and its reasons count as
    the others do.

    `image` is the X desktop image the arms play (envs/xdesktop/apps.py: `base`, or `full` with
    OSWorld's applications): a task naming an application it lacks is `app:<name>`. Under
    `noop: exclude` the no-op record `noop` (check_noop_record, played on that image) leaves
    out a task whose untouched desktop scores 1 (`noop:scores_1`), or that was not played
    (`noop:unchecked`) or not validly (`noop:invalid`); asked, as `files`, only of a task the
    rule would otherwise choose."""
    rule = check_rule(rule or {})
    check_image(image)
    if rule.get("noop") == "exclude":
        if noop is None:
            raise TaskSourceError("select.noop: exclude needs the no-op record (--noop FILE, "
                                  "written by bench/noop_check.py)")  # fmt: skip
        noop = check_noop_record(noop, image)
    doms = rule.get("domains")
    present = {t.task.get("domain") or "_none" for t in frozen.tasks}
    if doms is not None and (absent := sorted(set(doms) - present)):
        raise TaskSourceError(
            f"select.domains: {absent} not in the task set (it has {sorted(present)})"
        )
    ids = set(rule.get("ids") or ())
    if ids and (absent := sorted(ids - {t.task["id"] for t in frozen.tasks})):
        raise TaskSourceError(f"select.ids: {absent[:5]} not in the task set")
    kept, bad, per_task = [], [], {}
    infeasible = {"total": 0, "runnable": dict.fromkeys(WORLDS, 0), "selected": 0}
    runnable = {w: {} for w in WORLDS}
    counts = {w: {} for w in WORLDS}
    for t in frozen.tasks:
        domain = t.task.get("domain") or "_none"
        infeasible_task = is_infeasible(t.task)
        worlds = assess(t, image)
        blocking = worlds[world] if world else list(t.unscorable)
        wanted = (doms is None or domain in doms) and (not ids or t.task["id"] in ids)
        if files is not None and wanted and not blocking and (gaps := files(t)):
            worlds = {w: [*reasons, *gaps] for w, reasons in worlds.items()}
            blocking = [*blocking, *gaps]
        noop_out = rule.get("noop") == "exclude" and wanted and not blocking
        if noop_out and (gaps := noop_gaps(noop, t.task["id"], rule.get("noop_plays", 1))):
            worlds = {w: [*reasons, *gaps] for w, reasons in worlds.items()}
            blocking = [*blocking, *gaps]
        chosen = wanted and not blocking
        if wanted and blocking and not rule.get("runnable"):
            bad.append(_named(t, blocking))
        if chosen:
            kept.append(t)
        for w, reasons in worlds.items():
            row = runnable[w].setdefault(domain, {"runnable": 0, "total": 0})
            row["total"] += 1
            row["runnable"] += not reasons
            for name in _names(reasons):  # a task counts once under each reason
                counts[w][name] = counts[w].get(name, 0) + 1
        per_task[f"{domain}/{t.task.get('source_id', t.task['id'])}"] = {  # OSWorld's name
            "domain": domain,
            "id": t.task["id"],  # its id in the frozen set
            "runnable": {w: not reasons for w, reasons in worlds.items()},
            "reasons": {w: _names(reasons) for w, reasons in worlds.items()},
            "selected": chosen,
            **({"infeasible": True} if infeasible_task else {}),
        }
        if infeasible_task:
            infeasible["total"] += 1
            infeasible["selected"] += chosen
            for w, reasons in worlds.items():
                infeasible["runnable"][w] += not reasons
    if bad:
        where = "cannot run on the X desktop" if world == "xdesktop" else "cannot be scored here"
        raise Unselectable(
            bad,
            f"{len(bad)} of {len(frozen.tasks)} tasks {where}; nothing written (a registered "
            "rule, tasks.osworld.select: {runnable: true}, leaves them out and reports why)",
        )
    if not kept:
        raise TaskSourceError(
            f"select: the rule {rule} keeps none of the {len(frozen.tasks)} tasks"
        )
    selection = {
        "loaded": len(frozen.tasks),
        "selection": {
            "rule": rule,
            "world": world,
            # named when not the base, so a base report keeps the bytes it had before images
            **({"image": image} if image != DEFAULT_IMAGE else {}),
            "selected": len(kept),
            "left_out": len(frozen.tasks) - len(kept),
        },
        "runnable": {w: dict(sorted(rows.items())) for w, rows in runnable.items()},
        # Infeasible tasks apart (scored from the agent's last action alone, no getter or metric
        # run): counted in `runnable` too, named here so a reader can take them out. Only where
        # the set has any, so a set without them keeps its report's bytes.
        **({"infeasible": infeasible} if infeasible["total"] else {}),
        "reasons": {
            w: dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))) for w, c in counts.items()
        },
        "per_task": dict(sorted(per_task.items())),
    }
    return Frozen(kept, frozen.duplicates, frozen.from_dir, list(frozen.tasks), selection)


def write(frozen: Frozen, tasks_out: Path, sources_out: Path | None, report_out: Path) -> None:
    if frozen.from_dir:  # one line a task; the files' own bytes go to `sources_out`, if given
        if sources_out is not None:
            if sources_out.exists():
                shutil.rmtree(sources_out)
            for t in frozen.loaded if frozen.loaded is not None else frozen.tasks:
                name = t.task.get("source_id", t.task["id"])
                copy = sources_out / "examples" / t.task["domain"] / f"{name}.json"
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(t.raw)
        write_jsonl(tasks_out, [t.task for t in frozen.tasks])
    else:  # a tasks.jsonl is kept line for line
        atomic_write_bytes(tasks_out, b"".join(t.raw.rstrip(b"\r\n") + b"\n" for t in frozen.tasks))
    atomic_write_json(report_out, frozen.report())


def original(task: Mapping) -> dict:
    """A frozen task as its file had it (the fields the freeze added taken out, a default it
    filled in removed, the id its file gave it)."""
    out = {k: v for k, v in task.items() if k not in ADDED and k not in task.get("defaulted", ())}
    if "source_id" in task:
        out["id"] = task["source_id"]
    return out


def freeze_solutions(source: Path, tasks: Iterable[Mapping], out: Path) -> int:
    """The oracle solutions of the frozen tasks, kept line for line in the tasks' order: the warm
    start's demonstrations. Untrusted like a task file: each line must be a JSON object with a
    plain `id` and an `oracle` list of action objects (the environment plays them, as the
    policy's actions), and every frozen task must have one. Returns how many were written."""
    found: dict[str, bytes] = {}
    for n, raw in enumerate(source.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError as e:
            raise Refusal(f"{source}:{n}: not JSON ({e})") from None
        ok = (
            isinstance(line, dict)
            and isinstance(line.get("id"), str)
            and isinstance(line.get("oracle"), list)
            and all(isinstance(a, dict) and isinstance(a.get("action_type"), str)
                    for a in line["oracle"])
        )  # fmt: skip
        if not ok:
            raise Refusal(f"{source}:{n}: a solution is {{id, oracle: [action, ...]}}")
        if line["id"] in found:
            raise Refusal(f"{source}:{n}: a second solution for {line['id']!r}")
        found[line["id"]] = (line, raw.rstrip(b"\r\n") + b"\n")
    tasks = list(tasks)

    def key(t: Mapping) -> str:
        # a task the freeze renamed (<domain>.<id>, one id under two domains) is found by its
        # frozen id, the one unambiguous name, else by OSWorld's id
        return t["id"] if t["id"] in found else t.get("source_id", t["id"])

    missing = [key(t) for t in tasks]
    missing = [i for i in missing if i not in found]
    if missing:
        raise Refusal(
            f"{source}: no oracle solution for {len(missing)} frozen task(s): {missing[:5]}; the "
            "warm start needs one per task (or training.sft.enabled: false)"
        )
    lines = []
    for t in tasks:
        line, raw = found[key(t)]
        # a task the freeze renamed (<domain>.<id>) keeps its solution under its frozen id
        same = line["id"] == t["id"]
        lines.append(raw if same else (json.dumps({**line, "id": t["id"]}) + "\n").encode())
    atomic_write_bytes(out, b"".join(lines))
    return len(lines)


def domains(tasks: Iterable[Mapping]) -> list[str]:
    return sorted({t.get("domain") or "_none" for t in tasks})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m envab.envs.osworld", description=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dir", type=Path, help="an OSWorld evaluation_examples folder")
    source.add_argument("--jsonl", type=Path, help="a tasks.jsonl, one task per line")
    p.add_argument("--index", type=Path, help="with --dir: {domain: [id, ...]} (test_all.json)")
    p.add_argument("--tasks", type=Path, required=True, help="the frozen tasks.jsonl to write")
    p.add_argument("--sources", type=Path, help="with --dir: where the task files are copied")
    p.add_argument("--report", type=Path, required=True)
    p.add_argument(
        "--runnable",
        choices=["xdesktop"],
        help="refuse a task this environment cannot set up or score (the real X desktop)",
    )
    p.add_argument(
        "--image",
        choices=IMAGES,
        default=DEFAULT_IMAGE,
        help="the X desktop image the arms play (envs/xdesktop/apps.py): a task naming an "
        "application it lacks is app:<name> in the report",
    )
    p.add_argument(
        "--noop",
        type=Path,
        help="the no-op record (bench/noop_check.py --out) that select.noop: exclude reads",
    )
    p.add_argument(
        "--select",
        type=json.loads,
        help="the registered rule choosing the frozen subset, JSON: {domains: [...], runnable: "
        "true} (config tasks.osworld.select; see `select`)",
    )
    p.add_argument(
        "--files",
        type=Path,
        help="freeze every file the selected tasks download into FILES/files/<sha256>, with "
        "the URL map FILES/files.json (envs/tasks/fetch.py); without it, a task that downloads "
        "cannot run on the X desktop (file:not_frozen)",
    )
    p.add_argument(
        "--files-config",
        type=json.loads,
        default={},
        help="JSON: config tasks.osworld.files (mirror, expect, max_file_mb, max_total_mb, "
        "deadline_s)",
    )
    p.add_argument(
        "--solutions-from",
        type=Path,
        help="a solutions.jsonl with an oracle per task (config tasks.osworld.solutions)",
    )
    p.add_argument(
        "--solutions",
        type=Path,
        help="with --solutions-from: the frozen tasks' solutions, written here",
    )
    args = p.parse_args(argv)
    if (args.solutions_from is None) != (args.solutions is None):
        p.error("--solutions-from and --solutions go together")
    # Without a rule every task must load and be scorable, as before rules existed: the first
    # malformed file, or every task no verifier may score, refuses the freeze.
    strict = args.select is None
    freezer = None
    try:
        if args.dir:
            frozen = load_dir(args.dir, args.index, strict=strict)
        else:
            frozen = load_jsonl(args.jsonl, strict=strict)
        if args.files is not None:
            cfg = args.files_config
            freezer = fetch.Freezer(args.files, mirror=cfg.get("mirror"),
                                    expect=cfg.get("expect"),
                                    limits=fetch.Limits.from_config(cfg))  # fmt: skip
        files = freezer or (fetch.not_frozen if args.runnable else None)
        noop = None
        if args.noop is not None:
            try:
                noop = json.loads(args.noop.read_bytes())
            except json.JSONDecodeError as e:
                raise TaskSourceError(f"{args.noop}: the no-op record is not JSON ({e})") from None
        frozen = select(frozen, args.select, args.runnable, files, args.image, noop)
        if freezer is not None:
            frozen.files = freezer.write(t.task["id"] for t in frozen.tasks)
        if args.solutions is not None:
            freeze_solutions(args.solutions_from, (t.task for t in frozen.tasks), args.solutions)
    except Unselectable as e:
        for line in [*e.lines, e.summary]:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except (Refusal, OSError) as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    finally:
        if freezer is not None:  # refused: the files fetched so far go (frozen: nothing to do)
            freezer.discard()
    write(frozen, args.tasks, args.sources if args.dir else None, args.report)
    report = frozen.report()
    once = sum("kept" in d for d in frozen.duplicates)
    renamed = len(frozen.duplicates) - once
    dup = f"; {once} ids named by two domains, kept once" if once else ""
    dup += f"; {renamed} ids with two contents, kept as <domain>.<id>" if renamed else ""
    left = report["selection"]["left_out"]
    out = (
        f"; {left} of {report['loaded']} left out by the rule, reasons in the report"
        if left
        else ""
    )
    if infeasible := report.get("infeasible"):
        out += (
            f"; {infeasible['selected']} of those frozen infeasible (scored from the last action)"
        )
    if frozen.files is not None:
        stored = {e["sha256"]: e["size"] for e in frozen.files.values()}
        out += f"; {len(frozen.files)} files frozen ({sum(stored.values())} bytes)"
    print(f"tasks: {report['tasks']} frozen, per domain {report['per_domain']}{dup}{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
