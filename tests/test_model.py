"""The model pin: the tiny Qwen3-VL builds byte-identically, loads through the Auto classes and
generates; the manifest check refuses changed, missing and extra files by name; hub sources need a
commit and fail clearly offline."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import torch
from PIL import Image

from envab.trainer import model as pin
from envab.trainer.tiny_model import build_config, build_model, trl_qwen3_vl_template
from envab.trainer.tiny_spec import TinySpec

REPO = Path(__file__).resolve().parents[1]
TASKS = [
    {"id": "t1", "family": "click", "instruction": "Click the red button"},
    {"id": "t2", "family": "click", "instruction": "Click the button labelled Save"},
    {"id": "t3", "family": "type", "instruction": "Type hello into the name field"},
    {"id": "t4", "family": "check", "instruction": "Tick the box labelled Remember me"},
]


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None):
    return subprocess.Popen(
        [sys.executable, "-m", "envab.trainer.model", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny model built twice, by two separate processes running at the same time."""
    root = tmp_path_factory.mktemp("tiny")
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    outs = [root / "a", root / "b"]
    procs = [
        run_cli(
            "build", "--source", "builtin:tiny-qwen3-vl", "--tasks", str(tasks), "--out", str(o)
        )
        for o in outs
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    return outs[0], outs[1]


@pytest.fixture(scope="module")
def loaded(built):
    model_dir = built[0]
    return pin.load(model_dir, expected=pin.model_manifest(model_dir))


@pytest.fixture
def model_copy(built, tmp_path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(built[0], copy)
    return copy


# --- the build -----------------------------------------------------------------------------------


def test_two_builds_in_two_processes_are_byte_identical(built):
    a, b = (pin.model_manifest(d) for d in built)
    assert a == b
    expected = {
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "processor_config.json",
        "tiny_spec.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert set(a) == expected


def test_seed_decides_the_weights(built, loaded):
    model, processor = loaded
    spec = TinySpec()
    config = build_config(processor.tokenizer, spec)
    same = build_model(config, spec).state_dict()
    other = build_model(config, TinySpec(seed=spec.seed + 1)).state_dict()
    saved = model.state_dict()
    assert all(torch.equal(same[k], saved[k]) for k in saved)
    assert not torch.equal(other["lm_head.weight"], saved["lm_head.weight"])


def test_parameter_count_is_tiny(loaded):
    model, _ = loaded
    n = sum(p.numel() for p in model.parameters())
    assert 200_000 < n < 5_000_000, n
    assert next(model.parameters()).dtype == torch.float32


def test_chat_template_is_trls_file_byte_for_byte(built, loaded):
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        qwen3_vl_chat_template,
        qwen3_vl_training_chat_template,
        supports_tool_calling,
    )

    trl_file = Path(__import__("trl").__file__).parent / "chat_templates" / "qwen3_vl.jinja"
    assert (built[0] / "chat_template.jinja").read_bytes() == trl_file.read_bytes()
    _, processor = loaded
    assert processor.chat_template == qwen3_vl_chat_template == trl_qwen3_vl_template()
    # TRL recognises the template (it raises on an unknown one) and can parse a tool call.
    add_response_schema(processor)
    assert supports_tool_calling(processor)
    assert is_chat_template_prefix_preserving(processor)
    # ... and maps it to its training variant (assistant-only loss masks) for SFT.
    assert get_training_chat_template(processor) == qwen3_vl_training_chat_template
    call = '<tool_call>\n{"name": "click", "arguments": {"x": 12, "y": 40}}\n</tool_call><|im_end|>'
    parsed = processor.tokenizer.parse_response(call, prefix="")
    assert parsed["tool_calls"][0]["function"] == {"name": "click", "arguments": {"x": 12, "y": 40}}


def test_token_ids_agree_between_tokenizer_and_config(loaded):
    model, processor = loaded
    tok, cfg = processor.tokenizer, model.config
    assert (
        cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>") == processor.image_token_id
    )
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert cfg.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert cfg.text_config.vocab_size == len(tok)
    # Tool-call markers are not special: a decoded completion keeps them for the parser.
    ids = tok.encode('<tool_call>\n{"name": "done"}\n</tool_call><|im_end|>')
    assert (
        tok.decode(ids, skip_special_tokens=True) == '<tool_call>\n{"name": "done"}\n</tool_call>'
    )
    # Instructions round-trip, and the BPE learned merges from them (fewer tokens than bytes).
    text = TASKS[0]["instruction"]
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) < len(text.encode()) / 2


def test_processor_sizes_match_the_vision_config(loaded):
    model, processor = loaded
    vision, ip = model.config.vision_config, processor.image_processor
    assert (ip.patch_size, ip.temporal_patch_size, ip.merge_size) == (
        vision.patch_size,
        vision.temporal_patch_size,
        vision.spatial_merge_size,
    )


@pytest.mark.parametrize("side, tokens", [(128, 16), (256, 16), (64, 4)])
def test_screenshot_becomes_the_expected_number_of_vision_tokens(loaded, side, tokens):
    model, processor = loaded
    inputs = chat_inputs(processor, Image.new("RGB", (side, side), (200, 30, 30)))
    assert (inputs["input_ids"] == model.config.image_token_id).sum().item() == tokens
    grid = inputs["image_grid_thw"][0].tolist()
    assert grid[1] * grid[2] // processor.image_processor.merge_size**2 == tokens


def chat_inputs(processor, image):
    messages = [
        {
            "role": "user",
            "content": [{"type": "image", "image": image}, {"type": "text", "text": "Click Save"}],
        }
    ]
    return processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )


