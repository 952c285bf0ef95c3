"""Training step time of every petl-nas preset against the frozen-backbone floor and HF PEFT.

Owns one measurement: ms per training step (forward + cross-entropy loss + backward + AdamW step
+ zero_grad) for each method, all in one process, back to back, reported as a ratio to the floor
(only the head trainable, gradients still flowing down to the embeddings). The protocol matches
the anchors' "Speed" section in shared/research/anchor-results.md: a randomly initialised
BERT-base-sized BertForSequenceClassification, batch 8 x 128 random token ids, fp32, 2 threads,
median of 20 timed steps after 5 warm-up steps (``--batch`` and ``--steps`` change them: the GPU
figures of issue 17 are batch 32 x 128, median of 50 after 10). Every row builds a fresh model from the same seed
and makes the word-embedding output require grad, so every method backpropagates the whole stack.
PEFT rows use the same sizes as the petl-nas preset they sit under (lora, lora_ffn, prefix,
prompt_tuning, ia3, ia3_kv, ln_tuning, vera, fourierft, dora, lokr); ``--minilm`` measures at the suite's backbone size. When CUDA is available the table is repeated on the GPU under bf16 autocast
(``--device`` picks one). On a GPU, wall time per step is bound by the host (Python and kernel
launches) and drifts between runs, so each GPU row also profiles one step: the CUDA kernels it
launches and the time the GPU spent in them, the steadier figure.

Run (the full table takes ~20 minutes on 2 cores; --tiny is a smoke run of a few seconds):

    HF_HUB_OFFLINE=1 python bench/step_time.py [--steps 20] [--warmup 5] [--only lora,prefix]
                                               [--tiny] [--out results.md]
    python bench/step_time.py --device cuda --batch 32 --steps 50 --warmup 10   # the GPU table
    python bench/step_time.py --device cuda --batch 32 --steps 50 --warmup 10 --compile reduce-overhead

``--compile MODE`` compiles every row's model as ``fidelity.compile`` compiles a trial's, and adds
the first step after compiling (compile time included) to the table. ``--graphs`` (a GPU) also
times every row's step replayed as a CUDA graph (`petl_nas.training.step_graphs`, as ``fidelity.cuda_graphs``
runs a trial's), on the same model right after its eager steps, with the time its first recording
took; the graphed ratios are to the graphed floor of the same run.

    python bench/step_time.py --device cuda --batch 32 --steps 50 --warmup 10 --graphs

``--only`` selects methods by name (a preset name also selects its PEFT row); the floor always runs.
Each row also counts one step's FLOPs (matmuls and attention, forward and backward): "FLOPs ×
floor" is the lowest ratio the method's arithmetic allows, so the gap to "× floor" is overhead.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

from petl_nas import apply_petl, preset, preset_names
from petl_nas.training.compiling import COMPILE_MODES, fresh_compiled
from petl_nas.training.loop import adamw
from petl_nas.training.step_graphs import WARMUP, GraphedSteps, prepare_optimizer

SEED = 0
SEQ_LEN = 128
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
MINILM = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)


@dataclass
class Row:
    method: str
    library: str
    trainable: int | None = None
    ms: float | None = None
    flops: float | None = None
    kernels: int | None = None  # CUDA kernels launched by one step
    gpu_ms: float | None = None  # time the GPU spent in them
    first_s: float | None = None  # the first step after compiling: compile time included
    graph_ms: float | None = None  # the step replayed as a CUDA graph (--graphs)
    graph_gpu_ms: float | None = None
    record_s: float | None = None  # the first graphed step: recording included
    graph_error: str | None = None
    error: str | None = None
    by_kind: dict | None = None  # kernel family -> [count, GPU µs], eager step (`profile_step`)
    by_name: dict | None = None
    graph_kernels: int | None = None  # the same, of one replayed graph
    graph_by_kind: dict | None = None
    graph_by_name: dict | None = None


# --- models -------------------------------------------------------------------------------------


def backbone(config: BertConfig) -> nn.Module:
    """A fresh randomly initialised model, identical for every row."""
    torch.manual_seed(SEED)
    model = BertForSequenceClassification(config)
    # Backward then runs through the whole (frozen) network, whatever is trainable: the word
    # embeddings' output plus a zero that requires grad (a buffer: not trained, not counted). Not
    # ``requires_grad_()`` on the output, which torch.compile cannot trace without a graph break.
    model.register_buffer("grad_anchor", torch.zeros((), requires_grad=True), persistent=False)
    model.get_input_embeddings().register_forward_hook(lambda module, args, out: out + model.grad_anchor)
    return model


def frozen_floor(config):
    model = backbone(config)
    frozen = {id(p) for p in model.base_model.parameters()}  # everything but the classifier
    for p in model.parameters():
        p.requires_grad_(id(p) not in frozen)
    return model


def full_finetuning(config):
    return backbone(config)


def petl_row(name: str) -> Callable:
    def build(config):
        model = backbone(config)
        return apply_petl(model, preset(name, config))

    return build


def peft_row(make_config: Callable) -> Callable:
    def build(config):
        from peft import get_peft_model

        return get_peft_model(backbone(config), make_config())

    return build


def peft_configs() -> dict[str, Callable]:
    """PEFT configs at the sizes of the petl-nas preset each is compared with."""
    from peft import (
        FourierFTConfig,
        IA3Config,
        LNTuningConfig,
        LoKrConfig,
        LoraConfig,
        PrefixTuningConfig,
        PromptTuningConfig,
        TaskType,
        VeraConfig,
    )

    cls = TaskType.SEQ_CLS
    return {
        "lora": lambda: LoraConfig(
            task_type=cls, r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["query", "value"]
        ),
        # FFN W1 and W2 only: the regex skips attention.output.dense.
        "lora_ffn": lambda: LoraConfig(
            task_type=cls,
            r=8,
            lora_alpha=16,
            lora_dropout=0.0,
            target_modules=r".*\.\d+\.output\.dense|.*intermediate\.dense",
        ),
        "prefix": lambda: PrefixTuningConfig(
            task_type=cls, num_virtual_tokens=30, prefix_projection=True, encoder_hidden_size=800
        ),
        "prompt_tuning": lambda: PromptTuningConfig(task_type=cls, num_virtual_tokens=20),
        # k, v and W2's input; "output.dense" alone would also match attention.output.dense.
        "ia3": lambda: IA3Config(
            task_type=cls,
            target_modules=r".*\.(key|value)|.*\.\d+\.output\.dense",
            feedforward_modules=r".*\.\d+\.output\.dense",
        ),
        "ia3_kv": lambda: IA3Config(task_type=cls, target_modules=["key", "value"], feedforward_modules=[]),
        "ln_tuning": lambda: LNTuningConfig(task_type=cls, target_modules=r".*\.\d+\.(attention\.)?output\.LayerNorm"),
        "dora": lambda: LoraConfig(
            task_type=cls, r=8, lora_alpha=16, lora_dropout=0.0, use_dora=True, target_modules=["query", "value"]
        ),
        "lokr": lambda: LoKrConfig(task_type=cls, r=8, alpha=8, target_modules=["query", "value"]),
        "vera": lambda: VeraConfig(task_type=cls, r=1024, target_modules=["query", "value"], projection_prng_key=0),
        "fourierft": lambda: FourierFTConfig(
            task_type=cls, n_frequency=1000, scaling=140.0, random_loc_seed=0, target_modules=["query", "value"]
        ),
    }


def methods() -> list[tuple[str, str, Callable]]:
    """(method, library, builder), each PEFT row right after the preset it matches."""
    rows = [("frozen floor", "-", frozen_floor), ("full fine-tuning", "-", full_finetuning)]
    try:
        theirs = peft_configs()
    except ImportError as e:
        theirs = {}
        print(f"peft unavailable, PEFT rows skipped: {e}")
    for name in preset_names():
        rows.append((name, "petl-nas", petl_row(name)))
        if name in theirs:
            rows.append((name, "peft", peft_row(theirs[name])))
    return rows


# --- timing -------------------------------------------------------------------------------------


def _count_cpu_attention() -> None:
    """Teach the FLOP counter SDPA's CPU kernels (it knows only the CUDA ones), with its own formulas."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    if not hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return

    @fc.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
    def _forward(query, key, value, *args, out_shape=None, **kwargs):
        return fc.sdpa_flop_count(query, key, value)

    @fc.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
    def _backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return fc.sdpa_backward_flop_count(grad_out, query, key, value)


