"""The model pin: where the model comes from, what its files must hash to, and how it is loaded.

Two sources, one manifest check, one loading path:

- `builtin:tiny-qwen3-vl` is built offline from the task instructions (trainer/tiny_model.py);
- `hf://<owner>/<name>@<40-hex commit>` is fetched with `huggingface_hub.snapshot_download`,
  which honours HF_HUB_OFFLINE (offline and not on disk -> one clear error).

Either way the model folder is compared file by file against a sha256 manifest before it is used,
and loaded through `AutoModelForImageTextToText` / `AutoProcessor` from local files only.

The manifest and its check live in trainer/manifest.py (no torch there: a job refuses a wrong
folder before it loads anything).

CLI:
    python -m envab.trainer.model build --source builtin:tiny-qwen3-vl --tasks tasks.jsonl --out DIR
    python -m envab.trainer.model build --source hf://Qwen/Qwen3-VL-4B-Instruct@<commit> --out DIR
    python -m envab.trainer.model manifest DIR [--json]
    python -m envab.trainer.model check DIR --manifest FILE
    python -m envab.trainer.model pin hf://Qwen/Qwen3-VL-4B-Instruct[@<branch|tag|commit>]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import HFValidationError, validate_repo_id

from envab.errors import Refusal, refused
from envab.hashing import aggregate_digest, sha256_file
from envab.io import atomic_write_text, read_jsonl
from envab.receipts import Receipts, read_receipt
from envab.trainer.manifest import (
    ModelPinError,
    check_manifest,
    model_manifest,
    read_manifest_file,
)
from envab.trainer.tiny_spec import SOURCE as BUILTIN_TINY
from envab.trainer.tiny_spec import TinySpec

HUB_SCHEME = "hf://"
COMMIT = re.compile(r"[0-9a-f]{40}")
# Public records give this commit for the GPU configuration; `pin` confirms it where the hub is
# reachable (not confirmed from a machine without hub access).
QWEN3_VL_4B = "hf://Qwen/Qwen3-VL-4B-Instruct@ebb281ec70b05090aa6165b016eac8ec08e71b17"


# --- sources -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltinSource:
    spec: TinySpec = field(default_factory=TinySpec)

    def __str__(self) -> str:
        return BUILTIN_TINY


@dataclass(frozen=True)
class HubSource:
    repo_id: str
    revision: str  # a 40-hex commit: branches and tags move, commits do not

    def __post_init__(self):
        _check_repo_id(self.repo_id)
        if not COMMIT.fullmatch(self.revision):
            raise ModelPinError(
                f"model source {HUB_SCHEME}{self.repo_id}@{self.revision}: revision must be a "
                f"40-hex commit, not {self.revision!r} (get one with: "
                f"python -m envab.trainer.model pin {HUB_SCHEME}{self.repo_id})"
            )

    def __str__(self) -> str:
        return f"{HUB_SCHEME}{self.repo_id}@{self.revision}"


def _check_repo_id(repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise ModelPinError(f"model source: bad hub repo id {repo_id!r} ({e})") from None
    if repo_id.count("/") != 1:
        raise ModelPinError(f"model source: hub repo id {repo_id!r} must be <owner>/<name>")


def split_hub_ref(text: str) -> tuple[str, str | None]:
    """`hf://owner/name[@rev]` -> (repo_id, rev or None), without judging the revision."""
    if not text.startswith(HUB_SCHEME):
        raise ModelPinError(f"model source {text!r}: a hub source starts with {HUB_SCHEME}")
    repo_id, _, revision = text.removeprefix(HUB_SCHEME).partition("@")
    _check_repo_id(repo_id)
    return repo_id, revision or None


def parse_source(text: str, spec: TinySpec | None = None) -> BuiltinSource | HubSource:
    """The one place a source string from a config or command line becomes a typed source."""
    if text == BUILTIN_TINY:
        return BuiltinSource(spec or TinySpec())
    if text.startswith(HUB_SCHEME):
        repo_id, revision = split_hub_ref(text)
        if revision is None:
            raise ModelPinError(f"model source {text!r}: missing @<40-hex commit>")
        return HubSource(repo_id, revision)
    raise ModelPinError(
        f"model source {text!r}: expected {BUILTIN_TINY} or {HUB_SCHEME}<owner>/<name>@<commit>"
    )


def spec_from_mapping(values: dict) -> TinySpec:
    """A TinySpec from config values; an unknown key is refused by name."""
    known = {f.name for f in fields(TinySpec)}
    if unknown := sorted(set(values) - known):
        raise ModelPinError(
            f"tiny model spec: unknown key(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    if "deepstack_visual_indexes" in values:
        values = {**values, "deepstack_visual_indexes": tuple(values["deepstack_visual_indexes"])}
    try:
        return TinySpec(**values)
    except (TypeError, ValueError) as e:
        raise ModelPinError(str(e)) from None


def read_instructions(tasks_path: str | Path) -> list[str]:
    """Unique task instructions, sorted: the tokenizer depends on the set, not on line order."""
    instructions = set()
    try:
        for n, task in enumerate(read_jsonl(tasks_path), 1):
            text = task.get("instruction") if isinstance(task, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ModelPinError(f"{tasks_path}:{n}: task has no 'instruction' string")
            instructions.add(text)
    except (OSError, ValueError) as e:
        raise ModelPinError(f"task set {tasks_path}: {e}") from None
    if not instructions:
        raise ModelPinError(f"task set {tasks_path}: no tasks")
    return sorted(instructions)


# --- materialising a source into a folder --------------------------------------------------------


def build_builtin(source: BuiltinSource, instructions: list[str], out: str | Path) -> Path:
    """Build the tiny model into `out` via a temporary sibling, so `out` is never half written."""

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ModelPinError(
            f"model folder {out} already has files; remove it or pick another --out"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        from envab.trainer import tiny_model  # torch: only a build needs it

        tiny_model.build(instructions, tmp, source.spec)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def fetch(source: HubSource, out: str | Path) -> Path:
    """Download (or, offline, reuse) the pinned snapshot into `out`."""

    try:
        return Path(snapshot_download(source.repo_id, revision=source.revision, local_dir=out))
    except RevisionNotFoundError:
        raise ModelPinError(f"model source {source}: the hub has no such commit") from None
    except RepositoryNotFoundError:
        raise ModelPinError(
            f"model source {source}: the hub has no such repository "
            "(or it is gated and no token was given)"
        ) from None
    except LocalEntryNotFoundError as e:
        if constants.HF_HUB_OFFLINE:
            raise ModelPinError(
                f"model source {source}: HF_HUB_OFFLINE is set and the snapshot is not on disk at "
                f"{out}; fetch it once where the hub is reachable, or unset HF_HUB_OFFLINE"
            ) from None
        raise ModelPinError(
            f"model source {source}: cannot reach the hub and the snapshot is "
            f"not on disk at {out} ({type(e).__name__})"
        ) from None


def materialize(
    source: BuiltinSource | HubSource, out: str | Path, tasks: str | Path | None = None
) -> Path:
    """Make `out` hold the source's files: built (builtin) or fetched (hub)."""
    if isinstance(source, HubSource):
        return fetch(source, out)
    if tasks is None:
        raise ModelPinError(f"model source {source}: needs a task set (--tasks tasks.jsonl)")
    return build_builtin(source, read_instructions(tasks), out)