def test_loads_and_generates_from_a_chat_with_a_screenshot(loaded):
    model, processor = loaded
    red = chat_inputs(processor, Image.new("RGB", (128, 128), (200, 30, 30)))
    blue = chat_inputs(processor, Image.new("RGB", (128, 128), (30, 30, 200)))
    with torch.no_grad():
        logits_red = model(**red).logits
        logits_blue = model(**blue).logits
    assert logits_red.shape == (1, red["input_ids"].shape[1], model.config.text_config.vocab_size)
    # The screenshot reaches the output: another image changes the next-token logits.
    assert not torch.allclose(logits_red[0, -1], logits_blue[0, -1])
    out = model.generate(**red, max_new_tokens=4, do_sample=False, eos_token_id=None)
    assert out.shape == (1, red["input_ids"].shape[1] + 4)
    assert torch.equal(out[0, : red["input_ids"].shape[1]], red["input_ids"][0])


# --- the manifest check --------------------------------------------------------------------------


def test_manifest_check_passes_an_untouched_copy(built, model_copy):
    assert pin.check_manifest(model_copy, pin.model_manifest(built[0])) == pin.model_manifest(
        built[0]
    )


def test_flipped_byte_is_refused_naming_the_file(built, model_copy):
    weights = model_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(pin.ModelPinError, match=r"mismatched: model\.safetensors\)"):
        pin.check_manifest(model_copy, pin.model_manifest(built[0]))


def test_missing_and_extra_files_are_refused_each_by_name(built, model_copy):
    (model_copy / "tokenizer.json").unlink()
    (model_copy / "notes.txt").write_text("not part of the model\n")
    (model_copy / "config.json").write_text("{}\n")
    with pytest.raises(pin.ModelPinError) as e:
        pin.check_manifest(model_copy, pin.model_manifest(built[0]))
    message = str(e.value)
    assert "\n" not in message
    assert "mismatched: config.json" in message
    assert "missing: tokenizer.json" in message
    assert "extra: notes.txt" in message


def test_only_the_hub_bookkeeping_folder_is_ignored(built, model_copy):
    expected = pin.model_manifest(built[0])
    (model_copy / ".cache" / "huggingface").mkdir(parents=True)
    (model_copy / ".cache" / "huggingface" / "download.lock").write_text("x")
    pin.check_manifest(model_copy, expected)
    (model_copy / "sub" / ".cache").mkdir(parents=True)
    (model_copy / "sub" / ".cache" / "w.bin").write_text("x")
    (model_copy / ".hidden").write_text("x")
    with pytest.raises(pin.ModelPinError, match=r"extra: \.hidden, sub/\.cache/w\.bin"):
        pin.check_manifest(model_copy, expected)


def test_load_refuses_a_folder_that_does_not_match(built, model_copy):
    (model_copy / "generation_config.json").unlink()
    with pytest.raises(pin.ModelPinError, match="missing: generation_config.json"):
        pin.load(model_copy, expected=pin.model_manifest(built[0]))


