"""Where a supernet run stands while it trains: a small file its training rewrites after every epoch,
beside its checkpoint, and the words the waiting driver's progress line takes from it.

A supernet trains for minutes in one job (in this process, or as a Ray trial in another), so the
driver's heartbeat alone could say only how long it has run. The process that trains writes the
epochs done and when; the driver reads that file (on the same machine, or any that shares the run
folder) and adds ``epoch 3 of 10 done, about 9 min left`` to its line (the first epoch's warm-up
not extrapolated, and an epoch that outlasts the others raising the estimate rather than letting
it run down to nothing). A file older than the run
the driver waits for is another run's and is not read; on a cluster without a shared file system
there is no file, and the line says only how long the run has gone on.

Example:
    >>> path = standing_path("runs/s/oneshot/oneshot-0.pt")                      # doctest: +SKIP
    >>> write(path, epoch=3, epochs=10, first_epoch=0, began=t0)                  # doctest: +SKIP
    >>> describe(path, since=t0)                                                  # doctest: +SKIP
    'epoch 3 of 10 done, about 9 min left'
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from ...fileio import atomic_write
from ..progress import time_left


def standing_path(checkpoint_path: str | os.PathLike) -> str:
    """The standing file of the run whose per-epoch state is saved at ``checkpoint_path``."""
    return str(checkpoint_path) + ".standing.json"


def write(
    path: str | os.PathLike, epoch: int, epochs: float, first_epoch: int, began: float, first_done: float | None = None
) -> None:
    """Record that ``epoch`` of ``epochs`` epochs are done, in a run that started training at
    ``began`` (wall-clock seconds) from epoch ``first_epoch`` (0, or the epoch it resumed from) and
    ended its first epoch at ``first_done``."""
    text = json.dumps(
        {
            "epoch": epoch,
            "epochs": epochs,
            "first_epoch": first_epoch,
            "began": began,
            "first_done": first_done,
            "at": time.time(),
        }
    )
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def describe(path: str | os.PathLike, since: float, now: float | None = None) -> str | None:
    """``epoch E of N done, about M min left`` from the standing file at ``path``; None when there is
    none yet, it is unreadable, or it was written before ``since`` (another run's)."""
    try:
        s = json.loads(Path(path).read_text(encoding="utf-8"))
        epoch, epochs, first, began, at = (s["epoch"], float(s["epochs"]), s["first_epoch"], s["began"], s["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if at < since or epoch <= first:
        return None
    now = time.time() if now is None else now
    total = math.ceil(epochs)  # a fractional last epoch is one more epoch's save
    per_epoch = (at - began) / (epoch - first)
    if epoch - first >= 2 and isinstance(s.get("first_done"), (int, float)):  # a slow first epoch (warm-up)
        per_epoch = min(per_epoch, (at - s["first_done"]) / (epoch - first - 1))  # is not extrapolated
    said = f"epoch {epoch} of {epochs:g} done"
    if epoch >= total:
        return said + ", scoring it and reading off its proposals"
    left = time_left(per_epoch, epoch, total, now - at)
    return said + f", about {max(1, round(left / 60))} min left"


__all__ = ["standing_path", "write", "describe"]