# --- the one loading path ------------------------------------------------------------------------


def load(
    model_dir: str | Path,
    expected: dict[str, str] | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    vision: dict | None = None,
    base_expected: dict[str, str] | None = None,
):
    """(model, processor) from a local model folder, checked first when a manifest is given:
    the weights loaded in `dtype` (and moved to `device`; a trainer places its model itself), the
    processor with `vision`'s pixel bounds ({min_pixels, max_pixels}) if given, else its own.
    A LoRA checkpoint (an adapter folder) loads onto the base model its adapter config names,
    checked against `base_expected` when given."""

    # torch and transformers load here, not at import: the manifest, check and pin commands and a
    # job that refuses its inputs run without them.
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model_dir = Path(model_dir)
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ModelPinError(f"load {model_dir}: unknown dtype {dtype!r} (e.g. float32, bfloat16)")
    if expected is not None:
        check_manifest(model_dir, expected)
    elif not model_dir.is_dir():
        raise ModelPinError(f"model folder {model_dir} does not exist")
    base = adapter_base(model_dir)
    if base is not None and base_expected is not None:
        check_manifest(base, base_expected)
    model = AutoModelForImageTextToText.from_pretrained(
        base or model_dir, local_files_only=True, dtype=getattr(torch, dtype)
    )
    if base is not None:  # a LoRA checkpoint: its adapters merged into its base
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, model_dir).merge_and_unload()
    model.eval()
    if device != "cpu":
        model.to(device)
    # The processor's documented bounds (e.g. Qwen3-VL's model card): each image is resized to
    # hold between min_pixels and max_pixels, in whole patches; they go into every checkpoint's
    # processor_config.json, so evaluation sees the screens as training did.
    bounds = {k: vision[k] for k in ("min_pixels", "max_pixels")} if vision else {}
    processor = AutoProcessor.from_pretrained(model_dir, local_files_only=True, **bounds)
    return model, processor


