"""Does the embedded tiny Qwen3-VL learn to use the screenshot? A reproducible study (issue 4).

    python bench/learnability.py [--condition global|locate|select|all] [--steps N] [--out F.json]

Seen so far (one seed each, batch 32, lr 2e-3): `global` learns in ~100 steps; `locate` on a 2x2
grid stayed at chance for 700 steps without the builder changes and, with both, jumped to 0.92 at
step 600 in one run whose cosine schedule spanned 1200 steps, but not in the run below (700-step
schedule): the transition is not reliable yet. Try longer schedules (--steps 1200):

    python bench/learnability.py --condition locate --side 64 --steps 700 --eval-every 100 \
        --rope-theta 100 --pos-init 2

One screenshot -> one click, trained with plain supervised steps (the oracle click) from the
random initialisation of `builtin:tiny-qwen3-vl`, evaluated on held-out screens (fresh seeds):

- `global`: the whole screen has one of 16 colours and the colour says which of 16 cells to click.
  A control: the image reaches the answer only as a global property, no localisation needed.
- `locate`: one coloured square in one of the grid's cells ("Click Red."); the square's cell is the
  answer. Needs localisation only.
- `select`: three coloured squares, the instruction names one. Needs localisation and matching.

The prompt is the shortest the Qwen3-VL template renders (no tool schema, no system prompt):
`<image> Click Red.` and the answer is the tool call TRL parses,
`<tool_call>{"name": "click", "arguments": {"x": 48, "y": 80}}</tool_call>`, with coordinates
snapped to the centre of the merged vision token's cell. Success = all coordinate digits right
(teacher-forced argmax, which equals greedy decoding once the call format is learned). Every
evaluation also runs with a blank and with a shuffled screenshot, and reports the total-variation
distance between the answer distributions with the real and a shuffled screenshot: 0 means the
policy does not look at the screen at all.

Candidate builder changes, each a flag, so their effect can be measured before anyone adopts them:
`--rope-theta` (the text rotary base; the builder uses Qwen3-VL's 5e6, under which 4 neighbouring
image positions are nearly indistinguishable) and `--pos-init` (a fixed one-hot 2-D code of this
size in the vision position table instead of the random 0.02 one).
Screenshots are turned into pixel values by an exact re-implementation of the image processor's
patching (checked against it at start-up), which is ~10x faster than calling it per step.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer import tiny_model  # noqa: E402
from trainer.tiny_model import TinySpec  # noqa: E402

PALETTE = {
    "Red": (220, 30, 30), "Blue": (30, 60, 220), "Green": (30, 170, 50), "Gold": (230, 190, 20),
    "Pink": (240, 120, 200), "Cyan": (30, 210, 220), "Black": (10, 10, 10), "Lime": (160, 240, 40),
}
GLOBAL_COLOURS = [(r, g, b) for r in (0, 255) for g in (0, 100, 200, 255) for b in (0, 255)]
BACKGROUND = (228, 228, 228)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--condition", default="all", choices=("global", "locate", "select", "all"))
    p.add_argument("--side", type=int, default=64, help="screen side in pixels (multiple of 32)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--held-out", type=int, default=256)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--rope-theta", type=float, default=None, help="override the text rope base")
    p.add_argument("--pos-init", type=float, default=0.0, help="one-hot 2-D vision position code")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="write the results table as JSON here")
    return p.parse_args(argv)


# --- screens -------------------------------------------------------------------------------------


def make_screen(rng: random.Random, condition: str, side: int):
    """(image, colour named in the instruction, answer cell) for one seeded screen."""
    grid = side // 32  # one merged vision token per 32x32 cell (patch 16, merge 2)
    if condition == "global":
        cell = rng.randrange(grid * grid)
        return Image.new("RGB", (side, side), GLOBAL_COLOURS[cell % 16]), "Red", cell
    k = 1 if condition == "locate" else 3
    cells = rng.sample(range(grid * grid), k)
    names = rng.sample(list(PALETTE), k)
    img = Image.new("RGB", (side, side), BACKGROUND)
    d = ImageDraw.Draw(img)
    for cell, name in zip(cells, names, strict=True):
        s = rng.randint(16, 26)
        x0 = 32 * (cell % grid) + rng.randint(2, 32 - s - 2)
        y0 = 32 * (cell // grid) + rng.randint(2, 32 - s - 2)
        d.rectangle([x0, y0, x0 + s - 1, y0 + s - 1], fill=PALETTE[name], outline=(0, 0, 0))
    return img, names[0], cells[0]


def cell_centre(cell: int, side: int) -> tuple[int, int]:
    grid = side // 32
    return 16 + 32 * (cell % grid), 16 + 32 * (cell // grid)


def pixel_values(images, patch=16, merge=2, temporal=2):
    """Qwen2VLImageProcessor's output for screens already at a multiple of patch*merge."""
    x = torch.from_numpy(np.stack([np.asarray(im, dtype=np.float32) for im in images]))
    x = (x / 255.0 - 0.5) / 0.5
    b, h, w, c = x.shape
    x = x.permute(0, 3, 1, 2).unsqueeze(1).repeat(1, temporal, 1, 1, 1)
    gh, gw = h // patch, w // patch
    x = x.reshape(b, 1, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return x.reshape(b * gh * gw, c * temporal * patch * patch), torch.tensor([[1, gh, gw]] * b)


# --- the model -----------------------------------------------------------------------------------


def build_model(args, folder: Path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    instructions = sorted(f"Click {name}." for name in PALETTE)
    tiny_model.build(instructions, folder, TinySpec(seed=args.seed))
    if args.rope_theta is not None:
        config_path = folder / "config.json"
        config = json.loads(config_path.read_text())
        config["text_config"]["rope_parameters"]["rope_theta"] = args.rope_theta
        config_path.write_text(json.dumps(config))
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(folder)
    if args.pos_init > 0:
        table = model.model.visual.pos_embed.weight
        n = round(table.shape[0] ** 0.5)
        with torch.no_grad():
            table.zero_()
            for r in range(n):
                for c in range(n):
                    table[r * n + c, c] = args.pos_init
                    table[r * n + c, n + r] = args.pos_init
    return model, processor


class Batcher:
    def __init__(self, processor, side: int):
        self.tok = processor.tokenizer
        self.tok.padding_side = "right"
        self.side = side
        self.image_id = self.tok.convert_tokens_to_ids("<|image_pad|>")
        self.start_id = self.tok.convert_tokens_to_ids("<|im_start|>")
        self.template = processor
        # The fast patching must equal the processor's.
        probe = [Image.new("RGB", (side, side), (i * 40, 90, 200 - i * 30)) for i in range(3)]
        want = processor.image_processor(images=probe, return_tensors="pt")["pixel_values"]
        if (want - pixel_values(probe)[0]).abs().max() > 1e-5:
            raise RuntimeError("fast patching differs from the image processor")

    def text(self, colour: str, cell: int) -> str:
        x, y = cell_centre(cell, self.side)
        call = {"type": "function", "function": {"name": "click", "arguments": {"x": x, "y": y}}}
        messages = [
            {"role": "user",
             "content": [{"type": "image"}, {"type": "text", "text": f"Click {colour}."}]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        return self.template.apply_chat_template(messages, tokenize=False)

    def __call__(self, screens, images=None):
        n_img = (self.side // 32) ** 2
        texts = [self.text(c, cell).replace("<|image_pad|>", "<|image_pad|>" * n_img)
                 for _, c, cell in screens]
        enc = dict(self.tok(texts, return_tensors="pt", padding=True))
        ids = enc["input_ids"]
        enc["mm_token_type_ids"] = (ids == self.image_id).long()
        enc["pixel_values"], enc["image_grid_thw"] = pixel_values(images or [s[0] for s in screens])
        labels = torch.full_like(ids, -100)
        digits = []
        for i in range(ids.shape[0]):
            first = (ids[i] == self.start_id).nonzero().flatten()[-1].item() + 3
            last = enc["attention_mask"][i].nonzero().flatten().max().item()
            labels[i, first : last + 1] = ids[i, first : last + 1]
            digits.append([j for j in range(first, last + 1)
                           if self.tok.decode([ids[i, j].item()]).isdigit()])
        enc["labels"] = labels
        return enc, digits


@torch.no_grad()
def evaluate(model, batcher, screens, mode="real"):
    """Success rate (all coordinate digits right) with the real, a blank or a shuffled screen."""
    model.eval()
    images = [s[0] for s in screens]
    if mode == "blank":
        images = [Image.new("RGB", im.size, BACKGROUND) for im in images]
    elif mode == "shuffled":
        images = images[1:] + images[:1]
    hits, probs = 0, []
    for i in range(0, len(screens), 64):
        enc, digits = batcher(screens[i : i + 64], images[i : i + 64])
        enc.pop("labels")
        logits = model(**enc).logits
        for b, dp in enumerate(digits):
            hits += all(logits[b, j - 1].argmax() == enc["input_ids"][b, j] for j in dp)
            probs.append(torch.stack([logits[b, j - 1].softmax(-1) for j in dp]))
    model.train()
    return hits / len(screens), probs


def screen_dependence(model, batcher, screens) -> float:
    """Mean total-variation distance between answer-digit distributions, real vs shuffled screen."""
    _, real = evaluate(model, batcher, screens, "real")
    _, other = evaluate(model, batcher, screens, "shuffled")
    distances = [0.5 * (p - q).abs().sum(-1).mean().item()
                 for p, q in zip(real, other, strict=True)]
    return float(np.mean(distances))


def run(args, condition: str) -> dict:
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model, processor = build_model(args, Path(tmp) / "model")
    batcher = Batcher(processor, args.side)
    held_rng, train_rng = random.Random(10_000 + args.seed), random.Random(args.seed)
    held = [make_screen(held_rng, condition, args.side) for _ in range(args.held_out)]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * s / args.steps)),
    )
    grid = args.side // 32
    chance = 1 / (grid * grid) if condition != "select" else 1 / 3
    curve, start = [], time.time()
    model.train()
    for step in range(1, args.steps + 1):
        screens = [make_screen(train_rng, condition, args.side) for _ in range(args.batch)]
        enc, _ = batcher(screens)
        loss = model(**enc).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % args.eval_every == 0 or step == args.steps:
            acc, _ = evaluate(model, batcher, held)
            curve.append({"step": step, "loss": round(loss.item(), 4), "held_out": acc})
            print(f"[{condition}] step {step} loss {loss.item():.3f} held-out {acc:.3f}",
                  flush=True)
    seconds = time.time() - start
    return {
        "condition": condition,
        "side": args.side,
        "cells": grid * grid,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "rope_theta": args.rope_theta,
        "pos_init": args.pos_init,
        "held_out": curve[-1]["held_out"],
        "blank": evaluate(model, batcher, held, "blank")[0],
        "shuffled": evaluate(model, batcher, held, "shuffled")[0],
        "screen_dependence_tv": round(screen_dependence(model, batcher, held[:64]), 4),
        "chance_cell": 1 / (grid * grid),
        "chance_object": chance,
        "seconds_per_step": round(seconds / args.steps, 3),
        "curve": curve,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    conditions = ("global", "locate", "select") if args.condition == "all" else (args.condition,)
    rows = [run(args, c) for c in conditions]
    print("| condition | cells | steps | held-out | blank | shuffled | TV real/shuffled | chance "
          "| s/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['condition']} | {r['cells']} | {r['steps']} | {r['held_out']:.3f} | "
              f"{r['blank']:.3f} | {r['shuffled']:.3f} | {r['screen_dependence_tv']:.3f} | "
              f"{r['chance_cell']:.3f} | {r['seconds_per_step']:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
