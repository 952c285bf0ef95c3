"""Trials per GPU sized from measured memory: `gpus_per_trial: auto`.

A MiniLM trial leaves an H100 almost idle: 8.7% busy and 1.2-1.4 GiB of 80 GiB in use, bound by
Python and kernel launches. Eight LoRA trainings started at once ran in the time of one
(about 740 trials per hour against 74-95; `../shared/research/gpu-h100.md`). How many trials fit
on a card depends on the backbone, the batch, the length and the configuration, so it is measured:

1. the first trial runs alone on a whole GPU and reports the allocator's reserved peak and the
   card's memory (`gpu_reserved_mb`, `gpu_total_mb`);
2. every later trial gets ``1/n`` of a GPU, where ``n`` copies of that peak, times `HEADROOM`
   (other configurations of the space hold more: prefixes, wider adapters) plus a CUDA context
   each and the frozen-layer cache's limit where there is one, fit in `USABLE` of the card; never
   more than the CPUs can drive, since each trial is a Python process bound by its kernel launches;
3. a trial that runs out of GPU memory halves ``n`` for the trials after it.

Without a GPU in the cluster, ``auto`` is 0 and nothing waits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HEADROOM = 1.5  # per-trial memory: the measured peak times this
CONTEXT_MB = 600  # a CUDA context per process, outside the allocator
USABLE = 0.9  # of the card's memory: the rest for fragmentation and the driver


def fits(peak_mb: float, total_mb: float, most: int, reserved_mb: float = 0.0) -> int:
    """How many trials with this measured peak share a card of ``total_mb`` (1 to ``most``);
    ``reserved_mb`` more per trial that the first one's peak may not show (a worker's frozen-layer
    cache, `fidelity.frozen_cache_mb`, which later trials in the same process fill)."""
    per_trial = peak_mb * HEADROOM + CONTEXT_MB + reserved_mb
    return max(1, min(most, math.floor(total_mb * USABLE / per_trial)))


def share(n: int) -> float:
    """1/n of a GPU as Ray accepts it: rounded down to 4 decimals, so n of them fit on one card."""
    return math.floor(10_000 / n) / 10_000


@dataclass
class GpuPacking:
    """The share of a GPU each new trial asks for, learned from the trials that finished.

    Attributes:
        most: the most trials per GPU (the cluster's CPU slots per GPU).
        reserved_mb: memory per trial beyond its measured peak (`fits`).
        per_gpu: trials per GPU now (1 until a trial has been measured).
        measured: whether a trial's memory has been seen.
    """

    most: int
    reserved_mb: float = 0.0
    per_gpu: int = 1
    measured: bool = False

    @property
    def fraction(self) -> float:
        return share(self.per_gpu)

    def must_wait(self, running: int) -> bool:
        """Hold the next trial: the first is still measuring what one trial needs."""
        return not self.measured and running > 0

    def observe(self, result: dict) -> str | None:
        """Size the packing from a trial that trained to the end; a line to print when it changes.
        A trial that reports no GPU memory (its process saw no CUDA device) leaves one per GPU."""
        if self.measured:
            return None
        self.measured = True
        peak, total = result.get("gpu_reserved_mb"), result.get("gpu_total_mb")
        if not peak or not total:
            return (
                "gpus_per_trial auto: the first trial reported no GPU memory (no CUDA device in its process); "
                "one trial per GPU"
            )
        self.per_gpu = fits(peak, total, self.most, self.reserved_mb)
        return (
            f"gpus_per_trial auto: a trial held {peak:,.0f} MB of {total:,.0f} MB; "
            f"{self.per_gpu} trial(s) per GPU from now on ({self.fraction:g} GPU each)"
        )

    def out_of_memory(self, share_of_trial: float | None = None) -> str | None:
        """A trial ran out of GPU memory: half as many per GPU from now on. A trial that was granted a
        smaller share than now ran under a packing already halved since (trials that filled the card
        together fail together): it halves nothing again."""
        self.measured = True  # nothing to wait for: the failure is the measurement
        if self.per_gpu == 1 or (share_of_trial is not None and share_of_trial < self.fraction):
            return None
        self.per_gpu = max(1, self.per_gpu // 2)
        return f"gpus_per_trial auto: a trial ran out of GPU memory; {self.per_gpu} trial(s) per GPU from now on"


__all__ = ["GpuPacking", "fits", "share", "HEADROOM", "CONTEXT_MB", "USABLE"]
