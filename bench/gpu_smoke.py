"""GPU smoke: the `.test` workflow (its tiny model, or Qwen3-VL-4B weights already on disk) on one
GPU with no network, vLLM colocated, a handful of GRPO steps and the held-out evaluation.

    python bench/gpu_smoke.py --out DIR [--model-dir DIR_OF_QWEN3_VL_4B] [--valid 64]

A copy of the workflow in DIR/workflow with `.test`'s config, the GPU settings of
config/qwen3-vl-4b.yaml (bf16, vLLM colocated, turn_end none) and a budget of --valid valid
trajectories; `snakemake --cores all` runs it end to end (freeze, warm start, GRPO on the drums
arm, the held-out evaluations). Prints each step's time split (generation, environment, learning,
TRL's glue; trainer/step_times.py), generated tokens per second and the peak GPU memory, all from
the run's run.json, and writes DIR/gpu_smoke.json. Needs the GPU lock
(pip install -e '.[gpu]' -c locks/gpu.txt). Not yet run on a GPU (docs/how-to/gpus.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
COPIED = (
    "Snakefile",
    "rules",
    "schemas",
    "report",
    "envab",
    "envs",
    "trainer",
    "eval",
    "analysis",
    "pyproject.toml",
)  # what the code pins hash (envab/codepins.py)


def workflow(out: Path, valid: int, model_dir: str | None) -> Path:
    root = out / "workflow"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for name in COPIED:
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, root / name)
    config = yaml.safe_load((REPO / ".test/config.yaml").read_text())
    real = yaml.safe_load((REPO / "config/qwen3-vl-4b.yaml").read_text())["training"]
    config["training"]["compute"] = {k: v for k, v in real["compute"].items() if k != "lora"}
    config["training"]["grpo"]["turn_end"] = "none"  # vLLM has no sequence bias
    if model_dir:  # Qwen3-VL-4B weights on disk: pinned by their own manifest, nothing fetched
        from envab.trainer.model import QWEN3_VL_4B, model_manifest

        config["model"] = {"source": QWEN3_VL_4B, "manifest": model_manifest(model_dir)}
        config["training"]["compute"]["lora"] = real["compute"]["lora"]
        config["training"]["vision"] = real["vision"]
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    target = yaml.safe_load((REPO / ".test/target.yaml").read_text())
    target["experiment_id"] = "gpu-smoke"
    target["budget"]["max_valid_trajectories"] = valid
    (root / "target.yaml").write_text(yaml.safe_dump(target, sort_keys=False))
    if model_dir:  # where rule model's snapshot_download finds it offline
        (root / "results/gpu-smoke").mkdir(parents=True)
        shutil.copytree(model_dir, root / "results/gpu-smoke/model")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--valid", type=int, default=64)
    parser.add_argument("--model-dir", help="Qwen3-VL-4B-Instruct's files, already on disk")
    args = parser.parse_args(argv)
    out = Path(args.out)
    root = workflow(out, args.valid, args.model_dir)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "all", "--directory", str(root)], env=env
    )
    if result.returncode:
        print(f"gpu smoke: the workflow failed (logs under {root}/logs)", file=sys.stderr)
        return result.returncode
    runs = sorted(root.glob("results/gpu-smoke/*/seed*/run.json"))
    report = {}
    for path in runs:
        run = json.loads(path.read_text())
        times = run["step_times"]
        after = times.get("after_first_s", {})
        steps = max(1, times.get("steps", 1) - 1)
        report[path.parent.parent.name] = {
            "s_per_step_after_first": round(after.get("step_s", 0.0) / steps, 3),
            "parts_s_after_first": after,
            "generated_tokens_per_s": run.get("generated_tokens_per_s"),
            "cuda_peak_memory_gib": run.get("cuda_peak_memory_gib"),
            "valid": run["valid_trajectories"],
        }
    (out / "gpu_smoke.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