_count_cpu_attention()


def step_inputs(device: str, vocab: int, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The seeded random batch every row steps on: (input ids, attention mask, labels)."""
    gen = torch.Generator().manual_seed(SEED)
    input_ids = torch.randint(0, vocab, (batch, SEQ_LEN), generator=gen).to(device)
    labels = torch.randint(0, 2, (batch,), generator=gen).to(device)
    return input_ids, torch.ones_like(input_ids), labels


def training_step(net: nn.Module, opt: torch.optim.Optimizer, inputs: tuple, cuda: bool) -> Callable[[], None]:
    """One measured step of ``net`` (a model, or the same model compiled): forward under bf16
    autocast on a GPU, cross-entropy, backward, ``opt``'s step, zero_grad."""
    input_ids, mask, labels = inputs
    # No autocast context at all on a CPU: a disabled CUDA one costs a compiled step ~30x there.
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    def step():
        with autocast:
            logits = net(input_ids=input_ids, attention_mask=mask).logits
            loss = nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def graphed_step(model: nn.Module, opt: torch.optim.Optimizer, inputs: tuple) -> Callable[[], None]:
    """`training_step` recorded and replayed by `step_graphs.GraphedSteps` (a GPU): each call copies
    the batch in from the host, as a trial's steps do."""
    device = inputs[0].device
    prepare_optimizer(opt, device, graphed=True)
    host = {"input_ids": inputs[0].cpu(), "attention_mask": inputs[1].cpu(), "labels": inputs[2].cpu()}

    def one(batch):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            loss = nn.functional.cross_entropy(logits.float(), batch["labels"])
        loss.backward()
        opt.step()
        return loss

    runner = GraphedSteps(one, [p for p in model.parameters() if p.requires_grad], device)

    def step():
        runner(host)
        if runner.info.why_not is not None:
            raise RuntimeError(f"not graphed: {runner.info.why_not}")

    return step


def timed_ms(step: Callable[[], None], cuda: bool) -> float:
    """One call of ``step`` in milliseconds, the GPU's queue drained before and after."""
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start)


