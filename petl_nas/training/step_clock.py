"""The training loop's clock: what one optimiser step costs (`TrainResult.train_step_ms`, the
`step_time` objective, `costs.COSTS`).

Time inside the loop that is not a step's is left out: evaluations, and the one-off cost a run pays
for each new batch shape where it has one, a CUDA graph's recording (`step_graphs`) or a step's
compilation (`compiling`: 25-60 s a configuration on an H100, against a few seconds of training).
Counted in, those made a graphed or compiled configuration's step time depend on how many shapes
its batches took, not on what a step costs. A step whose one-off cost is left out is left out
whole (its own work with it, synchronised on a GPU so that the work queued before it stays
counted); the mean is over the other steps, or over all of them when every step was such a one.

On a CPU the clock is the process's CPU time, not the wall's: what the steps cost the cores,
whatever else the machine runs (other trials, a test suite). Under three competing processes on 2
cores a step's wall time rose 2.1x and its CPU time 1.1x (`bench/results/cpu_clock_under_load.md`).
With one thread per trial it is the wall time of a quiet machine; with T threads, up to T times
it. On a GPU it is the wall's.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import torch

from .step_graphs import shape_key


class StepClock:
    """``one_off(batch)`` says whether the step about to run on ``batch`` may pay a one-off cost
    (None: no step does); ``count()``, where given, counts what was paid so far (graphs compiled),
    so that such a step that paid nothing (a shape a dynamic graph took) is timed as the others.
    Start it where the loop starts (a run resumed from a checkpoint: where it
    resumes), run each step inside `step` and what is not a step inside `aside`, then read
    `ms_per_step` and `steps_timed`."""

    def __init__(
        self,
        device: torch.device | str,
        one_off: Callable[[dict], bool] | None = None,
        count: Callable[[], int | None] | None = None,
        clock: Callable[[], float] | None = None,
    ):
        self.device = torch.device(device)
        self.one_off, self.count, self.clock = one_off, count, clock or clock_for(self.device)
        self.start_s = self.clock()
        self.aside_s = 0.0
        self.steps = 0  # run inside `step`
        self.one_off_s, self.one_off_steps = 0.0, 0

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """Time that is not a step's (an evaluation)."""
        self._sync()  # the steps queued before it are theirs
        start = self.clock()
        try:
            yield
        finally:
            self.aside_s += self.clock() - start

    @contextlib.contextmanager
    def step(self, batch: dict) -> Iterator[None]:
        """One optimiser step on ``batch``; left out if it pays a one-off cost."""
        self.steps += 1
        if self.one_off is None or not self.one_off(batch):
            yield
            return
        self._sync()  # the steps queued before it are theirs, not its
        paid_before = self.count() if self.count is not None else None
        start = self.clock()
        yield
        self._sync()
        if paid_before is not None and self.count() == paid_before:
            return  # it paid nothing after all: a step like the others
        self.one_off_s += self.clock() - start
        self.one_off_steps += 1

    def steps_timed(self) -> int:
        """How many steps the mean is over."""
        return self.steps - self.one_off_steps if self._some_timed() else self.steps

    def ms_per_step(self) -> float:
        """Mean milliseconds per timed step since the clock started."""
        loop_s = self.clock() - self.start_s - self.aside_s - (self.one_off_s if self._some_timed() else 0.0)
        return 1000 * loop_s / max(1, self.steps_timed())

    def _some_timed(self) -> bool:
        return self.steps > self.one_off_steps

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def clock_for(device: torch.device | str) -> Callable[[], float]:
    """Seconds as a step on ``device`` is timed: the process's CPU time on a CPU, the wall's elsewhere."""
    return time.process_time if torch.device(device).type == "cpu" else time.perf_counter


def first_of_each_shape() -> Callable[[dict], bool]:
    """A `StepClock` ``one_off`` for compiled steps: true the first time a batch's shapes are seen."""
    seen: set[tuple] = set()

    def new(batch: dict) -> bool:
        key = shape_key(batch)
        if key in seen:
            return False
        seen.add(key)
        return True

    return new


__all__ = ["StepClock", "clock_for", "first_of_each_shape"]