ADAPTER_CONFIG = "adapter_config.json"  # peft's: a folder holding LoRA adapters, not a model


def adapter_base(model_dir: str | Path) -> Path | None:
    """The base model folder a LoRA checkpoint's adapters were trained on, or None for a model."""
    config = Path(model_dir) / ADAPTER_CONFIG
    if not config.is_file():
        return None
    try:
        return Path(json.loads(config.read_text())["base_model_name_or_path"])
    except (ValueError, KeyError, TypeError) as e:
        raise ModelPinError(f"{config}: no base_model_name_or_path ({e})") from None


def base_manifest(model_dir: str | Path, receipts: Receipts) -> dict[str, str] | None:
    """The manifest a LoRA checkpoint's base must match (the warm start's or the frozen
    model's receipt), or None for a whole model."""
    base = adapter_base(model_dir)
    return None if base is None else model_manifest_for(base, receipts)


def model_manifest_for(model_dir: Path, receipts: Receipts) -> dict[str, str]:
    """The sha256 manifest a model folder must match: the warm start's receipt's when the folder
    is the warm start's output, else the frozen model receipt's."""
    for name in ("sft.json", "model.json"):
        if name in receipts:
            predicate = read_receipt(receipts[name])["predicate"]
            if Path(predicate["directory"]) == Path(model_dir):
                return predicate["files"]
    raise ModelPinError(f"model folder {model_dir} is neither the frozen model nor the SFT output")


def load_checked(model_dir: str | Path, receipts: Receipts, compute=None):
    """(model, processor), after checking the folder's files against their receipt; on the
    dtype and with the pixel bounds of `compute` (trainer/compute.py) if given, left on the CPU
    for the trainer (or each of accelerate's processes) to place."""
    expected = model_manifest_for(Path(model_dir), receipts)
    if compute is None:
        return load(model_dir, expected)
    return load(model_dir, expected, compute.dtype, vision=compute.vision)


# --- pinning a hub repository --------------------------------------------------------------------


def _transport_errors() -> tuple[type[Exception], ...]:
    """Connection errors of the HTTP client under huggingface_hub (httpx2 from 2.x, else httpx)."""

    errors = []
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(importlib.import_module(name).TransportError)
    return tuple(errors)


def git_blob_id(path: str | Path) -> str:
    """The git blob id of a file (sha1 over "blob <size>\\0" and the bytes): what the hub lists
    for a file that is not in LFS, so a downloaded small file is checked against the listing."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def pin(ref: str, endpoint: str | None = None) -> tuple[HubSource, dict[str, str]]:
    """Resolve `hf://owner/name[@branch|tag|commit]` to a commit and its per-file sha256 manifest,
    from one metadata request (`model_info(files_metadata=True)`).

    LFS files (the weights) carry their sha256 in the listing; the small files (configs,
    tokenizer, template) carry only a git blob id, so each is downloaded, checked against its
    blob id, and hashed. `endpoint`: another hub (HF_ENDPOINT otherwise).
    """

    repo_id, revision = split_hub_ref(ref)
    api = HfApi(endpoint=endpoint)
    try:
        info = api.model_info(repo_id, revision=revision or "main", files_metadata=True)
        if not info.sha or not COMMIT.fullmatch(info.sha):
            raise ModelPinError(f"pin {ref}: the hub gave no commit for {revision or 'main'}")
        source = HubSource(repo_id, info.sha)
        manifest: dict[str, str] = {}
        with tempfile.TemporaryDirectory() as scratch:
            for sibling in info.siblings or []:
                if sibling.lfs is not None:
                    manifest[sibling.rfilename] = sibling.lfs.sha256
                    continue
                local = hf_hub_download(
                    repo_id,
                    sibling.rfilename,
                    revision=info.sha,
                    cache_dir=scratch,
                    endpoint=endpoint,
                )
                if sibling.blob_id and git_blob_id(local) != sibling.blob_id:
                    raise ModelPinError(
                        f"pin {ref}: {sibling.rfilename} downloaded does not match the blob id "
                        "the hub lists for it"
                    )
                manifest[sibling.rfilename] = sha256_file(local)
    except OfflineModeIsEnabled:
        raise ModelPinError(f"pin {ref}: HF_HUB_OFFLINE is set; pinning needs the hub") from None
    except (HfHubHTTPError, OSError, *_transport_errors()) as e:
        raise ModelPinError(f"pin {ref}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    if not manifest:
        raise ModelPinError(f"pin {ref}: the hub lists no files at {source.revision}")
    return source, dict(sorted(manifest.items()))


def read_pin_file(path: str | Path) -> dict:
    """What `write_pin` wrote: {source, manifest} (a bare manifest has no source)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ModelPinError(f"manifest {path}: cannot read ({e})") from None
    return data if isinstance(data, dict) else {}


