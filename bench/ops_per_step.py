"""Operations per training step of every preset: a CPU stand-in for the GPU's kernel count.

Owns one measurement. On a GPU with the host out of the way (`fidelity.cuda_graphs`) a PETL
step costs what its kernels cost, and the gated and PHM presets launch 2-4× the frozen floor's
kernels, each with little work (`bench/results/step_time_gpu_h100_graphs.md`). Kernels are counted
on a GPU; the aten operations a step dispatches are countable anywhere, and nearly every one that
computes is a kernel there. This prints, per preset, the operations of one training step (forward,
loss, backward, clipping, fused AdamW, zero_grad) on a BERT of the base model's depth (12 layers)
and a small width (operation counts do not depend on width), split into the ones that compute and
the views and metadata changes that launch nothing (``view``, ``t``, ``transpose``, ...), with the
commonest computing operations. The floor trains the head with gradients flowing to the
embeddings, as in `step_time.py`.

    python bench/ops_per_step.py [--only unipelt_apl,compacter] [--out bench/results/ops_per_step.md]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses

import torch
from preset_trials import emit
from step_time import backbone, frozen_floor
from transformers import BertConfig

from petl_nas import apply_petl, preset, preset_names
from petl_nas.training.loop import adamw
from petl_nas.training.operations import Operations

# operations that only re-describe memory: no kernel on a GPU
VIEWS = {
    "view",
    "_unsafe_view",
    "t",
    "transpose",
    "permute",
    "expand",
    "unsqueeze",
    "squeeze",
    "slice",
    "select",
    "detach",
    "alias",
    "as_strided",
    "split",
    "split_with_sizes",
    "unbind",
    "reshape",
    "_reshape_alias",
    "lift_fresh",
}


def ops_of(model: torch.nn.Module, vocab: int) -> collections.Counter:
    """The operations of one training step after a first (the optimiser's state exists)."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = adamw(params, 1e-3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 10:] = 0
    labels = torch.tensor([0, 1, 0, 1])

    def step():
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with Operations() as count:
        step()
    return count.ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated presets (the floor always runs)")
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    config = BertConfig(
        hidden_size=64, num_hidden_layers=12, num_attention_heads=4, intermediate_size=128, num_labels=2
    )
    names = args.only.split(",") if args.only else preset_names()
    rows = [("frozen floor", ops_of(frozen_floor(config), config.vocab_size))]
    for name in names:
        model = apply_petl(backbone(config), dataclasses.replace(preset(name, config), pooling="mean"))
        rows.append((name, ops_of(model, config.vocab_size)))
    base = sum(n for op, n in rows[0][1].items() if op not in VIEWS)
    lines = [
        "| method | operations per step | computing | × floor (computing) | commonest computing operations |",
        "|---|---:|---:|---:|---|",
    ]
    for name, ops in rows:
        computing = collections.Counter({op: n for op, n in ops.items() if op not in VIEWS})
        common = ", ".join(f"{op} {n}" for op, n in computing.most_common(6))
        lines.append(
            f"| {name} | {sum(ops.values()):,} | {sum(computing.values()):,} | "
            f"{sum(computing.values()) / base:.2f} | {common} |"
        )
    emit("# Operations per training step (12 layers, batch 4 × 16, CPU)\n\n" + "\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
