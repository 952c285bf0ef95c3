"""A run's training step replayed as CUDA graphs, one per batch shape (``Recipe.cuda_graphs``).

On a GPU a PETL step is bound by the host: each of its ~1,000-3,000 small kernels costs a Python
call and a launch, and the GPU waits (`bench/step_time.py`: a MiniLM trial kept an H100 9% busy).
`GraphedSteps` records the whole step (forward, loss, backward, gradient clipping, the fused AdamW
update) once per batch shape and then launches it as one graph: no Python per kernel, no
compilation (unlike ``torch.compile``, which paid 30-60 s per shape and made a trial 5× slower).

What makes a step replayable, and how this module keeps it so:
- Inputs live at fixed addresses: each shape has its own device buffers, and a batch is copied in.
  Batches are padded to a multiple of `LENGTH_MULTIPLE` tokens (masked positions) so that
  length-bucketed batches make a handful of shapes, not one per length.
- The optimiser reads its learning rate from device tensors (`prepare_optimizer`), which the
  schedule fills before each step: a number would be frozen into the graph at its first value.
- Gradients are written, not accumulated: each graph is recorded with every ``.grad`` unset.
- The first `WARMUP` steps run eagerly on a side stream (as torch's documentation asks: lazy
  initialisation, the optimiser's state), then shapes are recorded as they come.
- Every graph shares one memory pool: graphs never run at once and none reads another's memory,
  so the pool holds the largest step's activations, not their sum.

What cannot be replayed stays eager (`why_not`): a step reading a value on the host (a one-shot
supernet's penalty, fp16 loss scaling), frozen-layer reuse (fed per batch), ``torch.compile``
(its own graphs), a CPU. A step that fails to record (something in it waits for the GPU) falls
back to eager steps for the rest of the run and says why in `info`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

LENGTH_MULTIPLE = 8  # batches are padded to a multiple of this many tokens: few shapes, fewer graphs
WARMUP = 3  # eager steps (on a side stream) before the first graph is recorded


def why_not(
    device: torch.device,
    *,
    scaled: bool,
    regularized: bool,
    frozen_reuse: bool,
    compiled: bool,
    layerdrop: bool = False,
) -> str | None:
    """None when a run's training step can be recorded as CUDA graphs, else the reason it cannot."""
    if device.type != "cuda":
        return "no CUDA device"
    if layerdrop:  # a replay would skip the layers its recording skipped, always
        return "LayerDrop (the config's encoder_layerdrop / decoder_layerdrop) draws the layers to run on the host"
    if scaled:
        return "fp16 loss scaling reads the gradients' finiteness on the host"
    if regularized:
        return "a step-dependent regulariser (the one-shot supernet's penalty) is read on the host"
    if frozen_reuse:
        return "frozen-layer reuse feeds cached layers batch by batch"
    if compiled:
        return "torch.compile records its own graphs (fidelity.compile)"
    return None


def prepare_optimizer(opt: torch.optim.Optimizer, device: torch.device, graphed: bool) -> None:
    """Make ``opt`` recordable (learning rates as 0-d tensors on ``device``, ``capturable``) or plain
    again (numbers, not capturable): a checkpoint saved by one kind of run resumes in the other."""
    for group in opt.param_groups:
        lr = group["lr"]
        lr = float(lr) if isinstance(lr, torch.Tensor) else lr
        group["lr"] = torch.tensor(lr, dtype=torch.float32, device=device) if graphed else lr
        group["capturable"] = graphed


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]  # the recorded step reads its batch from here
    loss: torch.Tensor  # and writes its loss here (overwritten by the next replay)


@dataclass
class GraphInfo:
    """What a run's graphs did (stored with the trial)."""

    used: bool
    why_not: str | None = None  # why the steps ran eagerly (all, or after a failed recording)
    shapes: list[list[int]] = field(default_factory=list)  # [batch, length] of each recorded graph
    eager_steps: int = 0
    replays: int = 0

    def to_dict(self) -> dict:
        return {
            "used": self.used,
            "why_not": self.why_not,
            "shapes": self.shapes,
            "eager_steps": self.eager_steps,
            "replays": self.replays,
        }


