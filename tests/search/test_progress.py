"""`progress.Stage`: while a run of a stage trains, a line every `every_s` seconds saying what it
is, how long it has run and (once a run finished) how long the stage has left; none after it ends."""

from __future__ import annotations

import threading

import pytest

from petl_nas.console import CLEAR, SaidOnce, say
from petl_nas.search.progress import Stage, countdown, time_left


def test_the_heartbeat_says_what_runs_and_what_is_left_once_a_run_has_finished():
    stage = Stage(print, total=3)
    assert (
        stage.heartbeat("calibration: lora at 10 epochs", 90) == "  calibration: lora at 10 epochs: running for 1.5 min"
    )
    stage.done, stage.spent_s = 1, 120.0  # one run took 2 min: 2 more, minus 1 min already run
    assert stage.heartbeat("x", 60) == "  x: running for 1.0 min; about 3 min left in this stage (1 of 3 runs done)"
    assert stage.left() == "1 of 3 runs, about 4 min left"
    stage.at_most = True  # rates: the stage may stop before its last run
    assert stage.left() == "1 of 3 runs, at most 4 min left"
    stage.done = 3
    assert stage.heartbeat("x", 10) == "  x: running for 0.2 min" and stage.left() == "3 of 3 runs"


def test_a_run_outlasting_the_mean_raises_the_estimate_instead_of_running_it_down():
    """A fake clock: 1 of 3 runs took 2 min; the next runs on. The minutes left fall while it runs
    within the mean, then grow with it (it takes at least as long as it has run), never "1 min left"
    before a jump back up when it ends."""
    stage = Stage(print, total=3)
    stage.done, stage.spent_s = 1, 120.0
    said = [int(stage.heartbeat("x", s).split("; about ")[1].split()[0]) for s in (0, 60, 120, 300, 600)]
    assert said == [4, 3, 2, 4, 6]  # (120 + 300) / 2 for the one left after it: 3.5 min
    assert time_left(60.0, 2, 2, 500.0) == 0.0 and time_left(60.0, 1, 2, 500.0) == 0.0  # the last one: done soon


def test_countdown():
    assert countdown(120, 1, 3) == "1 of 3, about 4 min left" and countdown(10, 2, 2, "runs") == "2 of 2 runs"
    assert countdown(5, 1, 2) == "1 of 2, about 1 min left"  # never "0 min"


def test_a_run_prints_while_it_trains_and_stops_when_it_ends_even_when_it_fails():
    said, beat = [], threading.Event()

    def printer(line: str) -> None:
        said.append(line)
        beat.set()

    stage = Stage(printer, total=2, every_s=0.01)
    with stage.run("final: trial 3, seed 0"):
        assert beat.wait(30)  # the run is still going: a line came anyway
    assert said[0].startswith("  final: trial 3, seed 0: running for 0.0 min")
    assert stage.done == 1 and stage.spent_s > 0
    with pytest.raises(RuntimeError), stage.run("final: trial 3, seed 1"):
        raise RuntimeError("a run that fails")
    assert stage.done == 2  # counted, and its thread joined
    count = len(said)
    threading.Event().wait(0.05)
    assert len(said) == count  # nothing printed once no run goes on


def test_a_run_that_says_where_it_stands_has_that_in_its_line():
    stage = Stage(print, total=1)
    assert (
        stage.heartbeat("one-shot: training the supernet", 90, "epoch 3 of 10 done, about 5 min left")
        == "  one-shot: training the supernet: running for 1.5 min; epoch 3 of 10 done, about 5 min left"
    )
    said, beat = [], threading.Event()
    standing = iter([None, "epoch 1 of 2 done"])  # nothing written yet, then an epoch

    def printer(line: str) -> None:
        said.append(line)
        if len(said) >= 2:
            beat.set()

    stage = Stage(printer, total=1, every_s=0.01)
    with stage.run("x", lambda: next(standing, "epoch 1 of 2 done")):
        assert beat.wait(30)
    assert said[0] == "  x: running for 0.0 min" and said[1] == "  x: running for 0.0 min; epoch 1 of 2 done"


def test_on_a_terminal_a_runs_heartbeats_take_one_line_and_the_next_event_replaces_it(monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    stage = Stage(SaidOnce(say), total=1, every_s=0.01)
    with stage.run("confirming: trial 6, seed 1"):
        while sys.stdout.getvalue().count("running for") < 3:
            threading.Event().wait(0.01)
    say("confirming: trial 6 done")
    out = sys.stdout.getvalue()
    assert out.count("\n") == 1 and out.endswith(CLEAR + "confirming: trial 6 done\n")
    assert out.startswith(CLEAR + "  confirming: trial 6, seed 1: running for 0.0 min")
