"""Does the embedded default learn? The study of the templated layout, through the real pieces.

    python bench/learnability.py --out /tmp/study --templates 2 --sft-steps 600 --sft-lr 3e-3 \
        --grpo-steps 40 --grpo-lr 2e-4 --temp 1.0 --gens 8 --prompts 2 --max-completion 128 \
        --max-turns 2

(the settings under which the tiny model learns the cue; `--reuse-sft` reruns only GRPO on the
same OUT's warm start). Builds a templated click_button task set (envs/tasks/templated.py: K
layout templates told apart by a cue band, each label at a fixed slot of its template; K=2 takes
the two most different cues, the list and the bare window), splits it as the pipeline does
(envab/split.py), builds `builtin:tiny-qwen3-vl` from the training instructions, then:

1. held-out success of the pinned model (greedy, eval.heldout.evaluate on LocalBackend);
2. SFT warm start: TRL's SFTTrainer with trainer/sft.py's demonstrations and collator, rendered
   WITH the tool prompt (trainer/sft.py's WithTools), which is what GRPO and the evaluation
   render (`--sft-prompt plain` drops the tools, the old bug: trained on a 29-token prompt and
   evaluated on a ~256-token one, 0 % held-out);
3. held-out success after SFT, and with a blank first screenshot (the window colour only);
4. GRPO: TRL's GRPOTrainer with trainer/environment.py's environment on the chosen arm
   (`local`: LocalBackend; `restore` / `fork`: the embedded Drums host), trainer/grpo.py's config
   (`--max-turns`, `--max-completion`: one click and a done need ~60 completion tokens);
5. held-out success after GRPO, and its blank ablation; chance = 1/templates for a policy that
   knows every (template, label) slot but not which template is on screen.

The tool set is trainer/agent.py's `TOOL_SETS[--toolset]` (default `click`: click and done).
Earlier findings (the previous version of this script, random-init tiny model, supervised): a
global screen property -> answer mapping is learned in ~150 steps; localising an object among
image tokens stays at chance for hundreds of steps. Hence the templated layout.

Measured with the command above (2 shared cores, one seed, 96 train / 32 held-out tasks, chance
0.5): pinned 0.000; SFT 400 steps 0.594 (blank first screen 0.031); SFT 600 steps 0.844 (27/32;
blank 0.000); GRPO 40 steps at lr 2e-4 after it 0.844 (greedy unchanged, sampled training reward
0.73 -> 0.85); GRPO 80 steps at 3e-4 0.844. SFT ~1.4 s/step, GRPO ~2.9-3.9 s/step. With K=4
(two cues only ~4 RGB apart) SFT 200 steps stayed at chance (0.25), and GRPO at lr 1e-3
collapsed to 0. So: the warm start learns the cue; GRPO does not yet improve on it.
"""
import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--out", required=True, help="scratch folder (models, records, results.json)")
p.add_argument("--per-family", type=int, default=128)
p.add_argument("--templates", type=int, default=4)
p.add_argument("--toolset", default="click")
p.add_argument("--sft-steps", type=int, default=200)
p.add_argument("--sft-batch", type=int, default=16)
p.add_argument("--sft-lr", type=float, default=3e-3)
p.add_argument("--sft-prompt", choices=("tools", "plain"), default="tools")
p.add_argument("--grpo-steps", type=int, default=60)
p.add_argument("--grpo-lr", type=float, default=1e-3)
p.add_argument("--gens", type=int, default=8)
p.add_argument("--prompts", type=int, default=2)
p.add_argument("--temp", type=float, default=1.0)
p.add_argument("--beta", type=float, default=0.0, help="KL coefficient against the warm start")
p.add_argument("--max-turns", type=int, default=2)
p.add_argument("--max-completion", type=int, default=128)
p.add_argument("--reuse-sft", action="store_true",
               help="skip SFT when OUT/sft exists (rerun GRPO on the same warm start)")
p.add_argument("--arm", choices=("local", "restore", "fork"), default="local")
p.add_argument("--threads", type=int, default=1)
p.add_argument("--eval-temp", type=float, default=0.0,
               help="evaluation temperature (0: greedy; 1.0: the policy as GRPO samples it)")
p.add_argument("--eval-seeds", type=int, default=1, help="evaluation seeds (episodes per task)")
args = p.parse_args()

torch.set_num_threads(args.threads)

from trainer import agent  # noqa: E402

agent.TOOLS[:] = list(agent.TOOL_SETS[args.toolset])
agent._BY_NAME.clear()
agent._BY_NAME.update({t.__name__: t for t in agent.TOOLS})

