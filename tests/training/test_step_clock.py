"""The training loop's clock (`step_clock`): a step's time with what is not a step's left out.

A fake clock stands in for the real one, so each figure is exact; `test_compiling` and
`test_step_graphs_cuda` check that a compiled and a graphed run leave out one step per shape.
"""

from __future__ import annotations

import time

import torch

from petl_nas.training.step_clock import StepClock, clock_for, first_of_each_shape


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def batch(length: int) -> dict:
    return {"input_ids": torch.zeros(2, length, dtype=torch.long)}


def test_evaluations_and_each_shapes_first_step_are_left_out():
    """Steps of 1 s, a first step per shape of 30 s (a recording, a compilation) and an evaluation
    of 100 s: the mean is 1 s, over the steps that paid no one-off cost."""
    fake = FakeClock()
    clock = StepClock("cpu", first_of_each_shape(), clock=fake)
    for length, seconds in ((8, 30.0), (8, 1.0), (16, 30.0), (8, 1.0), (16, 1.0), (16, 1.0)):
        with clock.step(batch(length)):
            fake.now += seconds
    with clock.aside():
        fake.now += 100.0
    assert (clock.ms_per_step(), clock.steps_timed()) == (1000.0, 4)


def test_without_one_off_costs_every_step_counts_and_evaluations_stay_out():
    fake = FakeClock()
    clock = StepClock("cpu", clock=fake)
    for seconds in (5.0, 1.0, 3.0):
        with clock.step(batch(8)):
            fake.now += seconds
        with clock.aside():
            fake.now += 50.0
    assert (clock.ms_per_step(), clock.steps_timed()) == (3000.0, 3)


def test_a_run_whose_every_step_was_a_first_is_timed_over_all_of_them():
    fake = FakeClock()
    clock = StepClock("cpu", first_of_each_shape(), clock=fake)
    for length in (8, 16):
        with clock.step(batch(length)):
            fake.now += 2.0
    assert (clock.ms_per_step(), clock.steps_timed()) == (2000.0, 2)


def test_a_new_shape_that_compiled_nothing_is_timed_as_the_others():
    """Compiled, a graph goes dynamic at its second shape: the shapes after it compile nothing, and
    their first steps are steps like the others (Dynamo's count of graphs says which)."""
    fake, compiled = FakeClock(), [0]
    clock = StepClock("cpu", first_of_each_shape(), lambda: compiled[0], clock=fake)
    for length, seconds, compiles in ((8, 30.0, 1), (8, 1.0, 0), (16, 30.0, 1), (24, 1.0, 0), (32, 1.0, 0)):
        with clock.step(batch(length)):
            fake.now += seconds
            compiled[0] += compiles
    assert (clock.ms_per_step(), clock.steps_timed()) == (1000.0, 3)


def test_a_shape_is_new_once():
    new = first_of_each_shape()
    assert [new(batch(n)) for n in (8, 16, 8, 16, 24)] == [True, True, False, False, True]


def test_on_a_cpu_a_step_costs_its_cpu_time_not_the_wall_time_around_it():
    """What else runs on the machine takes wall time from a step, not CPU time: a step that waits
    (here: sleeps, as it would while other processes hold the cores) is not charged the wait."""
    clock = StepClock("cpu")
    for _ in range(3):
        with clock.step(batch(8)):
            time.sleep(0.2)
    assert clock.ms_per_step() < 100  # 200 ms of wall time a step, almost no CPU time


def test_a_gpu_step_is_timed_by_the_wall():
    assert clock_for("cpu") is time.process_time
    assert clock_for("cuda") is time.perf_counter and clock_for(torch.device("cuda", 1)) is time.perf_counter
