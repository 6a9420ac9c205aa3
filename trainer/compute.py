"""Where and how the model runs: `training.compute` from the run's pins, turned into the settings
of the libraries that do the work (TRL's GRPOConfig, peft's LoraConfig, `trl vllm-serve`'s
command line, accelerate's launcher). Nothing here imports torch, peft or vLLM, so a job, a test
or a dry run can build and check the GPU settings on a machine that has none of them.

One rule for every path: the same settings for the warm start, every arm's GRPO and every
evaluation, frozen in the pins (a run on other hardware settings is another run, never compared).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from envab import software
from envab.schema import CONFIG_SCHEMA, ConfigError, load_schema


def _schema_defaults(*path: str) -> dict:
    """The config schema's defaults of the settings at `path` under `training`: a pinned section
    that leaves one out (a run pinned before it existed) gets the value the schema fills."""
    node = load_schema(CONFIG_SCHEMA)["properties"]["training"]
    for key in path:
        node = node["properties"][key]
    return {k: v["default"] for k, v in node["properties"].items() if "default" in v}


COMPUTE = _schema_defaults("compute")
LORA = _schema_defaults("compute", "lora")
VLLM = _schema_defaults("compute", "vllm")
GRPO = _schema_defaults("grpo")


@dataclass(frozen=True)
class Lora:
    r: int
    alpha: float
    dropout: float = LORA["dropout"]
    target_modules: str | tuple[str, ...] = LORA["target_modules"]


@dataclass(frozen=True)
class Vllm:
    mode: str  # colocate | server
    gpu_memory_utilization: float = VLLM["gpu_memory_utilization"]
    tensor_parallel_size: int = VLLM["tensor_parallel_size"]
    port: int = VLLM["port"]
    server_gpus: str = VLLM[
        "server_gpus"
    ]  # server mode: its CUDA_VISIBLE_DEVICES; empty: inherited
    startup_timeout_s: float = VLLM["startup_timeout_s"]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Compute:
    """training.compute (schema defaults filled)."""

    device: str = COMPUTE["device"]
    dtype: str = COMPUTE["dtype"]
    gradient_checkpointing: bool = COMPUTE["gradient_checkpointing"]
    per_device_batch: int | None = COMPUTE["per_device_batch"]
    processes: int = COMPUTE["processes"]
    accelerate_config: str | None = COMPUTE["accelerate_config"]
    lora: Lora | None = None
    vllm: Vllm | None = None
    vision: dict | None = field(default=None)  # training.vision: the processor's pixel bounds

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"


def compute_settings(training: dict) -> Compute:
    """The typed settings of a pinned `training` section, with the checks the schema cannot make
    (one line each). A config from before `compute` existed is the CPU default."""
    values = dict(training.get("compute") or {})
    lora = values.pop("lora", None)
    if lora is not None:
        lora = {**LORA, **lora}
        targets = lora["target_modules"]
        lora = Lora(
            r=lora["r"],
            alpha=lora.get("alpha", 2 * lora["r"]),  # the schema's description: default 2 r
            dropout=lora["dropout"],
            target_modules=targets if isinstance(targets, str) else tuple(targets),
        )
    vllm = values.pop("vllm", None)
    vllm = Vllm(**vllm) if vllm is not None else None
    compute = Compute(**values, lora=lora, vllm=vllm, vision=training.get("vision"))
    check(compute, training)
    return compute


def check(compute: Compute, training: dict) -> None:
    where = "training.compute"
    if compute.vllm is not None and compute.cpu:
        raise ConfigError(f"{where}.vllm: vLLM generates on a GPU only; set device: cuda")
    if compute.vllm is not None and training["grpo"].get("turn_end", GRPO["turn_end"]) == "bias":
        raise ConfigError(
            "training.grpo.turn_end: bias is transformers' sequence bias, which vLLM does not "
            "have; set turn_end: none (the model ends its turns itself, in evaluation too)"
        )
    batch = training["grpo"]["num_generations"] * training["grpo"]["prompts_per_step"]
    per_step = batch // compute.processes
    if batch % compute.processes:
        raise ConfigError(
            f"{where}.processes: {compute.processes} does not divide the step's {batch} "
            "completions (num_generations x prompts_per_step)"
        )
    groups = training["grpo"]["num_generations"]
    if per_step % groups:
        raise ConfigError(
            f"{where}.processes: {compute.processes} processes would split a GRPO group across "
            f"processes ({per_step} completions each, groups of {groups}); a group is one task's "
            "rollouts on one process's environments"
        )
    if compute.per_device_batch is not None and per_step % compute.per_device_batch:
        raise ConfigError(
            f"{where}.per_device_batch: {compute.per_device_batch} does not divide the "
            f"{per_step} completions each process has per step"
        )
    if compute.vision and compute.vision["min_pixels"] > compute.vision["max_pixels"]:
        raise ConfigError("training.vision: min_pixels is above max_pixels")


def micro_batches(compute: Compute, batch: int) -> tuple[int, int]:
    """(per-device batch, gradient accumulation steps) for `batch` completions a step: the
    optimizer sees the same batch whatever the split."""
    per_process = batch // compute.processes
    per_device = compute.per_device_batch or per_process
    return per_device, per_process // per_device


def grpo_kwargs(compute: Compute, batch: int) -> dict:
    """GRPOConfig's settings that come from `compute` (TRL 1.16 names)."""
    per_device, accumulation = micro_batches(compute, batch)
    kwargs = {
        "use_cpu": compute.cpu,
        "bf16": compute.dtype == "bfloat16" and not compute.cpu,
        "gradient_checkpointing": compute.gradient_checkpointing,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": accumulation,
        # The step's generation batch is generated once and learned from in micro-batches, so a
        # GRPO group is never split across optimizer steps.
        "steps_per_generation": accumulation,
        "use_vllm": compute.vllm is not None,
    }
    if compute.vllm is not None:
        kwargs |= {
            "vllm_mode": compute.vllm.mode,
            "vllm_gpu_memory_utilization": compute.vllm.gpu_memory_utilization,
            "vllm_tensor_parallel_size": compute.vllm.tensor_parallel_size,
        }
        if compute.vllm.mode == "server":
            kwargs["vllm_server_base_url"] = compute.vllm.base_url
    return kwargs