def test_cli_manifest_then_check(built, model_copy, tmp_path):
    printed = run_cli("manifest", str(built[0]))
    out, err = printed.communicate(timeout=120)
    assert printed.returncode == 0, err
    manifest_file = tmp_path / "manifest.yaml"
    manifest_file.write_text(out)
    assert pin.read_manifest_file(manifest_file) == pin.model_manifest(built[0])

    ok = run_cli("check", str(model_copy), "--manifest", str(manifest_file))
    out, err = ok.communicate(timeout=120)
    assert ok.returncode == 0 and out.startswith("ok:"), err

    (model_copy / "tokenizer_config.json").write_text("{}")
    bad = run_cli("check", str(model_copy), "--manifest", str(manifest_file))
    out, err = bad.communicate(timeout=120)
    assert bad.returncode == 1
    assert err.strip().splitlines() == [
        f"error: model folder {model_copy} does not match its manifest "
        "(mismatched: tokenizer_config.json)"
    ]


def test_build_refuses_to_overwrite_a_model_folder(built, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(TASKS[0]) + "\n")
    with pytest.raises(pin.ModelPinError, match="already has files"):
        pin.materialize(pin.parse_source("builtin:tiny-qwen3-vl"), built[0], tasks)


# --- sources -------------------------------------------------------------------------------------


def test_hub_source_parses_to_repo_and_commit():
    source = pin.parse_source(pin.QWEN3_VL_4B)
    assert source == pin.HubSource(
        "Qwen/Qwen3-VL-4B-Instruct", "ebb281ec70b05090aa6165b016eac8ec08e71b17"
    )
    assert str(source) == pin.QWEN3_VL_4B


