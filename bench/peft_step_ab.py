"""One training step of a petl-nas preset against PEFT's implementation of the same method, interleaved.

Owns one measurement: the ratio of median step times (forward + CE loss + backward + AdamW step +
zero_grad), petl-nas over PEFT, for presets that `step_time.peft_configs` pairs with a PEFT config.
The two models' steps alternate (A, B, A, B, ...) in one process, so load from other processes on
a shared machine falls on both alike; `step_time.py` times rows back to back, which a busy machine
skews. Models are `step_time.backbone`'s (the whole stack backpropagates in both).

    HF_HUB_OFFLINE=1 python bench/peft_step_ab.py --only ia3,ln_tuning [--size minilm|small]
        [--batch 8] [--seq 128] [--steps 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import step_time
import torch
from transformers import BertConfig

SIZES = {
    "minilm": step_time.MINILM,
    "small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512),
}


def stepper(model, batch):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step():
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def ab(name: str, config: BertConfig, batch: dict, steps: int) -> tuple[float, float]:
    """Median ms per step of (petl-nas, PEFT), steps alternating after two warm-up steps each."""
    ours = stepper(step_time.petl_row(name)(config).train(), batch)
    theirs = stepper(step_time.peft_row(step_time.peft_configs()[name])(config).train(), batch)
    times: tuple[list, list] = ([], [])
    for s in (ours, theirs, ours, theirs):
        s()
    for _ in range(steps):
        for out, s in zip(times, (ours, theirs)):
            t = time.perf_counter()
            s()
            out.append(time.perf_counter() - t)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", required=True, help="comma-separated presets with a PEFT row in step_time.py")
    ap.add_argument("--size", choices=sorted(SIZES), default="minilm")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    config = BertConfig(num_labels=2, **SIZES[args.size])
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=g),
        "labels": torch.randint(0, 2, (args.batch,), generator=g),
    }
    print(
        f"{step_time.machine()}\n{args.size} BERT {SIZES[args.size]}, batch {args.batch} x {args.seq}, "
        f"{args.threads} threads, median of {args.steps} alternating steps\n"
    )
    print("| method | petl-nas ms | PEFT ms | petl-nas / PEFT |\n|---|---:|---:|---:|")
    for name in args.only.split(","):
        ours, theirs = ab(name, config, batch, args.steps)
        print(f"| {name} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.3f} |", flush=True)


if __name__ == "__main__":
    main()