def lora_kwargs(compute: Compute) -> dict | None:
    """peft.LoraConfig's settings, or None for full fine-tuning."""
    if compute.lora is None:
        return None
    lora = compute.lora
    targets = lora.target_modules
    return {
        "r": lora.r,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": targets if isinstance(targets, str) else list(targets),
        "task_type": "CAUSAL_LM",
    }


def lora_config(compute: Compute):
    """peft's LoraConfig, or None for full fine-tuning (peft loads only here)."""
    kwargs = lora_kwargs(compute)
    if kwargs is None:
        return None
    from peft import LoraConfig

    return LoraConfig(**kwargs)


# The vLLM releases TRL 1.16 accepts (trl/import_utils.py: 0.22.0 to 0.31.0); locks/gpu.txt pins
# 0.31.0, whose torch 2.13.0 is not the CPU lock's, so the GPU path installs from its own lock.
VLLM_ACCEPTED = ((0, 22, 0), (0, 31, 0))
GPU_INSTALL = "pip install -e '.[gpu]' -c locks/gpu.txt"


def check_cuda(vllm: bool = False) -> None:
    """Refuse a cuda run, in one line saying what to do, where no GPU is visible or the vLLM it
    needs is missing or outside the range TRL accepts."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            "training.compute.device: cuda, but torch sees no CUDA device "
            f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    if not vllm:
        return
    check_vllm_version(software.versions()["vllm"])


def check_vllm_version(version: str | None) -> None:
    """One line saying exactly what to install when vLLM is missing or not one TRL accepts."""
    if version is None:
        raise ConfigError(f"training.compute.vllm: vLLM is not installed; {GPU_INSTALL}")
    found = tuple(int(p) for p in re.findall(r"\d+", version)[:3])
    if not VLLM_ACCEPTED[0] <= found <= VLLM_ACCEPTED[1]:
        raise ConfigError(
            f"training.compute.vllm: vLLM {version} is not one TRL 1.16 accepts (0.22.0 to "
            f"0.31.0); {GPU_INSTALL}"
        )


def vllm_serve_command(compute: Compute, model_dir: str) -> list[str]:
    """`trl vllm-serve` for server mode: the model folder the run was checked against, its dtype,
    and the log-probs the importance-sampling correction needs (after temperature and processing,
    as TRL warns when a server runs otherwise)."""
    vllm = compute.vllm
    if vllm is None or vllm.mode != "server":
        raise ConfigError("training.compute.vllm.mode is not server: nothing to serve")
    return [
        "trl",
        "vllm-serve",
        "--model",
        str(model_dir),
        "--dtype",
        compute.dtype,
        "--port",
        str(vllm.port),
        "--host",
        "127.0.0.1",
        "--tensor-parallel-size",
        str(vllm.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(vllm.gpu_memory_utilization),
        "--logprobs-mode",
        "processed_logprobs",
    ]


def launcher(compute: Compute) -> list[str]:
    """The command a training job's Python module is started with: plain python for one process,
    `accelerate launch` for several (with the config's file if any). Each process learns its rank
    from the launcher's environment (trainer/ranks.py)."""
    if compute.processes == 1 and compute.accelerate_config is None:
        return ["python", "-m"]
    command = ["accelerate", "launch", "--num_processes", str(compute.processes)]
    if compute.accelerate_config:
        command += ["--config_file", compute.accelerate_config]
    elif compute.cpu:
        # accelerate's torchrun-based launcher (its --cpu launcher starts one process, or needs
        # MPI); the processes join gloo because training asks for the CPU (use_cpu)
        command += ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no"]
        command += ["--dynamo_backend", "no"]
    return [*command, "-m"]
