"""GRPO training of one (arm, seed) run against the arm's environment, with exact accounting.

    python -m trainer.grpo --target preregistration/target.yaml \
        --pins results/<exp>/<arm>/seed<k>/pins.json --model results/<exp>/sft/model \
        --out results/<exp>/<arm>/seed<k>

Reads top to bottom in the order a run happens:

1. guards: the target is frozen and unedited, the freeze receipts verify, the frozen code is the
   code running, the run's pins match the receipts, no held-out id is in the training data;
2. seeding, then the dataset: one row per training task with its first screenshot pre-rendered;
3. the arm's backend, the fork-group layer and the ledger (trainer/accounting.py);
4. TRL's GRPOTrainer with the environment (trainer/environment.py) and a callback that saves the
   starting model as checkpoint valid-000000, starts the clock at the first step, saves a
   checkpoint every N valid trajectories and stops at the budget;
5. run.json: the final counters, the stop reason, when the run started and when it was frozen.

Settings come from the run's pins (`training.grpo`, frozen with the run), the checkpoint interval
and the budget from the frozen target. The GPU path (`--device cuda`: vLLM in server mode, pinned
to 0.30-0.31, optional LoRA through peft, launched with `accelerate launch -m trainer.grpo ...`)
is written but has never run: the machines this was built on have no GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from envab import preregistration
from envab.config import ConfigError
from envab.hashing import file_manifest, sha256_file
from envab.io import atomic_write_json, read_jsonl
from envab.receipts import read_receipt, receipt_dir, utc_now
from trainer import agent
from trainer.accounting import Ledger, Prices
from trainer.guards import (
    GuardError,
    HeldoutGuard,
    check_code,
    check_pins,
    check_receipts,
    heldout_ids,
)
from trainer.model import ModelPinError

log = logging.getLogger("trainer.grpo")

VLLM_RANGE = ((0, 30), (0, 32))  # trl 1.16 supports vLLM >= 0.30, < 0.32
FAULT_PLAN_ENV = "ENVAB_FAULT_PLAN"  # tests and reliability runs: a JSON file of host faults


@dataclass(frozen=True)
class GrpoSettings:
    """training.grpo from the run's pins (defaults filled by the config schema)."""

    learning_rate: float
    num_generations: int
    prompts_per_step: int
    max_turns: int
    max_completion_length: int
    temperature: float
    beta: float

    @property
    def batch_size(self) -> int:  # completions per GRPO step
        return self.num_generations * self.prompts_per_step


@dataclass(frozen=True)
class Budget:
    max_wall_clock_s: float
    max_valid_trajectories: int


# --- 1. guards -----------------------------------------------------------------------------------


def model_manifest_for(model_dir: Path, receipts: Path) -> dict[str, str]:
    """The sha256 manifest the model folder must match: the SFT receipt's when the folder is the
    warm start's output, else the frozen model receipt's."""
    for name in ("sft.json", "model.json"):
        path = receipts / name
        if path.is_file():
            predicate = read_receipt(path)["predicate"]
            if Path(predicate["directory"]) == model_dir:
                return predicate["files"]
    raise GuardError(f"model folder {model_dir} is neither the frozen model nor the SFT output")


def load_checked(model_dir: Path, receipts: Path):
    """(model, processor), after checking the folder's files against their receipt."""
    from trainer.model import ModelPinError, load, manifest_problems, model_manifest

    actual = model_manifest(model_dir)
    problems = manifest_problems(actual, model_manifest_for(model_dir, receipts))
    if any(problems.values()):
        named = "; ".join(f"{kind}: {', '.join(p)}" for kind, p in problems.items() if p)
        raise ModelPinError(f"model folder {model_dir} does not match its receipt ({named})")
    return load(model_dir)


def first_step_after_freeze(started_utc: str, frozen_utc: str) -> None:
    if started_utc <= frozen_utc:  # both ISO 8601 UTC with a Z: string order is time order
        raise GuardError(
            f"first training step at {started_utc} is not after the freeze at {frozen_utc}"
        )


