"""Progress lines for the stages a user waits on outside the trials: calibrating the trial length
and the rates, training a supernet, confirming candidates, the final re-evaluation.

A stage is a number of runs of about equal length, trained one after another in this process. While
a run goes on, `Stage.run` says what it trains at least every `EVERY_S` seconds, with how long it
has run and, once a run of the stage has finished, about how long the stage has left (or what the
run says of itself, e.g. a supernet's epochs done and time left); `countdown` is the line after
each run. `time_left` keeps an estimate from jumping while a run outlasts the mean. On a terminal
these heartbeats are one `console.status` line rewritten in place; in a log, a line each.

Example:
    >>> stage = Stage(print, total=3)                                  # doctest: +SKIP
    >>> with stage.run("calibration: lora at 10 epochs"):              # doctest: +SKIP
    ...     result = run_trial(spec)
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

from ..console import say, status

EVERY_S = 30.0


def countdown(spent_s: float, done: int, total: int, unit: str = "", bound: str = "about") -> str:
    """``i of n[ unit], about M min left`` after the i-th of n jobs of about equal length took ``spent_s``."""
    left = spent_s / done * (total - done)
    return f"{done} of {total}{' ' + unit if unit else ''}" + (
        f", {bound} {max(1, round(left / 60))} min left" if done < total else ""
    )


def time_left(per_unit_s: float, done: int, total: int, running_s: float = 0.0) -> float:
    """Seconds left of ``total`` units of about equal length, ``done`` of them done at ``per_unit_s``
    each and the next one running for ``running_s``. The running unit counts as at least as long as
    it has run: once it runs past the mean, the estimate grows from there, where subtracting its
    time from the mean's would fall to nothing and jump back up when it ends."""
    left = total - done
    if left <= 0:
        return 0.0
    if running_s <= per_unit_s:
        return per_unit_s * left - running_s
    return (per_unit_s * done + running_s) / (done + 1) * (left - 1)


class Stage:
    """``total`` runs of about equal length (an upper bound where the stage may stop early: its
    estimate is then "at most"), each inside `run`."""

    def __init__(self, printer: Callable[[str], None], total: int, every_s: float | None = None, at_most: bool = False):
        self.printer, self.total, self.at_most = printer, total, at_most
        # a heartbeat is a status line where the printer can show one (`console.SaidOnce`, `say`)
        self.beat = getattr(printer, "status", status if printer is say else printer)
        self.every_s = EVERY_S if every_s is None else every_s
        self.done, self.spent_s = 0, 0.0

    def heartbeat(self, what: str, running_s: float, detail: str | None = None) -> str:
        """The line printed while ``what`` has run ``running_s`` seconds (``detail``: where the run
        itself says it stands, e.g. its epochs done, said after that)."""
        line = f"  {what}: running for {running_s / 60:.1f} min" + (f"; {detail}" if detail else "")
        if self.done and self.done < self.total:
            left = time_left(self.spent_s / self.done, self.done, self.total, running_s)
            line += (
                f"; {self._bound} {max(1, round(left / 60))} min left in this stage ({self.done} of "
                f"{self.total} runs done)"
            )
        return line

    def left(self) -> str:
        """`countdown` of the runs done so far: ``2 of 6 runs, about 4 min left``."""
        return countdown(self.spent_s, max(1, self.done), self.total, "runs", self._bound)

    @property
    def _bound(self) -> str:
        return "at most" if self.at_most else "about"

    @contextlib.contextmanager
    def run(self, what: str, detail: Callable[[], str | None] | None = None) -> Iterator[None]:
        """Train one run of the stage inside this block; it prints `heartbeat` every ``every_s``
        seconds until it ends (however it ends), with ``detail()`` in it when given."""
        began = time.perf_counter()

        def beat() -> None:
            self.beat(self.heartbeat(what, time.perf_counter() - began, detail() if detail else None))

        try:
            with repeating(self.every_s, beat, "petl-nas progress"):
                yield
        finally:
            self.done += 1
            self.spent_s += time.perf_counter() - began


@contextlib.contextmanager
def repeating(every_s: float, action: Callable[[], None], name: str) -> Iterator[None]:
    """While the block runs, a daemon thread called ``name`` calls ``action`` every ``every_s``
    seconds; it is stopped and joined when the block ends, however it ends."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            action()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every_s + 5)


__all__ = ["EVERY_S", "Stage", "countdown", "repeating", "time_left"]
