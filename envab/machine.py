"""The kind of machine a job ran on: what bit-determinism holds within.

CPU training here is bit-deterministic only on the same kind of machine with the same number of
threads (torch's kernels choose by instruction set, and its sums depend on how many threads share
them); GPU training is not bit-deterministic at all. Every training run records its machine kind
(run.json), so a verdict can say which case it rests on, and the small run's golden digests are
kept per kind (envab/digests.py).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

# The instruction-set features torch's CPU kernels choose between: two machines that differ in
# one of them may sum in another order.
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "sve")


def machine_kind(cpuinfo: str | None = None, threads: int | None = None) -> dict:
    """The CPU model, the instruction-set features among `ISA_FLAGS`, and the threads a job
    gets (Snakemake gives a timed job every core it was given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "cpu": fields.get("model name") or platform.processor() or platform.machine(),
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "threads": threads if threads is not None else (os.cpu_count() or 1),
    }


def describe(kind: dict) -> str:
    """A machine kind in words: "AMD EPYC (avx, avx2, fma), 2 threads", and its GPU if any."""
    text = f"{kind.get('cpu')} ({', '.join(kind.get('isa') or []) or 'no listed features'})"
    text += f", {kind.get('threads')} threads"
    if kind.get("accelerator"):
        text += f", {kind['accelerator'].get('gpu')}"
    return text


def accelerator() -> dict | None:
    """The GPU a job trained on (model, CUDA runtime), None on a CPU run; torch only if loaded."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}