def read_fault_plan() -> tuple[dict[int, dict], str | None]:
    """{attempt ordinal: host faults} from the file named by ENVAB_FAULT_PLAN, and its digest."""
    path = os.environ.get(FAULT_PLAN_ENV)
    if not path:
        return {}, None
    try:
        plan = json.loads(Path(path).read_text())
        faults = {int(k): dict(v) for k, v in plan["attempts"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise GuardError(
            f'{FAULT_PLAN_ENV}={path}: expected {{"attempts": {{ordinal: faults}}}} ({e})'
        ) from None
    return faults, sha256_file(path)


# --- 4. the callback: clock, checkpoints, budget -----------------------------------------------


START_CHECKPOINT = "valid-000000"  # the model before the first update


def make_callback(
    run, ledger: Ledger, budget: Budget, checkpoints_dir: Path, frozen_utc: str, processor, progress
):
    from transformers import TrainerCallback

    class Accounting(TrainerCallback):
        """Starts the clock at the first step, checkpoints every N valid trajectories (after the
        update that consumed them), and stops at whichever budget limit comes first."""

        stop_reason: str | None = None

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if ledger.started is None:
                files = save_checkpoint(model, processor, checkpoints_dir / START_CHECKPOINT)
                ledger.record_checkpoint(START_CHECKPOINT, 0, files)
                ledger.start()
                first_step_after_freeze(ledger.started_utc, frozen_utc)
            run.step = state.global_step + 1

        def on_step_end(self, args, state, control, model=None, **kwargs):
            progress.update(ledger.valid - progress.n)
            progress.set_postfix(invalid=ledger.invalid, step=state.global_step)
            while ledger.checkpoint_due():
                name = f"valid-{(ledger.checkpoints + 1) * ledger.checkpoint_interval:06d}"
                files = save_checkpoint(model, processor, checkpoints_dir / name)
                record = ledger.record_checkpoint(name, state.global_step, files)
                log.info(
                    "checkpoint %s at %d valid trajectories", name, record["valid_trajectories"]
                )
            self.stop_reason = ledger.stop_reason(
                budget.max_wall_clock_s, budget.max_valid_trajectories
            )
            if self.stop_reason:
                control.should_training_stop = True

    return Accounting()


def save_checkpoint(model, processor, path: Path) -> dict[str, str]:
    """Save into a temporary sibling, then rename: a checkpoint folder is whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return file_manifest(path)


# --- the run -------------------------------------------------------------------------------------


def train(args) -> dict:
    import torch
    from datasets import Dataset
    from tqdm import tqdm
    from transformers import set_seed
    from trl import GRPOTrainer

    from trainer.environment import (
        GenerationClock,
        Run,
        environment_factory,
        open_arm,
    )
    from trainer.forkgroups import ForkGroups

    # 1. guards, before anything is loaded or started
    target = preregistration.check_frozen(args.target)
    receipts = receipt_dir(target.experiment_id)
    check_receipts(receipts)
    check_code(receipts)
    pins = check_pins(args.pins, receipts)
    if pins["experiment_id"] != target.experiment_id:
        raise GuardError(f"{args.pins} belongs to experiment {pins['experiment_id']!r}")
    guard = HeldoutGuard(heldout_ids(receipts))
    split = read_receipt(receipts / "split.json")
    train_path = Path(
        next(s["name"] for s in split["subject"] if s["name"].endswith("train.jsonl"))
    )
    tasks = {t["id"]: t for t in read_jsonl(train_path)}
    guard.check_dataset(tasks)
    settings = GrpoSettings(**pins["training"]["grpo"])
    agent.use_tool_set(pins["training"]["tools"])  # before the environment class is made
    arm, seed = pins["arm"], int(pins["seed"])
    budget = Budget(**target.raw["budget"])
    faults, fault_plan_sha256 = read_fault_plan()
    out = Path(args.out)
    trajectories, checkpoints = out / "trajectories.jsonl", out / "checkpoints.jsonl"
    saved = out / "checkpoints"
    if any(p.is_file() and p.stat().st_size for p in (trajectories, checkpoints)) or (
        saved.is_dir() and any(saved.iterdir())
    ):
        raise GuardError(
            f"{out} already holds training records; records are append-only, "
            "so remove them (Snakemake does before a rerun) to train again"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        raise GuardError("--device cuda but no CUDA device is visible")
    if args.device == "cuda":
        check_vllm()

    # 2. seeding, then the dataset: each training task with its pre-rendered first screenshot
    set_seed(seed)
    rows, first_screens = agent.training_rows(tasks)
    dataset = Dataset.from_list(rows)
    model, processor = load_checked(Path(args.model), receipts)

    # 3. the arm, the fork-group layer, the ledger
    prices = target.raw["prices"]
    ledger = Ledger(
        trajectories_path=str(trajectories),
        checkpoints_path=str(checkpoints),
        arm=arm,
        seed=seed,
        checkpoint_interval=int(target.raw["evaluation"]["checkpoint_interval"]),
        prices=Prices(prices["host_usd_per_hour"][arm], prices["inference_usd_per_hour"]),
    )
    # The outputs exist from the start, even when no attempt or checkpoint comes due.
    saved.mkdir(parents=True, exist_ok=True)
    trajectories.touch()
    checkpoints.touch()
    with open_arm(pins["arm_config"], log_path=args.host_log, allow_faults=bool(faults)) as backend:
        groups = ForkGroups(backend, settings.num_generations, faults)
        run = Run(
            tasks, first_screens, guard, ledger, groups, settings.max_turns, GenerationClock()
        )
        progress = tqdm(
            total=budget.max_valid_trajectories,
            desc=f"{arm} seed{seed} valid",
            file=sys.stderr,
            mininterval=0,
            dynamic_ncols=False,
            ascii=True,
        )
        callback = make_callback(
            run, ledger, budget, saved, preregistration.frozen_utc(target), processor, progress
        )

        # 4. TRL's trainer, with the settings that must not differ between arms taken from pins
        config = grpo_config(settings, seed, out, args, processor.tokenizer)
        trainer = GRPOTrainer(
            model=model,
            processing_class=processor,
            args=config,
            train_dataset=dataset,
            environment_factory=environment_factory(run),
            callbacks=[callback],
            peft_config=lora_config(args.lora_r) if args.lora_r else None,
        )
        try:
            trainer.train()
        finally:
            groups.close()
            progress.close()
        # What the arm is, beyond its config (a VM pool: acceleration, guest and snapshot digests).
        environment = backend.describe() if hasattr(backend, "describe") else None

    # 5. the run's record
    record = {
        "arm": arm,
        "seed": seed,
        "experiment_id": target.experiment_id,
        **ledger.counters(),
        "stop_reason": callback.stop_reason or "trainer_finished",
        "steps": trainer.state.global_step,
        "checkpoints": ledger.checkpoints,
        "started_utc": ledger.started_utc,
        "frozen_utc": preregistration.frozen_utc(target),
        "ended_utc": utc_now(),
        "model": Path(args.model).as_posix(),
        "pins_sha256": sha256_file(args.pins),
        "fault_plan_sha256": fault_plan_sha256,
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "environment": environment,
    }
    atomic_write_json(out / "run.json", record)
    return record


def grpo_config(settings: GrpoSettings, seed: int, out: Path, args, tokenizer):
    from trl import GRPOConfig

    from trainer.agent import turn_generation_kwargs

    cpu = args.device == "cpu"
    return GRPOConfig(
        output_dir=str(out / "trainer"),  # TRL's scratch; checkpoints are ours (save_strategy no)
        seed=seed,
        data_seed=seed,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",  # max_steps below is only a ceiling; the budget stops us
        max_steps=10**9,
        per_device_train_batch_size=settings.batch_size,
        num_generations=settings.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=1,  # one generation batch per optimizer step: groups stay whole
        max_completion_length=settings.max_completion_length,
        max_tool_calling_iterations=settings.max_turns,
        temperature=settings.temperature,
        beta=settings.beta,
        # One tool call per turn (trainer/agent.py) on the transformers path; vLLM has no
        # sequence bias (see agent.turn_generation_kwargs).
        generation_kwargs=turn_generation_kwargs(tokenizer) if cpu else None,
        # Every completion keeps its gradient, a truncated one included: masking truncation
        # made running to the length limit a shelter from negative advantages, and the tiny
        # policy drifted there (measured; README "Does it learn?").
        mask_truncated_completions=False,
        use_cpu=cpu,
        bf16=not cpu,
        gradient_checkpointing=False,
        use_vllm=not cpu,
        vllm_mode="server",
        vllm_server_base_url=args.vllm_server if not cpu else None,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,  # our bar counts valid trajectories against the budget instead
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )


def lora_config(rank: int):
    from peft import LoraConfig

    return LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM"
    )


def check_vllm() -> None:
    try:
        import vllm
    except ImportError:
        raise GuardError("--device cuda needs vLLM 0.30-0.31 installed (server mode)") from None
    version = tuple(int(p) for p in vllm.__version__.split(".")[:2])
    if not VLLM_RANGE[0] <= version < VLLM_RANGE[1]:
        raise GuardError(
            f"vLLM {vllm.__version__} is outside the range trl 1.16 supports (0.30-0.31)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.grpo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--target", required=True, help="the frozen preregistration/target.yaml")
    parser.add_argument("--pins", required=True, help="results/<exp>/<arm>/seed<k>/pins.json")
    parser.add_argument("--model", required=True, help="the SFT output, or the pinned model")
    parser.add_argument("--out", required=True, help="results/<exp>/<arm>/seed<k>")
    parser.add_argument("--host-log", help="where an embedded host writes its log")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--vllm-server",
        default="http://127.0.0.1:8000",
        help="cuda only: `trl vllm-serve` base URL",
    )
    parser.add_argument("--lora-r", type=int, default=0, help="cuda only: LoRA rank (0: full)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        record = train(args)
    except (GuardError, ConfigError, ModelPinError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"train {record['arm']} seed {record['seed']}: {record['stop_reason']} after "
        f"{record['valid_trajectories']} valid, {record['invalid_discarded']} invalid, "
        f"{record['checkpoints']} checkpoints, {record['wall_clock_s']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
