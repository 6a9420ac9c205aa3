"""The GPU path short of CUDA: training.compute from the real-deployment config becomes TRL's,
peft's and vLLM's settings; the schema and cross-checks refuse what cannot run, in one line; the
CPU default builds exactly the GRPO settings it always had; vLLM's check says what to install."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from envab import software
from envab.schema import CONFIG_SCHEMA, ConfigError, check_schema
from envab.trainer import compute as c

REPO = Path(__file__).resolve().parent.parent


def training_of(path: str) -> dict:
    config = yaml.safe_load((REPO / path).read_text())
    check_schema(config, CONFIG_SCHEMA, path, fill_defaults=True)
    return config["training"]


def test_the_cpu_default_builds_the_grpo_settings_it_always_had():
    training = training_of("config.yaml")
    settings = c.compute_settings(training)
    assert settings == c.Compute()  # nothing set: the CPU, float32, the whole batch at once
    assert c.grpo_kwargs(settings, 16) == {
        "use_cpu": True,
        "bf16": False,
        "gradient_checkpointing": False,
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "use_vllm": False,
    }
    assert c.lora_config(settings) is None
    assert c.launcher(settings) == ["python", "-m"]
    two = c.compute_settings({**training, "compute": {"processes": 2}})
    assert c.launcher(two)[:4] == ["accelerate", "launch", "--num_processes", "2"]
    assert "--multi_gpu" in c.launcher(two) and c.launcher(two)[-1] == "-m"


def test_the_real_deployment_config_builds_trl_peft_and_vllm_settings(tmp_path):
    from trl import GRPOConfig

    training = training_of("config/qwen3-vl-4b.yaml")
    settings = c.compute_settings(training)
    assert (settings.device, settings.dtype, settings.vllm.mode) == ("cuda", "bfloat16", "colocate")
    batch = training["grpo"]["num_generations"] * training["grpo"]["prompts_per_step"]
    kwargs = c.grpo_kwargs(settings, batch)
    assert kwargs["bf16"] and not kwargs["use_cpu"] and kwargs["use_vllm"]
    # TRL's own object takes every name; its bf16 check needs a GPU, so that one flag is lifted
    # here, and the step's generation batch is still whole: 4 micro-batches of 4 = 16.
    config = GRPOConfig(
        output_dir=str(tmp_path),
        num_generations=training["grpo"]["num_generations"],
        **{**kwargs, "bf16": False},
    )
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (4, 4)
    assert config.generation_batch_size == batch
    assert (config.vllm_mode, config.vllm_gpu_memory_utilization) == ("colocate", 0.3)
    lora = c.lora_config(settings)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (16, 32, 0.05)
    assert lora.target_modules == "all-linear"


def test_server_mode_serves_the_checked_model_with_processed_logprobs():
    training = copy.deepcopy(training_of("config/qwen3-vl-4b.yaml"))
    training["compute"]["vllm"] = {"mode": "server", "port": 8123, "gpu_memory_utilization": 0.8}
    settings = c.compute_settings(training)
    command = c.vllm_serve_command(settings, "results/x/sft/model")
    assert command[:4] == ["trl", "vllm-serve", "--model", "results/x/sft/model"]
    flags = dict(zip(command[4::2], command[5::2], strict=True))
    assert flags["--dtype"] == "bfloat16" and flags["--port"] == "8123"
    assert flags["--logprobs-mode"] == "processed_logprobs"
    assert c.grpo_kwargs(settings, 16)["vllm_server_base_url"] == "http://127.0.0.1:8123"


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            lambda t: t["compute"].update(device="cpu"),
            "training.compute.device: 'cuda' was expected",
        ),
        (
            lambda t: t["grpo"].update(turn_end="bias"),
            "training.grpo.turn_end: bias is transformers' sequence bias, which vLLM does not have",
        ),
        (lambda t: t["compute"].update(processes=4), "4 processes would split a GRPO group"),
        (
            lambda t: t["compute"].update(per_device_batch=3),
            "per_device_batch: 3 does not divide the 16 completions",
        ),
        (lambda t: t["compute"].update(dtype="float16"), "'float16' is not one of"),
        (lambda t: t["vision"].update(min_pixels=10**8), "min_pixels is above max_pixels"),
        (lambda t: t["compute"]["lora"].pop("r"), "'r' is a required property"),
    ],
)
def test_settings_that_cannot_run_are_refused_in_one_line(edit, expected):
    config = yaml.safe_load((REPO / "config/qwen3-vl-4b.yaml").read_text())
    edit(config["training"])
    with pytest.raises(ConfigError) as refused:
        check_schema(config, CONFIG_SCHEMA, "config", fill_defaults=True)
        c.compute_settings(config["training"])
    assert expected in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_vllm_check_says_exactly_what_to_install():
    c.check_vllm_version("0.31.0")
    c.check_vllm_version("0.22.0")
    for version in (None, "0.33.0", "0.21.1"):
        with pytest.raises(ConfigError, match=r"pip install -e '\.\[gpu\]' -c locks/gpu\.txt"):
            c.check_vllm_version(version)
    gpu_lock = (REPO / "locks/gpu.txt").read_text()
    assert "vllm==0.31.0" in gpu_lock and "torch==2.13.0" in gpu_lock


def test_the_software_a_run_is_pinned_under_is_what_is_installed():
    installed = software.versions()
    assert installed["torch"] and installed["trl"] == "1.16.0"
    cpu_lock = (REPO / "locks/cpu.txt").read_text()
    assert f"torch=={installed['torch']}" in cpu_lock  # the tests run under the CPU lock
    assert software.drift(installed) == []
    moved = software.drift({**installed, "transformers": "0.0.1"})
    assert moved == [f"transformers 0.0.1 -> {installed['transformers']}"]
