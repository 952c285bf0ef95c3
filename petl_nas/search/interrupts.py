"""Ctrl-C and SIGTERM stop a search, and a stop is never lost.

Python runs a signal's handler between two bytecodes of the main thread. When those fall inside a
finaliser or a weakref callback (SQLAlchemy cleans its sessions up with them), the
KeyboardInterrupt the handler raises is printed as "Exception ignored in ..." and dropped, and the
search goes on as if nothing was pressed (seen: 1 of 300 interrupts of a storage read in a loop).
`stops_on_signals` remembers every stop it raised, keeps such a dropped stop off stderr (Python's
"Exception ignored" traceback), and `raise_if_stopped`, called where a search hears from its trials
(each report and result, each trial drawn), raises it again.
`interruptible` runs what a stop must be cleaned up after (a search's running trials marked as
interrupted), out of the except block that caught it, and a second Ctrl-C does not cut that
clean-up short: it is said and the search stops when the clean-up ends, as the first one asked.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")
_STOPPED: list[int] = []  # the signal of a stop raised and not raised again since
_SIGNALLED: list[int] = []  # the signal of the last stop within `stops_on_signals`


class Stopped(KeyboardInterrupt):
    """A stop by a signal: Ctrl-C's SIGINT, or SIGTERM (``timeout``, a batch scheduler, ``kill``)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__()
        self.signum = signum


@contextlib.contextmanager
def stops_on_signals():
    """Within it, SIGINT (unless ignored: a command started in the background of a shell) and
    SIGTERM (``timeout``, a batch scheduler, ``kill``) raise KeyboardInterrupt, remembered for
    `raise_if_stopped`; the previous handlers come back after it. A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        _STOPPED[:] = _SIGNALLED[:] = [signum]
        raise Stopped(signum)

    _STOPPED.clear()
    _SIGNALLED.clear()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN or s == signal.SIGTERM:
            signal.signal(s, stop)
    unraisable = sys.unraisablehook
    sys.unraisablehook = _quiet_about_stops(unraisable)
    try:
        yield
    except KeyboardInterrupt as e:
        if _SIGNALLED and not isinstance(e, Stopped):  # re-raised plainly (Ray Tune does): the signal it was
            raise Stopped(_SIGNALLED[0]) from e
        raise
    finally:
        for s, handler in previous.items():
            if handler is not None:  # None: a handler not set from Python, left as it is
                signal.signal(s, handler)
        sys.unraisablehook = unraisable
        _STOPPED.clear()
        _SIGNALLED.clear()


def _quiet_about_stops(hook):
    """``hook``, except for a stop dropped in a finaliser: `raise_if_stopped` raises it again."""

    def quiet(unraisable):
        if not isinstance(unraisable.exc_value, Stopped):
            hook(unraisable)

    return quiet


def exit_status(stop: BaseException) -> int:
    """What a command stopped by ``stop`` (or an error raised while it unwound) exits with: 128 +
    the signal, as a shell reports a process it killed (SIGTERM: 143, so that a batch scheduler
    tells its own stop from Ctrl-C's 130)."""
    return 128 + _signal_of(stop)


def _signal_of(stop: BaseException | None) -> int:
    seen = set()
    while stop is not None and id(stop) not in seen:
        if isinstance(stop, Stopped):
            return stop.signum
        seen.add(id(stop))
        stop = stop.__cause__ or stop.__context__
    return signal.SIGINT


def caused_by_interrupt(e: BaseException) -> bool:
    """Whether ``e`` is a KeyboardInterrupt or came while one was unwinding (Ray's start-up, a
    storage call cut short, failing on the way out): then the interrupt is what happened."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__context__
    return False


def one_line(e: BaseException) -> str:
    """``Type: first line of its message``, as a stop's warning names an error."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def interruptible(body: Callable[[], T], on_stop: Callable[[str | None], None]) -> T:
    """``body()``; if Ctrl-C stops it (or an error raised while the interrupt unwinds, whose one
    line ``on_stop`` gets), ``on_stop`` runs once out of the except block, so that the interrupt's
    frames, and whatever storage connection they held, are let go; then KeyboardInterrupt."""
    try:
        return body()
    except KeyboardInterrupt as e:
        masked, signum = None, _signal_of(e)
    except Exception as e:  # noqa: BLE001 - re-raised unless an interrupt's
        if not caused_by_interrupt(e):
            raise
        masked, signum = one_line(e), _signal_of(e)
    with _stops_wait():
        on_stop(masked)
    raise Stopped(_SIGNALLED[0] if _SIGNALLED else signum)  # Ray re-raises a stop as a plain KeyboardInterrupt


@contextlib.contextmanager
def _stops_wait():
    """Within it, SIGINT and SIGTERM raise nothing; each says that the stop is under way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def wait(signum, frame):
        print(
            "petl-nas: still stopping: the running trials are being marked as interrupted", file=sys.stderr, flush=True
        )

    replaced = {
        s: h
        for s in (signal.SIGINT, signal.SIGTERM)  # None: not set from Python; left as it is
        if (h := signal.getsignal(s)) is not None and h is not signal.SIG_IGN
    }
    for s in replaced:
        signal.signal(s, wait)
    try:
        yield
    finally:
        for s, handler in replaced.items():
            signal.signal(s, handler)


class StoppedBeforeWriting(KeyboardInterrupt):
    """A stop that came before anything was written (a search's study not made yet)."""


@contextlib.contextmanager
def before_writing():
    """A stop inside it (or an error raised while one unwinds) comes out as `StoppedBeforeWriting`."""
    try:
        yield
    except BaseException as e:  # noqa: BLE001 - re-raised as it is unless a stop
        if caused_by_interrupt(e) and not isinstance(e, StoppedBeforeWriting):
            raise StoppedBeforeWriting from e
        raise


def raise_if_stopped() -> None:
    """Raise KeyboardInterrupt if a signal stopped the search and its interrupt was dropped; once."""
    if _STOPPED:
        raise Stopped(_STOPPED.pop())


__all__ = [
    "stops_on_signals",
    "raise_if_stopped",
    "caused_by_interrupt",
    "interruptible",
    "one_line",
    "Stopped",
    "StoppedBeforeWriting",
    "before_writing",
    "exit_status",
]
