"""The versions of what touches numbers, read from the installed packages' metadata (nothing is
imported): recorded in every run's pins and checked when the run starts, so a run is never
compared with one under another lock (locks/cpu.txt, locks/gpu.txt)."""

from __future__ import annotations

import importlib.metadata

PACKAGES = (
    "torch",
    "torchvision",
    "transformers",
    "huggingface-hub",
    "trl",
    "peft",
    "accelerate",
    "vllm",
)


def versions() -> dict[str, str | None]:
    """Package -> installed version (None where it is not installed: vLLM off the GPU path)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def drift(pinned: dict[str, str | None]) -> list[str]:
    """'name pinned -> installed' for each package whose installed version is not the pinned one."""
    now = versions()
    return [
        f"{name} {pinned[name]} -> {now.get(name)}"
        for name in sorted(pinned)
        if now.get(name) != pinned[name]
    ]