from envab.split import split_tasks  # noqa: E402
from envs.tasks.local import LocalBackend  # noqa: E402
from eval.heldout import Policy, Protocol, evaluate  # noqa: E402
from trainer import tiny_model  # noqa: E402
from trainer.tiny_model import TinySpec  # noqa: E402

out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
from envs.tasks.build import build  # noqa: E402

tasks, solutions = build(1, args.per_family, families=["click_button"], layout="templated",
                         templates=args.templates)
sols = {s["id"]: s for s in solutions}
split = split_tasks(tasks, 0, 0.25)
train, held = split.train, split.heldout
print("train", len(train), "held", len(held), flush=True)
results = {"args": vars(args)}

pinned = out / "pinned"
if not pinned.exists():
    tiny_model.build(sorted({t["instruction"] for t in train}), pinned, TinySpec(seed=0))

proto = Protocol(episodes_per_task=1, seeds=tuple(range(args.eval_seeds)), max_steps=6,
                 max_invalid_retries=0, temperature=args.eval_temp, max_new_tokens=96)


class BlankFirst:
    """The backend, but the first screenshot is the window colour only."""
    can_fork = False

    def __init__(self, inner):
        self.inner = inner

    def create(self, task):
        from PIL import Image
        s = self.inner.create(task)
        shot = s.observation.screenshot
        s.observation = dataclasses.replace(
            s.observation, screenshot=Image.new("RGB", shot.size, (228, 228, 228)))
        return s


def ev(model_dir, tasks_, backend=None, tag=""):
    t0 = time.time()
    pol = Policy(model_dir, args.eval_temp, 96)
    r = evaluate(pol, backend or LocalBackend(), tasks_, proto)
    turns = [e["turns"] for e in r["episode_records"]]
    print(f"eval {tag}: {r['success_rate']:.3f} ({r['successes']}/{r['episodes']}) "
          f"turns {sum(turns)/len(turns):.2f} in {time.time()-t0:.1f}s", flush=True)
    return r["success_rate"]


def prompt_len(model_dir):
    from transformers import AutoProcessor
    proc = AutoProcessor.from_pretrained(model_dir)
    shot = agent.first_screenshot(train[0])
    ids = proc.apply_chat_template(agent.task_prompt(train[0], shot), tools=agent.TOOLS,
                                   add_generation_prompt=True, tokenize=True, return_dict=True)
    return len(ids["input_ids"][0]) if hasattr(ids["input_ids"][0], "__len__") else len(
        ids["input_ids"])


results["prompt_tokens"] = prompt_len(pinned)
print("prompt tokens", results["prompt_tokens"], flush=True)

sft_dir = out / "sft"
results["pinned"] = (json.loads((out / "sft_results.json").read_text()).get("pinned")
                     if args.reuse_sft and (out / "sft_results.json").exists() else None)
if results["pinned"] is None:
    results["pinned"] = ev(pinned, held, tag="pinned")
from datasets import Dataset  # noqa: E402
from transformers import set_seed  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from trainer.model import load  # noqa: E402
from trainer.sft import demonstration, demonstration_collator  # noqa: E402

demos = {t["id"]: demonstration(t, sols[t["id"]]["oracle"]) for t in train}
set_seed(0)
model, processor = load(pinned)
collator = demonstration_collator(processor, demos)
if args.sft_prompt == "plain":  # trainer/sft.py renders the tools (WithTools); undo that
    collator.processor = processor
cfg = SFTConfig(output_dir=str(out / "sft_scratch"), seed=0, max_steps=args.sft_steps,
                per_device_train_batch_size=args.sft_batch, learning_rate=args.sft_lr,
                lr_scheduler_type="constant", dataset_kwargs={"skip_prepare_dataset": True},
                use_cpu=True, bf16=False, gradient_checkpointing=False, save_strategy="no",
                logging_steps=10, report_to="none", remove_unused_columns=False,
                dataloader_num_workers=0)
ds = Dataset.from_list([{"task_id": i} for i in sorted(demos)])
if args.reuse_sft and (out / "sft_results.json").exists():
    results.update({k: v for k, v in json.loads((out / "sft_results.json").read_text()).items()
                    if k in ("sft_s_per_step", "sft_loss")})
    print("reusing", sft_dir, flush=True)
else:
    tr = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=processor,
                    data_collator=collator)
    t0 = time.time()
    res = tr.train()
    results["sft_s_per_step"] = (time.time() - t0) / args.sft_steps
    results["sft_loss"] = res.training_loss
    tr.model.save_pretrained(sft_dir)
    processor.save_pretrained(sft_dir)
    print(f"sft {args.sft_steps} steps {results['sft_s_per_step']:.2f}s/step", flush=True)
