"""`Recipe`: how a configuration is trained, as plain values. The loop trains by it; a study's
records and an export record are written from it without loading torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

__all__ = ["Recipe"]


@dataclass(frozen=True)
class Recipe:
    """How a configuration is trained (the search varies ``lr``; fidelity sets the rest).

    Attributes:
        lr: peak learning rate.
        epochs: passes over the training split (fractions allowed).
        batch_size / eval_batch_size: examples per optimiser step / per evaluation batch.
        warmup_ratio: share of steps with linear warm-up (then linear decay to 0).
        weight_decay, max_grad_norm: AdamW decay and the clipping norm.
        max_length: tokens per example (the source, for a sequence-to-sequence task).
        evals_per_epoch: evaluations (and reports) per epoch; 0: one evaluation, at the end (where
            nothing reads the others: a FIFO search scored by the last evaluation, the final runs).
        seed: model-side seed (initialisation of the PETL modules, shuffling, dropout).
        max_steps: stop after this many optimiser steps, if fewer than ``epochs`` make (None: no cap).
        eval_rows: score only the first rows of the scoring split (None: all; beam search is slow).
        length_buckets: 0 shuffles rows uniformly; N > 0 draws batches of similar lengths from pools
            of N batches' worth of shuffled rows (`EncodedSplit.bucketed_order`): less padding.
        frozen_cache_mb: 0 runs every layer every step; N > 0 runs the layers below the lowest
            trainable one without dropout and reuses their output, cached in memory up to N MiB
            per process (`frozen.FrozenReuse`; encoder classification and regression only).
        precision: what forward passes compute in (`precision.use_precision`): ``auto`` (bf16 on a
            GPU, full precision on a CPU), ``bf16`` (also on a CPU: about twice as fast where the
            CPU has native bf16), ``fp32``.
        compile: ``off`` (eager) or a ``torch.compile`` mode for the steps and evaluations (`compiling.compiled`:
            ``default``, ``reduce-overhead`` for CUDA graphs on a GPU, ``max-autotune``); not with
            ``frozen_cache_mb``, whose per-batch feeding would recompile.
        cuda_graphs: on a GPU, record each training step once per batch shape and replay it as a
            CUDA graph (`step_graphs.GraphedSteps`; batches padded to a multiple of 8 tokens);
            where it cannot apply (a CPU, ``compile``, ``frozen_cache_mb``, fp16 loss scaling, a
            regulariser) the steps run eagerly and `TrainResult.graphs` says why.
    """

    lr: float = 1e-3
    epochs: float = 3.0
    batch_size: int = 32
    eval_batch_size: int = 128
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_length: int = 128
    evals_per_epoch: int = 1
    seed: int = 0
    max_steps: int | None = None
    eval_rows: int | None = None
    length_buckets: int = 0
    frozen_cache_mb: int = 0
    precision: str = "auto"
    compile: str = "off"
    cuda_graphs: bool = False

    def with_overrides(self, **kw) -> Recipe:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    def to_dict(self) -> dict:
        return asdict(self)
