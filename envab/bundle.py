"""A finished run's receipts and records, small enough to commit, that `verify` checks from a clone.

    python -m envab.bundle embedded-default-v8 --out docs/results/embedded-default-v8
    python -m envab.verify docs/results/embedded-default-v8/receipts/embedded-default-v8 \
        --root docs/results/embedded-default-v8

Copies `receipts/<experiment>/` (with each receipt's signature and the freeze's anchor) and every
file its receipts name (subjects, what they depend on, and each checkpoint file a
checkpoints.jsonl lists) under `--out`, at the same relative paths, so the receipts verify there
as they do in the run's folder. Model weights, any file over `--max-file-kib` and files outside
the run's folder (a small run's code, `../trainer/...`, held by the commit its code receipt
records) are left out: their paths, digests and sizes go to
`not-shipped.json`, which `verify` reads to say NOT SHIPPED for each (never a silent pass, never a
failure for what was deliberately left out).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from envab import anchor
from envab.errors import Refusal, refused
from envab.io import atomic_write_json
from envab.layout import Layout
from envab.receipts import read_receipt

NOT_SHIPPED = "not-shipped.json"
NOT_SHIPPED_STATUS = "NOT SHIPPED"  # what verify says of such a file
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")  # model weights: kept as digests only


def named_files(receipts: Path, root: Path) -> dict[str, str]:
    """Relative path -> sha256 the receipts record, for every file they (and the checkpoint
    records among them) name."""
    named: dict[str, str] = {}
    for file in sorted(receipts.glob("*.json")):
        statement = read_receipt(file)
        entries = [*statement["subject"], *statement["predicate"]["depends_on"]]
        for entry in entries:
            named[entry["name"]] = entry["digest"]["sha256"]
            if Path(entry["name"]).name == "checkpoints.jsonl" and (root / entry["name"]).is_file():
                records = root / entry["name"]
                for line in records.read_text().splitlines():
                    record = json.loads(line)
                    folder = records.parent / "checkpoints" / record["checkpoint"]
                    for relative, digest in record["files"].items():
                        named[(folder / relative).relative_to(root).as_posix()] = digest
    return named


def bundle(experiment: str, out: Path, root: Path = Path("."), max_file_kib: int = 2048) -> dict:
    """Copy what `verify` needs into `out`; returns {"shipped": n, "not_shipped": {...}}."""
    receipts = Layout(experiment, root).receipts
    if not any(receipts.glob("*.json")):
        raise Refusal(f"{receipts}: no receipts; run the experiment first")
    shipped, left_out = 0, {}
    for relative, digest in sorted(named_files(receipts, root).items()):
        source = root / relative
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            # Outside the run's folder: the code a small run's receipts name (../trainer/...),
            # which the commit the code receipt records holds. Its digest is kept.
            left_out[relative] = {"sha256": digest, "bytes": None, "outside_the_run": True}
            continue
        if not source.is_file():
            continue  # verify reports it MISSING in the bundle as in the run
        size = source.stat().st_size
        if source.suffix in WEIGHTS or size > max_file_kib * 1024:
            left_out[relative] = {"sha256": digest, "bytes": size}
            continue
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, out / relative)
        shipped += 1
    # The receipts with their signatures, and the freeze's anchor (envab/anchor.py) where it
    # lies inside the run's folder: verify checks the pre-registration's receipt against it.
    files = [*sorted(receipts.glob("*.json")), *sorted(receipts.glob("*.json.sig"))]
    prereg = receipts / "preregistration.json"
    anchored = anchor.named_by(read_receipt(prereg)) if prereg.is_file() else None
    if anchored and ".." not in Path(anchored).parts and (root / anchored).is_file():
        files.append(root / anchored)
    for file in files:
        (out / file.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, out / file.relative_to(root))
    atomic_write_json(out / NOT_SHIPPED, left_out)
    return {"shipped": shipped, "not_shipped": left_out}


def not_shipped(root: Path) -> dict[str, str]:
    """Path -> recorded sha256 of what a bundle left out (empty for a run's own folder)."""
    path = root / NOT_SHIPPED
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {name: entry["sha256"] for name, entry in data.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.bundle", description=__doc__.split("\n")[0]
    )
    parser.add_argument("experiment", help="the experiment id (receipts/<experiment>/)")
    parser.add_argument("--out", type=Path, required=True, help="the bundle's folder")
    parser.add_argument("--root", type=Path, default=Path("."), help="the run's workflow folder")
    parser.add_argument("--max-file-kib", type=int, default=2048, help="larger files: digest only")
    args = parser.parse_args(argv)
    try:
        result = bundle(args.experiment, args.out, args.root, args.max_file_kib)
    except Refusal as e:
        return refused(e)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(
        f"bundle {args.out}: {result['shipped']} files ({size / 1024:.0f} KiB), "
        f"{len(result['not_shipped'])} left out with their digests ({NOT_SHIPPED})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