def time_steps(
    model: nn.Module,
    device: str,
    steps: int,
    warmup: int,
    vocab: int,
    batch: int,
    compile_mode: str = "off",
    graphs: bool = False,
) -> dict:
    """Median ms of ``steps`` training steps after ``warmup`` untimed ones (``ms``), the FLOPs of one
    step (``flops``) and, on CUDA, one profiled step's kernel count and GPU time (`profile_step`).

    FLOPs are counted by `torch.utils.flop_counter.FlopCounterMode` over the matmuls and attention
    of one step, forward and backward: the arithmetic a method cannot avoid, so "FLOPs × floor" is
    the lowest step-time ratio it could reach on a compute-bound device. With ``compile_mode`` the
    model is compiled after the FLOPs are counted, from an empty cache as a trial is
    (`compiling.fresh_compiled`); the first step after it (``first_s``, compile time included) is
    not timed.
    """
    from torch.utils.flop_counter import FlopCounterMode

    model.to(device).train()
    # The anchor again, as a leaf on the device: moved with the model it is a copy of the CPU leaf,
    # and every backward would send its gradient to the host (a wait, which no graph can record)
    for module in model.modules():
        if "grad_anchor" in module._buffers:  # under a PEFT wrapper too
            module.grad_anchor = torch.zeros((), device=device, requires_grad=True)
    inputs = step_inputs(device, vocab, batch)
    opt = adamw([p for p in model.parameters() if p.requires_grad], 1e-4)  # the optimizer trials use
    cuda = device == "cuda"
    step = training_step(model, opt, inputs, cuda)

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    flops = float(counter.get_total_flops())
    out = {"flops": flops}
    if compile_mode != "off":
        step = training_step(fresh_compiled(model, compile_mode), opt, inputs, cuda)
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        out["first_s"] = time.perf_counter() - start
    times = [timed_ms(step, cuda) for _ in range(warmup + steps)][warmup:]
    out["ms"] = statistics.median(times)
    if cuda:
        try:
            out.update(profile_step(step))
        except Exception as e:  # the timing stands without the profile
            print(f"    (profile failed: {type(e).__name__}: {str(e)[:100]})")
    if graphs:
        try:
            out.update(time_graphed(model, opt, inputs, steps, warmup))
        except Exception as e:  # the eager figures stand without the graphed ones
            out["graph_error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
            print(f"    (graphed step failed: {out['graph_error']})")
    return out


def time_graphed(model: nn.Module, opt, inputs: tuple, steps: int, warmup: int) -> dict:
    """The same model's step as a CUDA graph: median ms after ``warmup`` (at least `WARMUP` eager
    steps and the recording), the recording's own step, and one profiled replay."""
    step = graphed_step(model, opt, inputs)
    for _ in range(WARMUP):
        timed_ms(step, True)
    out = {"record_s": timed_ms(step, True) / 1000}
    times = [timed_ms(step, True) for _ in range(max(0, warmup - WARMUP - 1) + steps)][-steps:]
    out["graph_ms"] = statistics.median(times)
    try:
        profiled = profile_step(step)
        out.update(
            graph_gpu_ms=profiled["gpu_ms"],
            graph_kernels=profiled["kernels"],
            graph_by_kind=profiled["by_kind"],
            graph_by_name=profiled["by_name"],
        )
    except Exception as e:
        print(f"    (graph profile failed: {type(e).__name__}: {str(e)[:100]})")
    return out


# Kernel families by a word of the kernel's name, first match wins (cuBLAS/cuDNN/CUTLASS names vary by card)
KERNEL_KINDS = (
    ("attention", ("fmha", "flash", "attention", "sdpa", "cudnn")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "splitk")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("layer norm", ("layer_norm", "layernorm")),
    ("softmax", ("softmax",)),
    ("reduction", ("reduce",)),
    ("copy / fill", ("copy", "memcpy", "memset", "fill", "cat", "index", "scatter", "gather")),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, words in KERNEL_KINDS if any(w in low for w in words)), "other")