class GraphedSteps:
    """Calls ``step`` (a batch on the device -> the loss; it runs forward, backward and the
    optimiser step, and leaves the gradients set) eagerly for the first `WARMUP` batches, then
    records it once per batch shape and replays the recording. Call with a batch on the host; the
    returned loss lives in the graph's memory: copy it before the next call."""

    def __init__(self, step: Callable[[dict], torch.Tensor], params: list[torch.Tensor], device: torch.device):
        self.step, self.params, self.device = step, params, device
        self.graphs: dict[tuple, _Graph] = {}
        self.pool = None
        self.side = torch.cuda.Stream(device)
        self.info = GraphInfo(used=True)

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.info.why_not is not None or self.info.eager_steps < WARMUP:
            return self._eager(batch)
        key = shape_key(batch)
        rec = self.graphs.get(key)
        if rec is None:
            rec = self._record(key, batch)
            if rec is None:
                return self._eager(batch)
        for name, t in batch.items():
            rec.inputs[name].copy_(t.pin_memory(), non_blocking=True)
        rec.graph.replay()
        self.info.replays += 1
        return rec.loss

    def will_record(self, batch: dict[str, torch.Tensor]) -> bool:
        """Whether the call on ``batch`` records a graph (a one-off cost, `step_clock`)."""
        return self.info.why_not is None and self.info.eager_steps >= WARMUP and shape_key(batch) not in self.graphs

    def _unset_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def _eager(self, batch: dict) -> torch.Tensor:
        """One step as plain calls; the warm-up ones on a side stream, as recording requires."""
        on_device = {k: v.pin_memory().to(self.device, non_blocking=True) for k, v in batch.items()}
        self._unset_grads()
        stream = self.side if self.info.why_not is None else torch.cuda.current_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*capturable=True.*")  # true: these steps are not recorded
            loss = self.step(on_device)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._unset_grads()
        self.info.eager_steps += 1
        return loss

    def _record(self, key: tuple, batch: dict) -> _Graph | None:
        """Record ``step`` for this batch's shape; None (and eager from now on) if it cannot be."""
        inputs = {k: v.to(self.device) for k, v in batch.items()}  # outside the pool: they persist
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.current_stream(self.device)
        generator = torch.cuda.default_generators[
            self.device.index if self.device.index is not None else torch.cuda.current_device()
        ]
        rng = generator.get_state()
        self._unset_grads()
        try:
            # thread_local: other threads' CUDA calls (a heartbeat, a progress bar) do not spoil it
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                loss = self.step(inputs)
        except Exception as e:  # something in the step waits for the GPU, or cannot be recorded
            torch.cuda.set_stream(stream)  # a failed capture_end leaves the capture stream current
            # ... and the generator in capture mode, where every later dropout would fail: give it a
            # fresh state at the offset it had, so the eager steps draw what they would have drawn
            fresh = torch.Generator(device=generator.device)
            fresh.set_state(rng)
            generator.graphsafe_set_state(fresh)
            self._unset_grads()
            self.info.why_not = f"recording failed: {(str(e).strip().splitlines() or [type(e).__name__])[0][:200]}"
            return None
        self._unset_grads()  # the graph keeps writing them; nothing outside reads them
        self.pool = self.pool if self.pool is not None else graph.pool()
        rec = _Graph(graph, inputs, loss)
        self.graphs[key] = rec
        self.info.shapes.append(list(next(iter(batch.values())).shape))
        return rec


def shape_key(batch: dict[str, torch.Tensor]) -> tuple:
    """What tells one batch's shapes (and dtypes) from another's."""
    return tuple((name, tuple(t.shape), t.dtype) for name, t in batch.items())


__all__ = ["GraphedSteps", "GraphInfo", "LENGTH_MULTIPLE", "WARMUP", "why_not", "prepare_optimizer", "shape_key"]
