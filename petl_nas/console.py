"""How a search talks on the console: rows as aligned plain-text tables, each sentence said once,
details only with ``--verbose``, and the width a line should keep to.

The output is plain text whether or not it goes to a terminal (no colours, no bars), so a log or a
test reads what a user sees. One thing differs on a terminal: a `status` line (a long run's
heartbeat) is rewritten in place until the next event's line replaces it; in a log or CI it is a
line of its own, as every event is.

Example:
    >>> print("\\n".join(table(["family", "rate"], [["lora", "5.0e-04"], ["prompt", "3.0e-03"]])))
      family  rate
      lora    5.0e-04
      prompt  3.0e-03
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
import threading
from typing import Callable, Sequence

WIDTH = 120  # the longest line worth printing, a path or a command aside
VERBOSE_ENV = "PETL_NAS_VERBOSE"  # set by --verbose: seen by workers and a suite's study processes too
CLEAR = "\r\x1b[K"  # back to the line's start and erase it: where a status line is replaced
_screen = threading.Lock()  # heartbeats come from a thread of their own
_status_shown = threading.Event()  # a status line stands on the terminal, not yet replaced


def verbose() -> bool:
    """Whether ``--verbose`` asked for the details."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def set_verbose(on: bool) -> None:
    """Say the details from now on (``--verbose``), in this process and those it starts."""
    if on:
        os.environ[VERBOSE_ENV] = "1"
    else:
        os.environ.pop(VERBOSE_ENV, None)


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ", right: Sequence[int] = ()
) -> list[str]:
    """``rows`` under ``headers`` in aligned columns (those numbered in ``right`` aligned right)."""
    cells = [[str(c) for c in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return (
            indent
            + "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        )

    return [line(r) for r in cells]


def fit(line: str) -> str:
    """``line`` wrapped at WIDTH, its later lines indented two more spaces; a command (an indented
    ``petl-nas ...``) and any one word (a path, a URL) are never cut."""
    if len(line) <= WIDTH or line.lstrip().startswith(("petl-nas ", "source ")):
        return line
    indent = line[: len(line) - len(line.lstrip())]
    return textwrap.fill(
        line.strip(),
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def one_line(head: str, name: str, tail: str) -> str:
    """``head + name + tail`` within WIDTH where it can be, ``name`` (a configuration in a few words)
    cut short with an ellipsis to make room, never below 12 characters: a trial is one line.

    Example:
        >>> one_line("[1/8] trial 3 ", "LoRA r=2 q,v + prompt 4", "  0.81  " + "x" * 90)[:40]
        '[1/8] trial 3 LoRA r=2 q,…  0.81  xxxxxx'
    """
    room = max(12, WIDTH - len(head) - len(tail))
    return head + (name if len(name) <= room else name[: room - 1] + "…") + tail


def say(text: str) -> None:
    """Print ``text`` on standard output, each line `fit` to the width, at once (live when piped); on
    a terminal it replaces the `status` line standing there."""
    with _screen:
        clear_status()
        for line in str(text).split("\n"):
            print(fit(line), flush=True)


def status(text: str) -> None:
    """A line saying where a long run stands. On a terminal it is written over the last one (cut to
    the terminal's width), so a run's heartbeats take one line, and the next line `say` prints takes
    its place; elsewhere (a log, CI) it is printed as a line of its own, like an event."""
    if not sys.stdout.isatty():
        say(text)
        return
    room = max(20, shutil.get_terminal_size().columns - 1)
    line = text.rstrip()  # its indent kept, as the lines around it have theirs
    line = line if len(line) <= room else line[: room - 1] + "…"
    with _screen:
        sys.stdout.write(CLEAR + line)
        sys.stdout.flush()
        _status_shown.set()


def clear_status() -> None:
    """Erase the `status` line standing on the terminal, if any, before something else is written
    there (a warning on standard error shares the screen)."""
    if _status_shown.is_set():
        _status_shown.clear()
        sys.stdout.write(CLEAR)
        sys.stdout.flush()


class SaidOnce:
    """A printer that passes each line on once: a line said before in this run (a warning met
    again, a verdict) is not printed again. ``said`` holds every line printed."""

    def __init__(self, printer: Callable[[str], None]):
        self.printer = getattr(printer, "printer", printer)  # wrapping one again: share its memory
        self.said: set[str] = getattr(printer, "said", set())

    def __call__(self, text: str) -> None:
        fresh = [line for line in str(text).split("\n") if not line.strip() or line.strip() not in self.said]
        self.said.update(line.strip() for line in fresh if line.strip())
        for line in fresh:
            self.printer(line)

    def detail(self, text: str) -> None:
        """``text`` only with ``--verbose``."""
        if verbose():
            self(text)

    def status(self, text: str) -> None:
        """A heartbeat: a `status` line where this prints with `say`, else an ordinary line. Never
        remembered: each says a later time."""
        (status if self.printer is say else self.printer)(text)


def detail(printer: Callable[[str], None], text: str) -> None:
    """Print ``text`` with ``printer`` only with ``--verbose``."""
    if verbose():
        printer(text)


__all__ = [
    "CLEAR",
    "WIDTH",
    "VERBOSE_ENV",
    "SaidOnce",
    "clear_status",
    "detail",
    "fit",
    "one_line",
    "say",
    "set_verbose",
    "status",
    "table",
    "verbose",
]
