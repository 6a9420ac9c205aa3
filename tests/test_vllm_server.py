"""Server mode's lifecycle, with a stand-in for `trl vllm-serve` (a real HTTP server on loopback
that answers the health route only after a while): the job waits for it, records it, and stops it
after; a server that dies first, or never answers, is one clear error, and nothing is left
running. With several training processes, only rank 0 starts it; the others wait for it."""

from __future__ import annotations

import socket
import sys
import threading

import pytest

from envab.trainer.compute import Compute, Vllm
from envab.trainer.vllm_server import ServerError, healthy, served

STAND_IN = """
import sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
time.sleep(float(sys.argv[2]))          # a model loading
if sys.argv[3] == "die":
    sys.exit(3)
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health/" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_mode(port: int, timeout_s: float = 30.0) -> Compute:
    return Compute(device="cuda", vllm=Vllm(mode="server", port=port, startup_timeout_s=timeout_s))


def stand_in(port: int, delay_s: float, how: str = "serve") -> list[str]:
    return [sys.executable, "-c", STAND_IN, str(port), str(delay_s), how]


def test_the_job_waits_for_the_server_and_stops_it_after(tmp_path):
    port = free_port()
    compute = server_mode(port)
    with served(compute, "model", tmp_path / "vllm.log", stand_in(port, 1.0)) as server:
        assert healthy(compute.vllm.base_url)
        assert server["startup_s"] >= 1.0 and server["base_url"].endswith(f":{port}")
    assert not healthy(compute.vllm.base_url)  # stopped with the block


def test_a_server_that_dies_first_is_one_clear_error(tmp_path):
    port = free_port()
    with (
        pytest.raises(ServerError, match=r"exited with status 3 before it was healthy"),
        served(server_mode(port), "model", tmp_path / "vllm.log", stand_in(port, 0.2, "die")),
    ):
        pass


def test_a_server_that_never_answers_is_stopped_at_its_timeout(tmp_path):
    port = free_port()
    with (
        pytest.raises(ServerError, match=r"not healthy after 2 s"),
        served(server_mode(port, 2.0), "model", tmp_path / "vllm.log", stand_in(port, 60)),
    ):
        pass
    assert not healthy(f"http://127.0.0.1:{port}")


def test_no_server_outside_server_mode(tmp_path):
    with served(Compute(), "model", tmp_path / "vllm.log", ["false"]) as server:
        assert server == {}
    assert not (tmp_path / "vllm.log").exists()


def test_the_other_ranks_wait_for_rank_0s_server_and_start_none(tmp_path):
    port = free_port()
    compute = server_mode(port, timeout_s=30.0)
    never = ["false"]  # a rank other than 0 that started its command would fail at once
    rank1: dict = {}

    def other_rank():  # begins waiting before rank 0 has started anything
        with served(compute, "model", tmp_path / "rank1.log", never, starts=False) as server:
            rank1.update(server)

    waiting = threading.Thread(target=other_rank)
    waiting.start()
    with served(compute, "model", tmp_path / "vllm.log", stand_in(port, 1.5)) as rank0:
        waiting.join(timeout=30)
        assert rank1["started_by"] == "rank 0" and rank1["base_url"] == rank0["base_url"]
        assert rank1["waited_s"] >= 1.0  # it waited for rank 0's server to load
        assert healthy(compute.vllm.base_url)  # rank 1 leaving did not stop it
    assert not healthy(compute.vllm.base_url)
    assert not (tmp_path / "rank1.log").exists()


def test_a_rank_whose_server_never_comes_says_so(tmp_path):
    port = free_port()
    with (
        pytest.raises(ServerError, match=r"not healthy after 1 s"),
        served(server_mode(port, 1.0), "model", tmp_path / "r1.log", ["false"], starts=False),
    ):
        pass