def profile_step(step: Callable[[], None]) -> dict:
    """One step under `torch.profiler`: how many CUDA kernels it launched, the GPU time in them, and
    both by kernel family (`kernel_kind`) and by kernel name (``by_kind``, ``by_name``: name ->
    [count, GPU µs])."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_kind, by_name = {}, {}
    for e in kernels:
        for table, key in ((by_kind, kernel_kind(e.name)), (by_name, e.name)):
            entry = table.setdefault(key, [0, 0.0])
            entry[0] += 1
            entry[1] += e.device_time
    return {
        "kernels": len(kernels),
        "gpu_ms": sum(e.device_time for e in kernels) / 1000,
        "by_kind": by_kind,
        "by_name": by_name,
    }


def run_table(config, device, steps, warmup, only, batch, compile_mode="off", graphs=False) -> list[Row]:
    rows = []
    for method, library, build in methods():
        if only and method != "frozen floor" and method not in only:
            continue
        row = Row(method, library)
        try:
            model = build(config)
            row.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            for key, value in time_steps(
                model, device, steps, warmup, config.vocab_size, batch, compile_mode, graphs and device == "cuda"
            ).items():
                setattr(row, key, value)
        except Exception as e:  # a failing method is reported in the table, not fatal
            row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        finally:
            model = None
            if device == "cuda":
                torch.cuda.empty_cache()
        gpu = f"  {row.kernels:5d} kernels, GPU {row.gpu_ms:6.1f} ms" if row.kernels is not None else ""
        gpu += f"  (first step {row.first_s:.1f} s)" if row.first_s is not None else ""
        gpu += (
            f"  | graphed {row.graph_ms:6.1f} ms, GPU {row.graph_gpu_ms or 0:6.1f} ms, recorded in {row.record_s:.2f} s"
            if row.graph_ms is not None
            else ""
        )
        print(
            f"  {method:<18} {library:<9} " + (f"{row.ms:9.1f} ms{gpu}" if row.ms else f"FAILED {row.error}"),
            flush=True,
        )
        rows.append(row)
    return rows


# --- report -------------------------------------------------------------------------------------


def machine() -> str:
    return (
        f"{datetime.datetime.now().isoformat(timespec='seconds')} | torch {torch.__version__} | "
        f"threads {torch.get_num_threads()} | CPUs {os.cpu_count()} | {platform.processor() or platform.machine()}"
    )


def markdown(rows: list[Row], title: str) -> str:
    base = next((r for r in rows if r.method == "frozen floor" and r.ms), None)
    profiled = any(r.kernels is not None for r in rows)
    compiled = any(r.first_s is not None for r in rows)
    extra = " | CUDA kernels per step | GPU ms per step | GPU time × floor" if profiled else ""
    extra += " | first step, s (compiling)" if compiled else ""
    lines = [
        f"### {title}",
        "",
        f"| method | library | trainable params (PETL + head) | ms/step (median) | × floor | FLOPs × floor{extra} |",
        "|---|---|---:|---:|---:|---:" + ("|---:|---:|---:" if profiled else "") + ("|---:" if compiled else "") + "|",
    ]
    for r in rows:
        params = f"{r.trainable:,}" if r.trainable is not None else "-"
        if r.ms is None:
            lines.append(
                f"| {r.method} | {r.library} | {params} | failed: {r.error} | - | -"
                + (" | - | - | -" if profiled else "")
                + (" | -" if compiled else "")
                + " |"
            )
            continue
        ratio = f"{r.ms / base.ms:.2f}" if base else "-"
        flops = f"{r.flops / base.flops:.3f}" if base and base.flops and r.flops else "-"
        cells = [r.method, r.library, params, f"{r.ms:.1f}", ratio, flops]
        if profiled:
            gpu_ratio = f"{r.gpu_ms / base.gpu_ms:.2f}" if base and base.gpu_ms and r.gpu_ms else "-"
            cells += [
                f"{r.kernels:,}" if r.kernels is not None else "-",
                f"{r.gpu_ms:.2f}" if r.gpu_ms is not None else "-",
                gpu_ratio,
            ]
        if compiled:
            cells.append(f"{r.first_s:.1f}" if r.first_s is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def graphs_markdown(rows: list[Row], title: str) -> str:
    """Eager against graphed, each ratio to the floor measured the same way in the same run."""
    base = next((r for r in rows if r.method == "frozen floor" and r.graph_ms), None)
    lines = [
        f"### {title}, eager against CUDA graphs (`step_graphs.GraphedSteps`)",
        "",
        "| method | library | eager ms/step | × eager floor | graphed ms/step | × graphed floor | graphed / eager "
        "| graphed GPU ms | GPU time × graphed floor | first graphed step (recording), s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.graph_ms is None or base is None:
            lines.append(
                f"| {r.method} | {r.library} | "
                + (f"{r.ms:.1f}" if r.ms else "-")
                + f" | - | failed: {r.graph_error or r.error or 'not graphed'} | - | - | - | - | - |"
            )
            continue
        gpu = f"{r.graph_gpu_ms:.2f}" if r.graph_gpu_ms else "-"
        gpu_ratio = f"{r.graph_gpu_ms / base.graph_gpu_ms:.2f}" if r.graph_gpu_ms and base.graph_gpu_ms else "-"
        lines.append(
            f"| {r.method} | {r.library} | {r.ms:.1f} | {r.ms / base.ms:.2f} | {r.graph_ms:.1f} | "
            f"{r.graph_ms / base.graph_ms:.2f} | {r.graph_ms / r.ms:.2f} | {gpu} | {gpu_ratio} | {r.record_s:.2f} |"
        )
    return "\n".join(lines)


def kernels_markdown(rows: list[Row], top: int = 8) -> str:
    """Where each row's GPU time goes beyond the floor's: kernels and GPU µs per kernel family, and
    the kernel names that add the most time. From the replayed graph where there is one (the
    host's share gone), else from the eager step."""

    def breakdown(r, how=None):
        how = how or ("graphed" if r.graph_by_kind else "eager")
        return (r.graph_by_kind, r.graph_by_name, how) if how == "graphed" else (r.by_kind, r.by_name, how)

    rows = [r for r in rows if breakdown(r)[0]]
    base = next((r for r in rows if r.method == "frozen floor"), None)
    if base is None:
        return "### Kernels\n\nno profiled floor"
    kinds = [k for k, _ in KERNEL_KINDS] + ["other"]
    lines = [
        "### GPU time per step by kernel family, beyond the floor (kernels / µs)",
        "",
        "| method | library | step | " + " | ".join(kinds) + " |",
        "|---|---|---|" + "---:|" * len(kinds),
    ]
    for r in rows:
        by_kind, _, how = breakdown(r)
        base_kind = breakdown(base, how)[0] or {}
        cells = []
        for k in kinds:
            n, us = by_kind.get(k, (0, 0.0))
            if r is not base:
                n, us = n - base_kind.get(k, (0, 0.0))[0], us - base_kind.get(k, (0, 0.0))[1]
            cells.append(f"{n:+d} / {us:+,.0f}" if r is not base else f"{n} / {us:,.0f}")
        lines.append(f"| {r.method} | {r.library} | {how} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The floor's row is its own count and time (its graphed step); every other row is its difference "
        "from the floor's step of the same kind.",
        "",
    ]
    for r in rows:
        if r is base:
            continue
        _, by_name, how = breakdown(r)
        base_name = breakdown(base, how)[1] or {}
        extra = sorted(
            (
                (us - base_name.get(name, (0, 0.0))[1], n - base_name.get(name, (0, 0.0))[0], name)
                for name, (n, us) in by_name.items()
            ),
            reverse=True,
        )[:top]
        lines += [
            f"#### {r.method} ({r.library}, {how}): the kernels adding the most GPU time",
            "",
            "| + µs | + kernels | kernel |",
            "|---:|---:|---|",
        ]
        lines += [f"| {us:+,.0f} | {n:+d} | `{name[:140]}` |" for us, n, name in extra]
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="timed steps (default 20, --tiny 5)")
    ap.add_argument("--warmup", type=int, help="warm-up steps (default 5, --tiny 2)")
    ap.add_argument("--tiny", action="store_true", help="small BERT for a quick smoke run")
    ap.add_argument("--minilm", action="store_true", help="MiniLM-L6 size (d=384, 6 layers), the suite's backbone")
    ap.add_argument("--only", help="comma-separated method names (the floor always runs)")
    ap.add_argument("--out", help="also write the markdown tables to this path")
    ap.add_argument("--batch", type=int, default=8, help="rows per step (default 8; 32 for the GPU table)")
    ap.add_argument(
        "--compile",
        default="off",
        choices=COMPILE_MODES,
        help="torch.compile every row's model in this mode (as fidelity.compile does a trial's)",
    )
    ap.add_argument(
        "--graphs",
        action="store_true",
        help="on a GPU, also time every row's step replayed as a CUDA graph (fidelity.cuda_graphs)",
    )
    ap.add_argument(
        "--kernels",
        help="on a GPU, also write where each row's GPU time goes (kernel families "
        "and names beyond the floor's) to this path",
    )
    ap.add_argument(
        "--device",
        choices=["all", "cpu", "cuda"],
        default="all",
        help="all: the CPU table, then the GPU table when CUDA is available",
    )
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is visible to torch")
    steps = args.steps or (5 if args.tiny else 20)
    warmup = args.warmup if args.warmup is not None else (2 if args.tiny else 5)
    only = set(args.only.split(",")) if args.only else None
    config = BertConfig(num_labels=2, **(TINY if args.tiny else MINILM if args.minilm else {}))

    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # raised inside PEFT
    size = (
        "tiny BERT (d=64, 2 layers)"
        if args.tiny
        else "MiniLM-L6 size (d=384, 6 layers)"
        if args.minilm
        else "BERT-base size (d=768, 12 layers)"
    )
    header = (
        f"# Training step time\n\n{machine()}\n\n{size}, random init, batch {args.batch} x {SEQ_LEN} tokens, "
        f"median of {steps} steps after {warmup} warm-up; one step = forward + CE loss + backward "
        f"+ AdamW + zero_grad; embedding output requires grad in every row."
    )
    if args.compile != "off":
        header += f" Every model compiled (torch.compile, mode {args.compile}) after its FLOPs are counted."
    print(header, flush=True)
    tables = []
    devices = [("cpu", "CPU, fp32, 2 threads")] if args.device in ("all", "cpu") else []
    if args.device in ("all", "cuda") and torch.cuda.is_available():
        devices.append(("cuda", f"GPU ({torch.cuda.get_device_name()}), bf16 autocast"))
    for device, title in devices:
        print(f"\n{title}:", flush=True)
        rows = run_table(config, device, steps, warmup, only, args.batch, args.compile, args.graphs)
        tables.append(markdown(rows, title + ("" if args.compile == "off" else f", compiled ({args.compile})")))
        if args.graphs and device == "cuda":
            tables.append(graphs_markdown(rows, title))
        if args.kernels and device == "cuda":
            with open(args.kernels, "w") as f:
                f.write(
                    f"# Kernels per training step\n\n{machine()}\n\n{title}, batch {args.batch} x {SEQ_LEN}\n\n"
                    + kernels_markdown(rows)
                    + "\n"
                )
    report = header + "\n\n" + "\n\n".join(tables) + "\n"
    print("\n" + "\n\n".join(tables))
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