results["sft"] = ev(sft_dir, held, tag="sft")
results["sft_blank"] = ev(sft_dir, held, BlankFirst(LocalBackend()), tag="sft blank")
results["sft_train"] = ev(sft_dir, train[:32], tag="sft on 32 training tasks")
(out / "sft_results.json").write_text(json.dumps(
    {k: v for k, v in results.items() if k.startswith("sft") or k == "pinned"}, indent=1))

if args.grpo_steps:
    from datasets import Dataset
    from transformers import set_seed
    from trl import GRPOTrainer

    import trainer.environment as envmod
    from trainer.accounting import Ledger, Prices
    from trainer.environment import GenerationClock, Run, environment_factory
    from trainer.forkgroups import ForkGroups
    from trainer.grpo import GrpoSettings, grpo_config
    from trainer.guards import HeldoutGuard
    from trainer.model import load
    # the environment class got its tools at import: keep only this tool set
    for name in ("double_click", "type_text", "press", "scroll", "fail"):
        if name not in agent._BY_NAME and hasattr(envmod.ArmEnvironment, name):
            delattr(envmod.ArmEnvironment, name)
    set_seed(1)
    tmap = {t["id"]: t for t in train}
    rows, first = agent.training_rows(tmap)
    ds = Dataset.from_list(rows)
    model, processor = load(sft_dir)
    gdir = out / f"grpo_{args.arm}"
    gdir.mkdir(exist_ok=True)
    ledger = Ledger(str(gdir / "traj.jsonl"), str(gdir / "ckpt.jsonl"), args.arm, 1, 10**9,
                    Prices(0.1, 0.2))
    settings = GrpoSettings(args.grpo_lr, args.gens, args.prompts, args.max_turns,
                            args.max_completion, args.temp, args.beta)

    class A:
        device = "cpu"
        vllm_server = None
    cfg = grpo_config(settings, 1, gdir, A())
    cfg.max_steps = args.grpo_steps
    cfg.logging_steps = 5
    if args.arm == "local":
        cm = contextlib.nullcontext(LocalBackend())
    else:
        cm = envmod.open_arm({"backend": "drums", "url": "embedded", "mode": args.arm})
    with cm as backend:
        groups = ForkGroups(backend, args.gens)
        run = Run(tmap, first, HeldoutGuard({t["id"] for t in held}), ledger, groups, 2,
                  GenerationClock())
        from transformers import TrainerCallback

        class Step(TrainerCallback):
            def on_step_begin(self, a, state, c, **k):
                if ledger.started is None:
                    ledger.start()
                run.step = state.global_step + 1
        tr = GRPOTrainer(model=model, processing_class=processor, args=cfg, train_dataset=ds,
                         environment_factory=environment_factory(run), callbacks=[Step()])
        t0 = time.time()
        tr.train()
        results["grpo_s_per_step"] = (time.time() - t0) / args.grpo_steps
        groups.close()
    tr.model.save_pretrained(gdir / "model")
    processor.save_pretrained(gdir / "model")
    recs = [json.loads(x) for x in (gdir / "traj.jsonl").read_text().splitlines()]
    n = len(recs) // 4
    q = [sum(r["score"] or 0 for r in recs[i * n:(i + 1) * n]) / max(n, 1) for i in range(4)]
    results["grpo_train_reward_quarters"] = q
    print("grpo train reward by quarter", [round(x, 3) for x in q],
          f"{results['grpo_s_per_step']:.2f}s/step", flush=True)
    results["grpo"] = ev(gdir / "model", held, tag="grpo")
    results["grpo_blank"] = ev(gdir / "model", held, BlankFirst(LocalBackend()),
                               tag="grpo blank")
    results["grpo_train"] = ev(gdir / "model", train[:32], tag="grpo on 32 training tasks")
results["chance"] = 1 / args.templates
print("| stage | held-out | blank first screenshot | s/step |")
print("|---|---|---|---|")
print(f"| pinned | {results['pinned']:.3f} | | |")
print(f"| SFT ({args.sft_steps} steps) | {results['sft']:.3f} | {results['sft_blank']:.3f} | "
      f"{results['sft_s_per_step']:.2f} |")
if args.grpo_steps:
    print(f"| GRPO ({args.grpo_steps} steps, {args.arm}) | {results['grpo']:.3f} | "
          f"{results['grpo_blank']:.3f} | {results['grpo_s_per_step']:.2f} |")
print(f"chance (1/templates): {results['chance']:.3f}; prompt {results['prompt_tokens']} tokens")
(out / "results.json").write_text(json.dumps(results, indent=1))
