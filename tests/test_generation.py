"""Training and evaluation generate a turn the same way (what TRL's GRPOTrainer ends up passing to
generate and what the evaluation's policy passes are compared, so they cannot part), and a LoRA
checkpoint saved the way training saves one loads in evaluation as the model that was trained."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from envab.eval.episodes import Protocol
from envab.preregistration import Preregistration
from envab.schema import CONFIG_SCHEMA, check_schema
from envab.trainer import model as pin
from envab.trainer.build import grpo_config
from envab.trainer.callback import save_checkpoint
from envab.trainer.compute import compute_settings, lora_config
from envab.trainer.generation import Generation
from envab.trainer.run_inputs import GrpoSettings

REPO = Path(__file__).resolve().parent.parent
COMPARED = (
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "sequence_bias",
    "suppress_tokens",
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    instructions = ["Click the button labelled Save", "Click the button labelled Open"]
    return pin.build_builtin(pin.BuiltinSource(), instructions, out)


def embedded_training() -> dict:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    check_schema(config, CONFIG_SCHEMA, "config.yaml", fill_defaults=True)
    return config["training"]


def test_grpo_and_the_evaluation_generate_a_turn_alike(tiny, tmp_path):
    from datasets import Dataset
    from trl import GRPOTrainer

    training = embedded_training()
    model, processor = pin.load(tiny)
    settings = GrpoSettings(**training["grpo"])
    args = grpo_config(
        settings, 0, tmp_path / "trl", compute_settings(training), processor.tokenizer
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=processor,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 2),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
    )
    trained = {k: trainer.generation_kwargs.get(k) for k in COMPARED}
    # The evaluation at the pre-registered protocol's temperature (the embedded default samples
    # as GRPO does, at 1.0), with the run's pinned training settings.
    prereg = Preregistration.load(REPO / "preregistration/target.yaml")
    protocol = Protocol.frozen(prereg.evaluation, training)
    evaluated = protocol.generation.generate_kwargs(processor.tokenizer)
    assert trained == {k: evaluated.get(k) for k in COMPARED}
    assert trained["sequence_bias"]  # the turn-ending bias is on both sides, not on neither
    assert trained["suppress_tokens"]  # and so are the unsampleable tokens (trainer/generation.py)


def test_a_changed_turn_ending_changes_both_sides(tiny):
    _, processor = pin.load(tiny)
    training = copy.deepcopy(embedded_training())
    training["grpo"]["turn_end"] = "none"
    generation = Generation.pinned(training)
    assert "sequence_bias" not in generation.trl_kwargs(processor.tokenizer, vllm=True)
    assert "sequence_bias" not in generation.generate_kwargs(processor.tokenizer)
    with pytest.raises(ValueError, match="vLLM has no sequence bias"):
        Generation.pinned(embedded_training()).trl_kwargs(processor.tokenizer, vllm=True)


def test_a_lora_checkpoint_loads_in_evaluation_as_the_model_that_was_trained(tiny, tmp_path):
    from peft import get_peft_model

    training = copy.deepcopy(embedded_training())
    training["compute"]["lora"] = {"r": 4, "alpha": 8}
    model, processor = pin.load(tiny)
    peft_model = get_peft_model(model, lora_config(compute_settings(training)))
    torch.manual_seed(0)
    with torch.no_grad():  # as if trained: LoRA's B starts at zero, which would change nothing
        for name, weight in peft_model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.05)
    files = save_checkpoint(peft_model, processor, tmp_path / "valid-000016")
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files

    inputs = processor.apply_chat_template(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": Image.new("RGB", (64, 64), (200, 30, 30))},
                    {"type": "text", "text": "Click the button labelled Save"},
                ],
            }
        ],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        trained = peft_model.eval()(**inputs).logits
        base = pin.load(tiny)[0](**inputs).logits
    loaded, _ = pin.load(tmp_path / "valid-000016", base_expected=pin.model_manifest(tiny))
    with torch.no_grad():
        evaluated = loaded(**inputs).logits
    assert not torch.allclose(trained, base, atol=1e-4)  # the adapters change the model ...
    torch.testing.assert_close(evaluated, trained, atol=1e-4, rtol=1e-4)  # ... and load as such
    wrong_base = {**pin.model_manifest(tiny), "config.json": "0" * 64}
    with pytest.raises(pin.ModelPinError, match="mismatched: config.json"):
        pin.load(tmp_path / "valid-000016", base_expected=wrong_base)
