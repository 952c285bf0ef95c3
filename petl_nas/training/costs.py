"""What a configuration costs besides its parameters: training step time, the trial's peak memory,
and the inference latency of its deployed form. Every trial measures all three; an experiment's
``objectives`` (after ``score`` and ``params``) says which of them the study minimises too.

- ``step_time``: mean time of one training step (forward, backward, optimiser), in ms: wall time
  on a GPU, the process's CPU time on a CPU (what the step costs the cores, not what else the
  machine runs); evaluations left out, and each batch shape's first step where it pays a one-off
  cost (a CUDA graph's recording, a compilation: `step_clock`).
- ``memory``: the trial's peak memory in MB. On a GPU, the allocator's peak during training. On
  CPU, the peak resident memory of the process during training above what it held when the trial
  began (freed memory is first given back to the system, so a previous trial's peak does not hide
  this one's); a shared backbone, loaded once per worker, is not the trial's, nor what the process
  allocates once and keeps (`petl_nas.search.worker` warms a CPU worker up before its first trial).
- ``latency``: median time of one forward pass of a batch in the deployed form, in ms: LoRA
  updates without a gate merged into the weights they update (they then cost nothing), adapters,
  prefixes, prompts and gated LoRA as trained (they cannot be merged).

Measured times depend on the machine and on what else runs on it: compare them within a study.
torch is imported where it is used: the CLI checks experiment files (and runs `doctor`) without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import statistics
import time
from dataclasses import dataclass

# objective name -> (metric name in the study, the trial attribute that holds it)
COSTS = {
    "step_time": ("train_step_ms", "train_step_ms"),
    "memory": ("peak_memory_mb", "peak_mem_mb"),
    "latency": ("latency_ms", "latency_ms"),
}
UNITS = {"step_time": "ms", "memory": "MB", "latency": "ms"}
OBJECTIVES = ("score", "params", *COSTS)
LATENCY_BATCH = 8  # rows of search-dev in the latency batch
LATENCY_REPEATS = 10  # timed forward passes (after 2 warm-ups); the median is kept


def check_objectives(names) -> tuple[str, ...]:
    """The objectives as a tuple; ConfigError naming the first problem."""
    from ..errors import ConfigError

    if not isinstance(names, (list, tuple)) or list(names[:2]) != ["score", "params"]:
        raise ConfigError(f"objectives: expected [score, params] followed by any of {', '.join(COSTS)}, got {names!r}")
    from ..errors import suggest

    extra = list(names[2:])
    for name in extra:
        if not isinstance(name, str):
            raise ConfigError(f"objectives: {name!r} is not an objective's name; choose from {', '.join(COSTS)}")
        if name in ("score", "params"):
            raise ConfigError(
                f"objectives: {names!r} names {name} twice (it comes first, then any of {', '.join(COSTS)})"
            )
        if name not in COSTS:
            raise ConfigError(f"objectives: unknown objective {name!r}{suggest(name, COSTS)} (after score, params)")
    if len(set(extra)) != len(extra):
        raise ConfigError(f"objectives: {names!r} names one objective twice")
    return tuple(names)


def metric_names(objectives, metric: str) -> list[str]:
    """The study's metric names: the task's metric, deployable parameters, then each cost."""
    return [metric, "deployable_params", *(COSTS[o][0] for o in objectives[2:])]


def directions(objectives) -> list[str]:
    return ["maximize"] + ["minimize"] * (len(objectives) - 1)


def cost_values(objectives, info: dict) -> list[float]:
    """The measured costs a trial reports, in the order of ``objectives[2:]``."""
    return [float(info[COSTS[o][1]]) for o in objectives[2:]]


def _resident_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _give_back_freed_memory() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass
class MemoryProbe:
    """Peak memory of what runs between `start` and `peak_mb`, on ``device``."""

    device: "torch.device"  # noqa: F821
    _base_kb: int = 0
    _reset: bool = False

    def start(self) -> MemoryProbe:
        import torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base_kb = torch.cuda.memory_allocated(self.device) // 1024
            return self
        _give_back_freed_memory()
        self._base_kb = _resident_kb("VmRSS") or 0
        try:  # Linux >= 4.0: reset the high-water mark
            with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
                f.write("5")
            self._reset = True
        except OSError:
            self._reset = False
        return self

    def peak_mb(self) -> float:
        """Peak above the start, in MB (the process's peak when the high-water mark cannot be reset)."""
        import torch

        if self.device.type == "cuda":
            return max(0, torch.cuda.max_memory_allocated(self.device) // 1024 - self._base_kb) / 1024
        peak = _resident_kb("VmHWM")
        if peak is None:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return max(0, peak - (self._base_kb if self._reset else 0)) / 1024


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_footprint(device) -> dict:
    """What this process holds on its GPU, for packing trials onto cards (`petl_nas.search.packing`): the
    allocator's reserved peak since the trial's probe reset it (the backbone and the trial's
    tensors, caching included) and the card's memory, in MB. Empty on CPU."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return {}
    return {
        "gpu_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
        "gpu_total_mb": torch.cuda.get_device_properties(device).total_memory / 2**20,
    }


def deployed_latency_ms(model, batch: dict, device, repeats: int = LATENCY_REPEATS, warm_ups: int = 2) -> float:
    """Median ms of one forward pass of ``batch`` through ``model`` in its deployed form, over
    ``repeats`` timed passes after ``warm_ups`` untimed ones, in the precision it predicts in
    (`precision.autocast_for`: bf16 on a GPU). Merges what can be merged into ``model``'s weights
    first, so call it when training is over."""
    import torch

    from ..core.inject import merge_lora
    from ..core.precision import autocast_for

    merge_lora(model)
    device = torch.device(device)
    batch = {k: v.to(device) for k, v in batch.items()}  # labels too: a seq2seq decoder reads them
    model.eval()
    times = []
    with torch.no_grad(), autocast_for(model, device):
        for i in range(repeats + warm_ups):
            _sync(device)
            t = time.perf_counter()
            model(**batch)
            _sync(device)
            if i >= warm_ups:
                times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


__all__ = [
    "COSTS",
    "UNITS",
    "OBJECTIVES",
    "LATENCY_BATCH",
    "check_objectives",
    "metric_names",
    "directions",
    "cost_values",
    "MemoryProbe",
    "deployed_latency_ms",
    "gpu_footprint",
]
