"""What a study measures once before its trials (the trial length's calibration, each family's rate):
one worker claims the measurement under the study's `ClaimLock`, beats while it measures, and
stores the record; the other workers of the study wait and read that record. A claim whose beat
lapsed (its worker died) is taken over, as a trial's is.

The rule: the first record stored is the one every worker uses, and whatever is kept beside it (a
file) is written from that record under the same lock, before any waiting worker reads it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import time
from typing import Callable

from .progress import repeating

PREFIX = "claim:"  # the study attribute of a measurement's claim: claim:<its record's attribute>


def training_elsewhere(started: dict | None, grace_period: float) -> bool:
    """Whether the run that ``started`` records (a measurement's claim, a supernet's start) is still going in
    another process: its beat is younger than ``grace_period`` and, on this host, its process is alive (a
    process of this host that is gone, or this one, trains nothing; a run from before beats were kept is
    taken over)."""
    if not started or "beat" not in started or started.get("diverged"):
        return False
    if started.get("host") == socket.gethostname():
        if started.get("pid") == os.getpid():
            return False
        try:
            os.kill(started["pid"], 0)
        except ProcessLookupError:
            return False
        except (PermissionError, OSError, TypeError):
            pass
    return time.time() - started["beat"] < grace_period


def once(
    study,
    lock,
    attr: str,
    measure: Callable[[], dict],
    printer,
    what: str,
    interval: float,
    grace: float,
    keep: Callable[[dict], None] | None = None,
) -> tuple[dict, bool]:
    """(the study's record ``attr``, whether this worker measured it). ``measure`` runs in one worker
    of the study at a time, outside ``lock``; ``keep(record)`` runs under it once the record is
    stored (by the worker that stored it)."""
    lock = lock or contextlib.nullcontext
    key, waited = PREFIX + attr, False
    while True:
        with lock():
            record = study.user_attrs.get(attr)
            if record is not None:
                return record, False
            claim = study.user_attrs.get(key)
            if not training_elsewhere(claim, grace):
                mine = {
                    "at": datetime.datetime.now().isoformat(timespec="seconds"),
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "beat": time.time(),
                }
                study.set_user_attr(key, mine)
                break
        if not waited:
            printer(
                f"{what}: another worker ({claim['host']}, process {claim['pid']}) has been measuring it since "
                f"{claim['at']}; waiting for its record"
            )
            waited = True
        time.sleep(min(5.0, interval))
    try:
        with _beating(study, key, mine, interval):
            record = measure()
    except BaseException:  # stopped or failed: the next worker need not wait out the beat
        _release(study, lock, key, mine)
        raise
    with lock():
        stored = study.user_attrs.get(attr)
        if stored is None:  # else a worker that took over a lapsed claim stored first: its stands
            study.set_user_attr(attr, record)
            if keep is not None:
                keep(record)
        return study.user_attrs[attr], stored is None


def _release(study, lock, key: str, mine: dict) -> None:
    try:
        with lock():
            current = study.user_attrs.get(key)
            if current and (current.get("host"), current.get("pid")) == (mine["host"], mine["pid"]):
                study.set_user_attr(key, None)
    except Exception:  # noqa: BLE001 - the beat lapses instead
        pass


def _beating(study, key: str, mine: dict, interval: float):
    def beat():
        try:
            current = study.user_attrs.get(key)
            if current and (current.get("host"), current.get("pid")) == (mine["host"], mine["pid"]):
                study.set_user_attr(key, {**current, "beat": time.time()})
        except Exception:  # noqa: BLE001 - a database hiccup: the next beat retries
            pass

    return repeating(interval, beat, "petl-nas-claim-beat")


__all__ = ["once", "PREFIX"]
