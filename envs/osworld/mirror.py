"""Make a files mirror of an OSWorld task set on a machine with network, for one without.

    python -m envab.envs.osworld.mirror make --dir evaluation_examples \
        [--index evaluation_examples/test_all.json] --out osworld-files [--pack osworld-files.tar]
    python -m envab.envs.osworld.mirror pack --mirror osworld-files --out osworld-files.tar
    python -m envab.envs.osworld.mirror unpack --archive osworld-files.tar --out osworld-files
    python -m envab.envs.osworld.mirror verify --mirror osworld-files

`make` fetches every file the set's tasks name — the `download` steps of `config` and
`evaluator.postconfig`, and the `cloud_file` expectations, `multi: true` lists included
(`envs/tasks/downloads.py`, the freeze's own collector) — of every task that loads, whatever a
rule would later select, so any selection's freeze finds its files. Each is fetched as the freeze
fetches (`envs/tasks/fetch.py`: http and https only, never a host of this machine's network
unless `--allow-private-hosts`, within the file, total and time caps) into the layout the
freeze's `files.mirror` reads: `files.json` and `files/<sha256>`.

Resumable: a URL the folder's map already has, with a file of that digest and size, is not
fetched again (`--recheck` fetches it anyway, to see whether it changed); the map is written
after each file, so an interrupted make loses at most the file it was on. A URL that cannot be
fetched (`file:missing` with the HTTP status or error, `file:too_large`, `file:scheme`,
`file:private_host`) is listed with its reason and its tasks, and the rest goes on. A URL whose
bytes changed — against the folder's earlier map (`--recheck`) or a registered map (`--expect`,
a freeze's files.json) — is named with both digests and the mirror keeps the bytes it had
(none, for a URL it did not have): a mirror never swaps a file under a registered map; make a
new one into an empty folder to take the new bytes. Exit 0 when every file is in the mirror, 1
when some are not (all named), 2 when the task set or a map cannot be read.

`--dataset BASE` names a copy of the files laid out as OSWorld's later commits name them, the
Hugging Face dataset `xlangai/ubuntu_osworld_file_cache`, `<BASE>/<domain>/<task id>/<file name>`
(BASE `https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main`, or a
team's host of that folder). A URL that cannot be fetched (a Google Drive file gone, or behind a
page) is then fetched from there, for each task that names it, under the file name the task gives
it (its set-up's path, its getter's `dest`), and kept under the task's own URL, which the freeze
looks up; `--report` lists which came from the dataset (`from_dataset`), and `--expect` checks
their bytes as any other's.

`pack`, `unpack` and `verify`: `envs/osworld/mirror_archive.py`.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from envab.envs.osworld import mirror_archive
from envab.envs.osworld.source import load_dir
from envab.envs.tasks.downloads import Malformed, downloads
from envab.envs.tasks.fetch import MIB, Limits, Unfetchable, fetch_url
from envab.envs.tasks.filestore import MAP, STORE, blob, read_map, write_map
from envab.errors import Refusal
from envab.hashing import sha256_file
from envab.io import atomic_write_json


@dataclass
class Made:
    """What one `make` did: URLs fetched, already present, and not mirrored (url -> {reason,
    detail, tasks}); `changed` are among the latter (reason `file:changed`)."""

    wanted: int = 0
    mirrored: int = 0  # of the wanted URLs, how many the mirror holds at the end
    fetched: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    failed: dict[str, dict] = field(default_factory=dict)
    malformed: dict[str, str] = field(default_factory=dict)  # task id -> why (no URL read)
    from_dataset: dict[str, str] = field(default_factory=dict)  # url -> the dataset's URL used

    def report(self) -> dict:
        return {
            "wanted": self.wanted,
            "mirrored": self.mirrored,
            "fetched": len(self.fetched),
            "present": len(self.present),
            "failed": dict(sorted(self.failed.items())),
            "malformed_tasks": dict(sorted(self.malformed.items())),
            "from_dataset": dict(sorted(self.from_dataset.items())),
        }


DATASET = "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main"


def wanted_urls(
    root: Path, index: Path | None
) -> tuple[dict[str, list[str]], dict[str, str], dict[str, list[tuple[str, str, str]]]]:
    """url -> the ids of the tasks that download it, over every task the set loads (as a rule
    loads them: unscorable ones too); task id -> why its downloads could not be read; and url ->
    (domain, OSWorld's task id, the file's name) for each task that names it, where the
    dataset's copy would be."""
    frozen = load_dir(root, index, strict=False)
    urls: dict[str, list[str]] = {}
    named: dict[str, list[tuple[str, str, str]]] = {}
    malformed: dict[str, str] = {}
    for t in frozen.tasks:
        try:
            for d in downloads(t.task):
                ids = urls.setdefault(d.url, [])
                if t.task["id"] not in ids:
                    ids.append(t.task["id"])
                where = (t.task.get("domain") or "", t.task.get("source_id", t.task["id"]),
                         posixpath.basename(d.dest))  # fmt: skip
                if all(where) and where not in named.setdefault(d.url, []):
                    named[d.url].append(where)
        except Malformed as e:
            malformed[t.task["id"]] = f"{t.origin}: {e}"
    return dict(sorted(urls.items())), malformed, named


