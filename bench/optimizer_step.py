"""AdamW's step on a PETL model's many small tensors: per-tensor loop, foreach, and fused.

Owns one measurement: ms per optimizer step (gradients given) for the trainable tensors of a
preset on a backbone config (default: UniPELT (APL) on all-MiniLM-L6-v2's shape, 6 layers, d=384),
each variant measured back to back in one process, median of 50 steps after 10 warm-up steps.
`petl_nas.training.loop.adamw` uses the fused step where torch has it.

    python bench/optimizer_step.py [--preset unipelt_apl] [--layers 6] [--hidden 384] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from transformers import BertConfig, BertForSequenceClassification

from petl_nas import apply_petl, preset


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="unipelt_apl")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = BertConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=12,
        intermediate_size=4 * args.hidden,
        num_labels=2,
    )
    torch.manual_seed(0)
    model = apply_petl(
        BertForSequenceClassification(config), dataclasses.replace(preset(args.preset, config), pooling="mean")
    )
    params = [p for p in model.parameters() if p.requires_grad]
    times = {}
    for name, kw in (("loop", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        opt = torch.optim.AdamW(params, lr=1e-4, **kw)
        ts = []
        for i in range(60):
            for p in params:
                p.grad = torch.randn_like(p)
            start = time.perf_counter()
            opt.step()
            if i >= 10:
                ts.append(1000 * (time.perf_counter() - start))
        times[name] = statistics.median(ts)
    print(
        f"{args.preset} on d={args.hidden}, {args.layers} layers: {len(params)} tensors, "
        f"{sum(p.numel() for p in params):,} parameters, {args.threads} thread(s)"
    )
    for name, ms in times.items():
        print(f"  {name:8s} {ms:7.2f} ms/step  ({times['loop'] / ms:.1f}x the loop)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
