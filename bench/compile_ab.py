"""Eager against compiled training steps, interleaved in one process (`fidelity.compile`).

Owns one measurement: for each method, an eager and a compiled model (``torch.compile``, one mode)
are built once and then stepped in rounds, every (method, mode) a few steps per round in turn,
so that all of them see the same machine (2 shared CPU cores drift by ±5% between runs, and a
comparison of two separate runs cannot tell a compiled floor from a slower minute). Reported: the
median and minimum ms per step of each, × the eager floor and × the floor of its own mode. The
model, batch and step are `step_time.py`'s (BERT-base size, random init, batch 8 × 128, fp32 on a
CPU, bf16 autocast on a GPU). The models share one process, so each is compiled with
`compiling.compiled` (hook guards keep their graphs apart), not from an empty cache.

    HF_HUB_OFFLINE=1 python bench/compile_ab.py [--methods unipelt_apl,mam] [--rounds 5] [--mode default]
        [--out bench/results/compile_ab_cpu.md]
"""

from __future__ import annotations

import argparse
import datetime
import statistics

import torch
from preset_trials import emit
from step_time import TINY, frozen_floor, machine, petl_row, step_inputs, timed_ms, training_step
from torch import nn
from transformers import BertConfig

from petl_nas.training.compiling import COMPILE_MODES, compiled
from petl_nas.training.loop import adamw


def stepper(model: nn.Module, mode: str, device: str, batch: int, vocab: int):
    """A timed training step of ``model`` compiled in ``mode`` (`step_time.training_step`): ms."""
    model.to(device).train()
    opt = adamw([p for p in model.parameters() if p.requires_grad], 1e-4)
    cuda = device == "cuda"
    step = training_step(compiled(model, mode), opt, step_inputs(device, vocab, batch), cuda)
    return lambda: timed_ms(step, cuda)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="unipelt_apl,unipelt_ap,compacter,mam,lora", help="presets beside the floor")
    ap.add_argument("--mode", default="default", choices=[m for m in COMPILE_MODES if m != "off"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps of each (method, mode) per round")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small BERT for a quick smoke run")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    config = BertConfig(num_labels=2, **(TINY if args.tiny else {}))
    builders = {"frozen floor": frozen_floor, **{m: petl_row(m) for m in args.methods.split(",")}}
    steps, first = {}, {}
    for name, build in builders.items():
        for mode in ("off", args.mode):
            step = stepper(build(config), mode, args.device, args.batch, config.vocab_size)
            first[(name, mode)] = step() / 1000  # compiling, for the compiled one
            step()
            steps[(name, mode)] = (step, [])
            print(f"  {name:<14} {mode:<16} first step {first[(name, mode)]:.1f} s", flush=True)
    for r in range(args.rounds):
        for step, times in steps.values():
            times += [step() for _ in range(args.steps)]
        print(f"  round {r + 1}/{args.rounds} done", flush=True)

    med = {k: statistics.median(v) for k, (_, v) in steps.items()}
    low = {k: min(v) for k, (_, v) in steps.items()}
    floor = {mode: med[("frozen floor", mode)] for mode in ("off", args.mode)}
    floor_low = {mode: low[("frozen floor", mode)] for mode in ("off", args.mode)}
    lines = [
        f"# Eager against compiled ({args.mode}) training steps, interleaved",
        "",
        f"{datetime.date.today()} | {machine()} | device {args.device}",
        "",
        f"{'tiny BERT' if args.tiny else 'BERT-base size'}, random init, batch {args.batch} x 128; "
        f"{args.rounds} rounds of {args.steps} steps per (method, mode), after 2 untimed steps.",
        "",
        "| method | mode | ms/step (median) | ms/step (min) | × eager floor (median) | × own mode's floor (median) "
        "| × own mode's floor (min) | first step, s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (name, mode), m in med.items():
        lines.append(
            f"| {name} | {mode} | {m:.0f} | {low[(name, mode)]:.0f} | {m / floor['off']:.3f} | "
            f"{m / floor[mode]:.3f} | {low[(name, mode)] / floor_low[mode]:.3f} | {first[(name, mode)]:.1f} |"
        )
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
