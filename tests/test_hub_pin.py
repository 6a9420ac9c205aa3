"""`pin` against a hub on loopback that answers as the Hugging Face hub's API does (one
model_info request with files_metadata, then a download of each small file): the manifest, the
blob-id check of a download, the manifest file a config names, and a changed file refused after.

The metadata below is in the API's format (siblings with `blobId`, and `lfs.sha256` for weights);
it was not recorded from the hub, which is not reachable from where this was written."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envab.trainer import model as pin
from envab.trainer.manifest import check_manifest

REPO_ID = "Qwen/Qwen3-VL-4B-Instruct"
COMMIT = "ebb281ec70b05090aa6165b016eac8ec08e71b17"
SMALL = {
    "config.json": b'{"model_type": "qwen3_vl"}\n',
    "tokenizer_config.json": b'{"model_max_length": 262144}\n',
    "chat_template.json": b'{"chat_template": "{{ messages }}"}\n',
}
WEIGHTS = {
    "model-00001-of-00002.safetensors": b"w1" * 1000,
    "model-00002-of-00002.safetensors": b"w2" * 700,
}


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def model_info(tamper: str | None) -> dict:
    siblings = [
        {"rfilename": name, "blobId": blob_id(data), "size": len(data)}
        for name, data in SMALL.items()
    ]
    siblings += [
        {
            "rfilename": name,
            "blobId": blob_id(b"pointer " + name.encode()),
            "size": 135,
            "lfs": {
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "pointerSize": 135,
            },
        }
        for name, data in WEIGHTS.items()
    ]
    if tamper:  # the listing says one thing, the download is another
        next(s for s in siblings if s["rfilename"] == tamper)["blobId"] = "0" * 40
    return {
        "id": REPO_ID,
        "modelId": REPO_ID,
        "sha": COMMIT,
        "private": False,
        "siblings": siblings,
    }


@pytest.fixture
def hub():
    state = {"tamper": None, "requests": []}

    class Hub(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _file(self) -> bytes | None:
            prefix = f"/{REPO_ID}/resolve/{COMMIT}/"
            if self.path.startswith(prefix):
                return SMALL.get(self.path.removeprefix(prefix))
            return None

        def _answer(self, body: bytes, headers: dict, head: bool) -> None:
            self.send_response(200)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _serve(self, head: bool) -> None:
            state["requests"].append(self.path)
            path = self.path.split("?")[0]
            if path in (
                f"/api/models/{REPO_ID}/revision/main",
                f"/api/models/{REPO_ID}/revision/{COMMIT}",
            ):
                body = json.dumps(model_info(state["tamper"])).encode()
                return self._answer(body, {"Content-Type": "application/json"}, head)
            data = self._file()
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.end_headers()
                return
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{blob_id(data)}"'}
            return self._answer(data, headers, head)

        def do_GET(self):
            self._serve(head=False)

        def do_HEAD(self):
            self._serve(head=True)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()


def test_pin_resolves_a_commit_and_hashes_every_file(hub, tmp_path, monkeypatch):
    endpoint, state = hub
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    source, manifest = pin.pin(f"hf://{REPO_ID}", endpoint=endpoint)
    assert str(source) == f"hf://{REPO_ID}@{COMMIT}"
    expected = {
        name: hashlib.sha256(data).hexdigest() for name, data in {**SMALL, **WEIGHTS}.items()
    }
    assert manifest == expected
    # One metadata request; the weights are never downloaded, their sha256 comes from the listing.
    assert sum(p.startswith("/api/models/") for p in state["requests"]) == 1
    assert not any("safetensors" in p for p in state["requests"])

    pinned = pin.write_pin(source, manifest, tmp_path / "model.manifest.yaml")
    assert pin.read_pin_file(pinned)["source"] == str(source)
    folder = tmp_path / "snapshot"
    folder.mkdir()
    for name, data in {**SMALL, **WEIGHTS}.items():
        (folder / name).write_bytes(data)
    check_manifest(folder, pin.read_manifest_file(pinned))
    (folder / "config.json").write_bytes(b'{"model_type": "qwen3_vl", "edited": true}\n')
    with pytest.raises(pin.ModelPinError, match=r"mismatched: config\.json"):
        check_manifest(folder, pin.read_manifest_file(pinned))


def test_a_download_that_is_not_the_listed_blob_is_refused(hub, monkeypatch):
    endpoint, state = hub
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    state["tamper"] = "config.json"
    with pytest.raises(
        pin.ModelPinError, match="config.json downloaded does not match the blob id"
    ):
        pin.pin(f"hf://{REPO_ID}@{COMMIT}", endpoint=endpoint)
