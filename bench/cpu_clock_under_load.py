"""Does a CPU trial's step time survive what else the machine runs? Wall time against CPU time.

A trial's ``train_step_ms`` (the ``step_time`` objective) and ``latency_ms`` are timed beside
whatever else runs: other trials, a user's editor, a test suite. On 2 cores a study's times were
20-60% above quiet ones, and a user walk saw one structure at 923 ms against 257 ms. This script
measures, in one process and one run, a training step and a deployed forward pass of two
configurations (LoRA and Houlsby on a MiniLM-sized BERT, random init, 1 thread, batch 32 x 64) with
0, 1, 2 and 3 competing processes (each a one-thread loop of 512 x 512 matmuls), and prints per
condition the mean wall ms and the mean CPU ms of this process (``time.process_time``), each as
a ratio to the quiet run, and the Houlsby/LoRA ratio under each clock.

    python bench/cpu_clock_under_load.py [--steps 30] [--loads 0,1,2,3] [--out results.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import multiprocessing as mp
import platform
import statistics
import time

import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

from petl_nas import apply_petl, preset
from petl_nas.training.loop import adamw

MINILM = BertConfig(
    hidden_size=384,
    num_hidden_layers=6,
    num_attention_heads=12,
    intermediate_size=1536,
    vocab_size=30522,
    max_position_embeddings=512,
    num_labels=2,
)
BATCH, LENGTH, CONFIGS = 32, 64, ("lora", "houlsby")


def _busy(stop) -> None:
    """A competing process: one thread of matmuls until told to stop."""
    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    config = dataclasses.replace(preset(name, MINILM), pooling="mean")  # a random pooler: no warning
    return apply_petl(BertForSequenceClassification(MINILM), config)


def _measure(fn, repeats: int, warm_ups: int = 3) -> tuple[float, float]:
    """Mean wall ms and mean CPU ms of this process over ``repeats`` calls of ``fn``."""
    for _ in range(warm_ups):
        fn()
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(1000 * (time.perf_counter() - w))
        cpus.append(1000 * (time.process_time() - c))
    return statistics.mean(walls), statistics.mean(cpus)


def _step_and_forward(name: str):
    model = _model(name)
    opt = adamw([{"params": [p for p in model.parameters() if p.requires_grad]}], lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, MINILM.vocab_size, (BATCH, LENGTH), generator=gen)
    labels = torch.randint(0, 2, (BATCH,), generator=gen)

    def step():
        model.train()
        loss = nn.functional.cross_entropy(model(input_ids=ids).logits, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def forward():
        model.eval()
        with torch.no_grad():
            model(input_ids=ids[:8])

    return step, forward


def run(steps: int, loads: list[int]) -> list[dict]:
    torch.set_num_threads(1)
    work = {name: _step_and_forward(name) for name in CONFIGS}
    rows = []
    ctx = mp.get_context("spawn")
    for load in loads:
        stop = ctx.Event()
        others = [ctx.Process(target=_busy, args=(stop,), daemon=True) for _ in range(load)]
        for p in others:
            p.start()
        time.sleep(2.0 if load else 0.0)  # let them start their loops
        try:
            for name in CONFIGS:
                step, forward = work[name]
                rows.append({"load": load, "config": name, "what": "training step", **_pair(_measure(step, steps))})
                rows.append(
                    {"load": load, "config": name, "what": "forward (8 rows)", **_pair(_measure(forward, 3 * steps))}
                )
        finally:
            stop.set()
            for p in others:
                p.join(10)
    return rows


def _pair(wall_cpu: tuple[float, float]) -> dict:
    return {"wall": wall_cpu[0], "cpu": wall_cpu[1]}


def markdown(rows: list[dict], steps: int) -> str:
    quiet = {(r["config"], r["what"]): r for r in rows if r["load"] == 0}
    lines = [
        f"# Wall time against CPU time under load ({datetime.date.today()})",
        "",
        f"{platform.processor() or platform.machine()}, {mp.cpu_count()} CPUs, torch {torch.__version__}, "
        f"1 thread; MiniLM-sized BERT (random init), batch {BATCH} x {LENGTH}; training step: mean of {steps} "
        f"after 3 warm-up; forward: 8 rows, mean of {3 * steps}. Competing processes: one-thread matmul loops.",
        "",
        "| competing processes | configuration | what | wall ms | wall × quiet | CPU ms | CPU × quiet |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        q = quiet.get((r["config"], r["what"]), r)
        lines.append(
            f"| {r['load']} | {r['config']} | {r['what']} | {r['wall']:.1f} | {r['wall'] / q['wall']:.2f} | "
            f"{r['cpu']:.1f} | {r['cpu'] / q['cpu']:.2f} |"
        )
    lines += ["", "| competing processes | what | houlsby / lora, wall | houlsby / lora, CPU |", "|---:|---|---:|---:|"]
    by = {(r["load"], r["config"], r["what"]): r for r in rows}
    for load in sorted({r["load"] for r in rows}):
        for what in ("training step", "forward (8 rows)"):
            h, lo = by[(load, "houlsby", what)], by[(load, "lora", what)]
            lines.append(f"| {load} | {what} | {h['wall'] / lo['wall']:.2f} | {h['cpu'] / lo['cpu']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--loads", default="0,1,2,3", help="competing processes per condition, comma-separated")
    parser.add_argument("--out", help="also write the tables to this file")
    args = parser.parse_args(argv)
    loads = [int(x) for x in args.loads.split(",")]
    text = markdown(run(args.steps, loads), args.steps)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