def write_pin(source: HubSource, manifest: dict[str, str], path: str | Path) -> Path:
    """The manifest file a config names (`model.manifest: <file>`): the source and its files."""
    text = _dump({"source": str(source), "manifest": manifest}, as_json=False) + "\n"
    atomic_write_text(path, text)
    return Path(path)


# --- CLI -----------------------------------------------------------------------------------------


def _dump(obj, as_json: bool) -> str:
    if as_json:
        return json.dumps(obj, indent=2, sort_keys=True)
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False).rstrip("\n")


def _read_spec(path: str | None) -> TinySpec | None:
    if path is None:
        return None
    try:
        values = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ModelPinError(f"tiny model spec {path}: cannot read ({e})") from None
    if not isinstance(values, dict):
        raise ModelPinError(f"tiny model spec {path}: expected a mapping of TinySpec fields")
    return spec_from_mapping(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.trainer.model", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="build (builtin) or fetch (hub) a model folder")
    p.add_argument("--source", required=True, help=f"{BUILTIN_TINY} or hf://owner/name@commit")
    p.add_argument("--out", required=True, help="model folder to create")
    p.add_argument("--tasks", help="tasks.jsonl whose instructions train the builtin tokenizer")
    p.add_argument("--spec", help="YAML/JSON of TinySpec fields for the builtin (e.g. seed)")
    p.add_argument("--manifest", help="check the result against this manifest file")

    p = sub.add_parser("manifest", help="print a model folder's per-file sha256 manifest")
    p.add_argument("model_dir")
    p.add_argument("--json", action="store_true", help="JSON instead of YAML")

    p = sub.add_parser("check", help="compare a model folder with a manifest file")
    p.add_argument("model_dir")
    p.add_argument("--manifest", required=True)

    p = sub.add_parser("pin", help="resolve a hub repo to a commit and print its manifest")
    p.add_argument("ref", help="hf://owner/name[@branch|tag|commit]")
    p.add_argument("--json", action="store_true", help="JSON instead of YAML")
    p.add_argument("--write", help="write the manifest file a config names (model.manifest)")
    p.add_argument(
        "--expect", help="refuse unless the commit is this one (a config's pinned source)"
    )

    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            source = parse_source(args.source, _read_spec(args.spec))
            out = materialize(source, args.out, args.tasks)
            manifest = (
                check_manifest(out, read_manifest_file(args.manifest))
                if args.manifest
                else model_manifest(out)
            )
            print(
                f"{source} -> {out}: {len(manifest)} files, "
                f"aggregate sha256 {aggregate_digest(manifest)}"
            )
        elif args.command == "manifest":
            print(_dump(model_manifest(args.model_dir), args.json))
        elif args.command == "check":
            manifest = check_manifest(args.model_dir, read_manifest_file(args.manifest))
            print(f"ok: {args.model_dir} matches {len(manifest)} files")
        elif args.command == "pin":
            source, manifest = pin(args.ref)
            if args.expect and str(source) != args.expect:
                raise ModelPinError(f"pin {args.ref}: the hub resolves {source}, not {args.expect}")
            if args.write:
                write_pin(source, manifest, args.write)
                print(f"{source}: {len(manifest)} files pinned in {args.write}")
            else:
                print(_dump({"source": str(source), "manifest": manifest}, args.json))
    except Refusal as e:
        return refused(e, code=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