def dataset_url(base: str, domain: str, task_id: str, name: str) -> str:
    """Where the dataset keeps a task's file: <base>/<domain>/<task id>/<file name>."""
    parts = (domain, task_id, name)
    return base.rstrip("/") + "/" + "/".join(urllib.parse.quote(x, safe="") for x in parts)


def _fetch(url: str, alternates: list[str], store: Path, limits: Limits) -> tuple[dict, str | None]:
    """The URL's file, else the first of `alternates` that can be fetched, with which one (None:
    the URL's own); Unfetchable with the URL's own reason when none can."""
    try:
        return fetch_url(url, store, limits), None
    except Unfetchable as first:
        for alternate in alternates:
            try:
                return fetch_url(alternate, store, limits), alternate
            except Unfetchable:
                continue
        raise first from None


def _holds(store: Path, entry: Mapping) -> bool:
    path = blob(store, entry["sha256"])
    return (
        path.is_file()
        and path.stat().st_size == entry["size"]
        and sha256_file(path) == entry["sha256"]
    )


def make(
    root: str | Path,
    out: str | Path,
    *,
    index: str | Path | None = None,
    limits: Limits | None = None,
    expect: str | Path | None = None,
    recheck: bool = False,
    dataset: str | None = None,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Made:
    """Fetch the files of the task set at `root` into the mirror folder `out` (see the module's
    docstring); `say` gets one progress line a URL."""
    limits = limits or Limits()
    out = Path(out)
    store = out / STORE
    store.mkdir(parents=True, exist_ok=True)
    urls, malformed, named = wanted_urls(Path(root), Path(index) if index else None)
    had = read_map(out / MAP)["files"] if (out / MAP).exists() else {}
    registered = read_map(expect)["files"] if expect is not None else {}
    # what an earlier make left whole stays, another set's URLs too (one folder may mirror several)
    files = {url: e for url, e in had.items() if _holds(store, e)}
    made = Made(wanted=len(urls), malformed=malformed)

    def save() -> None:  # after each file: an interrupted make resumes from here
        tasks: dict[str, list[str]] = {}
        for url, ids in urls.items():
            if url in files:
                for tid in ids:
                    tasks.setdefault(tid, []).append(url)
        write_map(out / MAP, dict(sorted(files.items())), dict(sorted(tasks.items())))

    for n, (url, ids) in enumerate(urls.items(), 1):
        head = f"[{n}/{len(urls)}] {url}"
        if url in files and not recheck:
            made.present.append(url)
            reference = registered.get(url)
            if reference and reference["sha256"] != files[url]["sha256"]:
                made.failed[url] = _changed(files[url], reference, expect, ids)
                say(f"{head}: CHANGED, {made.failed[url]['detail']}")
            else:
                say(f"{head}: present")
            continue
        started = time.monotonic()
        alternates = [dataset_url(dataset, *w) for w in named.get(url, [])] if dataset else []
        try:
            got, source = _fetch(url, alternates, store, limits)
        except Unfetchable as e:
            made.failed[url] = {"reason": e.reason, "detail": str(e), "tasks": ids}
            say(f"{head}: FAILED {e.reason}: {e}")
            continue
        reference = registered.get(url) or files.get(url)
        if reference and reference["sha256"] != got["sha256"]:
            where = expect if url in registered else out / MAP
            made.failed[url] = _changed(got, reference, where, ids)
            say(f"{head}: CHANGED, {made.failed[url]['detail']}")
            continue  # the mirror keeps what it had (or nothing)
        total = sum({e["sha256"]: e["size"] for e in [*files.values(), got]}.values())
        if total > limits.max_total_bytes:
            made.failed[url] = {
                "reason": "file:too_large",
                "detail": f"the mirror would reach {total} bytes, over its "
                f"{limits.max_total_bytes} (--max-total-mb)",
                "tasks": ids,
            }
            say(f"{head}: FAILED file:too_large: {made.failed[url]['detail']}")
            continue
        if source is not None:
            made.from_dataset[url] = source
        files[url] = got
        made.fetched.append(url)
        save()
        said = f" from {source}" if source else ""
        say(f"{head}: fetched {got['size']} bytes{said} in {time.monotonic() - started:.1f} s")
    save()
    _prune(store, {e["sha256"] for e in files.values()})
    made.mirrored = sum(url in files for url in urls)
    return made


def _changed(got: Mapping, reference: Mapping, where, ids: list[str]) -> dict:
    return {
        "reason": "file:changed",
        "detail": f"now sha256 {got['sha256']}, {where} has {reference['sha256']}",
        "tasks": ids,
    }


def _prune(store: Path, keep: set[str]) -> None:
    """Files no URL of the map names (a changed URL's new bytes, a crash's partial file) go:
    the mirror holds what its map says and nothing else."""
    for path in store.iterdir():
        if path.name not in keep:
            path.unlink()


def _limits(args) -> Limits:
    return Limits(
        args.max_file_mb * MIB,
        args.max_total_mb * MIB,
        args.deadline_s,
        args.allow_private_hosts,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m envab.envs.osworld.mirror", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="fetch every file a task set names into a mirror folder")
    m.add_argument("--dir", type=Path, required=True, help="an OSWorld evaluation_examples folder")
    m.add_argument("--index", type=Path, help="{domain: [id, ...]} (test_all.json)")
    m.add_argument("--out", type=Path, required=True, help="the mirror folder (made or resumed)")
    m.add_argument("--pack", type=Path, help="then pack it into this tar")
    m.add_argument("--report", type=Path, help="write what was fetched and failed, as JSON")
    m.add_argument("--expect", type=Path, help="a registered files map the bytes must match")
    m.add_argument("--recheck", action="store_true", help="fetch present files again, to "
                   "name those whose bytes changed")  # fmt: skip
    m.add_argument(
        "--dataset",
        metavar="BASE",
        help="where a URL that cannot be fetched is "
        f"looked for as <BASE>/<domain>/<task id>/<file name> (OSWorld's: {DATASET})",
    )
    d = Limits()
    m.add_argument("--max-file-mb", type=int, default=d.max_file_bytes // MIB)
    m.add_argument("--max-total-mb", type=int, default=d.max_total_bytes // MIB)
    m.add_argument("--deadline-s", type=float, default=d.deadline_s, help="one fetch's limit")
    m.add_argument(
        "--allow-private-hosts",
        action="store_true",
        help="let URLs reach this machine's network (loopback, private): a team's own mirror host",
    )
    k = sub.add_parser("pack", help="a mirror folder as one tar, its sha256 beside it")
    k.add_argument("--mirror", type=Path, required=True)
    k.add_argument("--out", type=Path, required=True)
    u = sub.add_parser("unpack", help="a packed mirror into a new folder, every file checked")
    u.add_argument("--archive", type=Path, required=True)
    u.add_argument("--out", type=Path, required=True)
    u.add_argument("--sha256", help="the archive's digest (default: the .sha256 file beside it)")
    v = sub.add_parser("verify", help="every file of a mirror folder there, with its digest")
    v.add_argument("--mirror", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        if args.command == "make":
            return _make(args)
        if args.command == "pack":
            digest = mirror_archive.pack(args.mirror, args.out)
            print(f"packed {args.mirror} into {args.out}: sha256 {digest}")
        elif args.command == "unpack":
            files = mirror_archive.unpack(args.archive, args.out, args.sha256)
            print(f"unpacked {len(files)} URLs' files into {args.out}, each checked")
        else:
            mirror_archive.verify(args.mirror)
            print(f"{args.mirror}: every file there, with its digest")
    except (Refusal, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _make(args) -> int:
    made = make(args.dir, args.out, index=args.index, limits=_limits(args), expect=args.expect,
                recheck=args.recheck, dataset=args.dataset)  # fmt: skip
    if args.report is not None:
        atomic_write_json(args.report, made.report())
    for tid, why in sorted(made.malformed.items()):
        print(f"malformed: task {tid}: {why}", file=sys.stderr)
    for url, f in sorted(made.failed.items()):
        print(f"not mirrored: {url}: {f['reason']}: {f['detail']} (tasks: "
              f"{', '.join(f['tasks'])})", file=sys.stderr)  # fmt: skip
    print(
        f"mirror {args.out}: {made.mirrored} of {made.wanted} URLs mirrored ({len(made.fetched)} "
        f"fetched, {len(made.present)} already there), {len(made.failed)} listed above"
        + (f", {len(made.malformed)} tasks malformed" if made.malformed else "")
    )
    if args.pack is not None:
        digest = mirror_archive.pack(args.out, args.pack)
        print(f"packed into {args.pack}: sha256 {digest}")
    return 1 if made.failed or made.malformed else 0


if __name__ == "__main__":
    sys.exit(main())
