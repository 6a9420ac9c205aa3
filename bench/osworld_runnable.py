"""Per domain, how many tasks of a frozen OSWorld set run on the X desktop, from the tasks job's
report (index.json, `python -m envab.envs.osworld ... --select '{"runnable": true}'`).

    python bench/osworld_runnable.py index.json [--top 4] [--reasons 20]

Prints a Markdown table: runnable / total per domain; those stopped only by their files (`file:*`:
every file they download could not be frozen, e.g. on a machine without network and without a
mirror, so they run wherever the files are); the commonest reasons; then every reason's count
over the set. A task counts under each of its reasons.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path)
    p.add_argument("--world", default="xdesktop")
    p.add_argument("--top", type=int, default=4, help="reasons per domain")
    p.add_argument("--reasons", type=int, default=20, help="reasons over the set")
    args = p.parse_args(argv)
    report = json.loads(args.report.read_text())
    per_task = report["per_task"]
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    why: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in per_task.values():
        reasons = row["reasons"][args.world]
        d = row["domain"]
        rows[d]["total"] += 1
        rows[d]["runnable"] += not reasons
        rows[d]["files_only"] += bool(reasons) and all(r.startswith("file:") for r in reasons)
        why[d].update(set(reasons))
    image = report.get("selection", {}).get("image", "base")
    total = sum(r["total"] for r in rows.values())
    runnable = sum(r["runnable"] for r in rows.values())
    files_only = sum(r["files_only"] for r in rows.values())
    lines = [
        f"image {image}: {runnable} of {total} runnable; {files_only} more stopped only by "
        "their files",
        "",
        "| domain | runnable | stopped only by files | commonest reasons |",
        "|---|---|---:|---|",
    ]
    for d, r in sorted(rows.items()):
        top = ", ".join(f"`{name}` {n}" for name, n in why[d].most_common(args.top))
        lines.append(f"| {d} | {r['runnable']} / {r['total']} | {r['files_only']} | {top} |")
    lines.append(f"| **all** | **{runnable} / {total}** | **{files_only}** | |")
    overall = collections.Counter()
    for c in why.values():
        overall.update(c)
    lines += ["", "| reason | tasks |", "|---|---:|"]
    lines += [f"| `{name}` | {n} |" for name, n in overall.most_common(args.reasons)]
    lines.append(f"\n{len(overall)} distinct reasons")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