@pytest.mark.parametrize(
    "text, problem",
    [
        ("hf://Qwen/Qwen3-VL-4B-Instruct@main", "40-hex commit, not 'main'"),
        ("hf://Qwen/Qwen3-VL-4B-Instruct@" + "A" * 40, "40-hex commit"),
        ("hf://Qwen/Qwen3-VL-4B-Instruct@" + "a" * 39, "40-hex commit"),
        ("hf://Qwen/Qwen3-VL-4B-Instruct", "missing @<40-hex commit>"),
        ("hf://Qwen3-VL-4B-Instruct@" + "a" * 40, "must be <owner>/<name>"),
        ("hf://Qwen/bad name@" + "a" * 40, "bad hub repo id"),
        ("builtin:huge-model", "expected builtin:tiny-qwen3-vl"),
    ],
)
def test_malformed_sources_are_refused(text, problem):
    with pytest.raises(pin.ModelPinError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        pin.parse_source(text)


def test_offline_hub_source_not_on_disk_gives_one_clear_line(tmp_path):
    out = tmp_path / "qwen"
    proc = run_cli(
        "build",
        "--source",
        pin.QWEN3_VL_4B,
        "--out",
        str(out),
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")},
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: model source {pin.QWEN3_VL_4B}: HF_HUB_OFFLINE is set")
    assert not out.exists()


def test_offline_pin_is_refused(tmp_path):
    proc = run_cli(
        "pin",
        "hf://Qwen/Qwen3-VL-4B-Instruct",
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")},
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.strip().splitlines() == [
        "error: pin hf://Qwen/Qwen3-VL-4B-Instruct: HF_HUB_OFFLINE is set; pinning needs the hub"
    ]


# --- a hub over real HTTP ------------------------------------------------------------------------
# A local server speaking the few hub routes that `pin` and `snapshot_download` use (revision
# info, recursive tree, resolve), serving the tiny model as `envab/tiny` at one commit with
# model.safetensors stored as LFS. It exercises the real huggingface_hub client end to end.

HUB_REPO = "envab/tiny"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_handler(files: dict[str, bytes], lfs: set[str]):
    def git_blob_id(data: bytes) -> str:
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def etag(path: str) -> str:
        data = files[path]
        return hashlib.sha256(data).hexdigest() if path in lfs else git_blob_id(data)

    class Hub(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, code: int, body: bytes = b"", headers: dict | None = None):
            self.send_response(code)
            for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def not_found(self, code: str):
            self.reply(404, b'{"error": "not found"}', {"X-Error-Code": code})

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            parts = unquote(urlparse(self.path).path).strip("/").split("/")
            api = parts[:2] == ["api", "models"]
            repo = "/".join(parts[2:4] if api else parts[0:2])
            if repo != HUB_REPO:
                return self.not_found("RepoNotFound")
            route, rev, rest = (
                (parts[4], parts[5], parts[6:]) if api else (parts[2], parts[3], parts[4:])
            )
            if rev not in ("main", HUB_COMMIT):
                return self.not_found("RevisionNotFound")
            if route == "revision":
                info = {
                    "id": HUB_REPO,
                    "sha": HUB_COMMIT,
                    "siblings": [{"rfilename": f} for f in files],
                }
                return self.reply(200, json.dumps(info).encode())
            if route == "tree":
                tree = [
                    {"type": "file", "path": f, "size": len(d), "oid": git_blob_id(d)}
                    | (
                        {"lfs": {"oid": etag(f), "size": len(d), "pointerSize": 130}}
                        if f in lfs
                        else {}
                    )
                    for f, d in sorted(files.items())
                ]
                return self.reply(200, json.dumps(tree).encode())
            path = "/".join(rest)
            if route != "resolve" or path not in files:
                return self.not_found("EntryNotFound")
            headers = {"X-Repo-Commit": HUB_COMMIT, "ETag": f'"{etag(path)}"'}
            return self.reply(200, files[path], headers)

    return Hub


@pytest.fixture(scope="module")
def hub(built):
    files = {p: (built[0] / p).read_bytes() for p in pin.model_manifest(built[0])}
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake_hub_handler(files, {"model.safetensors"}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_pin_resolves_a_branch_to_the_commit_and_the_manifest(hub, built):
    proc = run_cli("pin", f"hf://{HUB_REPO}", "--json", env={"HF_ENDPOINT": hub})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    pinned = json.loads(out)
    assert pinned["source"] == f"hf://{HUB_REPO}@{HUB_COMMIT}"
    assert pinned["manifest"] == pin.model_manifest(built[0])


def test_fetch_checks_then_loads_and_works_offline_once_on_disk(hub, built, tmp_path):
    manifest_file = tmp_path / "manifest.json"
    manifest_file.write_text(json.dumps({"manifest": pin.model_manifest(built[0])}))
    out = tmp_path / "fetched"
    source = f"hf://{HUB_REPO}@{HUB_COMMIT}"
    args = ("build", "--source", source, "--out", str(out), "--manifest", str(manifest_file))
    env = {"HF_ENDPOINT": hub, "HF_HOME": str(tmp_path / "hf-home")}
    online = run_cli(*args, env=env)
    _, err = online.communicate(timeout=120)
    assert online.returncode == 0, err
    assert (out / ".cache" / "huggingface").is_dir()  # the hub's bookkeeping, ignored by rule

    offline = run_cli(*args, env={**env, "HF_HUB_OFFLINE": "1"})
    text, err = offline.communicate(timeout=120)
    assert offline.returncode == 0, err
    assert text.startswith(f"{source} -> ")

    model, processor = pin.load(out, expected=pin.model_manifest(built[0]))
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"


def test_unknown_commit_on_the_hub_is_named(hub, tmp_path):
    source = f"hf://{HUB_REPO}@{'f' * 40}"
    proc = run_cli(
        "build", "--source", source, "--out", str(tmp_path / "m"), env={"HF_ENDPOINT": hub}
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert (
        err.strip().splitlines()[-1] == f"error: model source {source}: the hub has no such commit"
    )


# --- inputs --------------------------------------------------------------------------------------


def test_task_without_instruction_is_refused_with_its_line(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(TASKS[0]) + "\n" + json.dumps({"id": "x", "family": "f"}) + "\n")
    with pytest.raises(pin.ModelPinError, match=r"tasks\.jsonl:2: task has no 'instruction'"):
        pin.read_instructions(tasks)


def test_instructions_are_a_sorted_set(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    rows = [TASKS[2], TASKS[0], TASKS[2]]
    tasks.write_text("".join(json.dumps(t) + "\n" for t in rows))
    assert pin.read_instructions(tasks) == sorted(
        {TASKS[0]["instruction"], TASKS[2]["instruction"]}
    )


def test_spec_refuses_unknown_and_inconsistent_values():
    assert pin.spec_from_mapping({"seed": 3}).seed == 3
    with pytest.raises(pin.ModelPinError, match="unknown key"):
        pin.spec_from_mapping({"sead": 3})
    with pytest.raises(pin.ModelPinError, match="screen_side 100 must be a multiple of"):
        pin.spec_from_mapping({"screen_side": 100})
