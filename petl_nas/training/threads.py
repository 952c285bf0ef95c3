"""How many threads a process that trains or predicts on the CPU uses: chosen from the cores it may
use and how busy other processes keep them, never inherited from torch's default.

torch starts one thread per core whatever else runs. Beside another job that keeps those cores
busy, its threads wait for each other at every operation: on 2 cores beside a 2-thread job the
README's ``petl-nas train`` took 6.2 s per step at torch's 2 threads and 0.37 s at 1 (issue 52).

`choose` counts the usable cores (this process's CPU affinity, lowered by a cgroup CPU quota),
samples for a moment how many of them other processes keep busy (those cores' CPU times, from
psutil, or the cgroup's own usage where a quota shares them), and takes what is left, at least one.
This process and the processes it started are left out of "other": they are the study's own
(a search's Ray: its idle workers and their teardown right after the trials kept a core busy
when the confirmation began, and it trained on one thread of two free cores), and they do not
train while this process does.
A core counts as busy from 40% of its time on. ``OMP_NUM_THREADS`` set in the environment wins
(Ray sets it for each trial it starts: its share of the cores).

`use_threads` applies a choice to torch and keeps it for a minute, so a phase that trains many
short runs samples once a minute, not once a run. `petl-nas doctor` prints `choose()`'s reason.

Example:
    >>> choose(cores=2, busy=1.8, env={}).threads
    1
    >>> choose(cores=4, busy=0.1, env={}).threads
    4
    >>> choose(cores=4, busy=0.0, env={"OMP_NUM_THREADS": "2"}).reason
    'OMP_NUM_THREADS=2 set in the environment'
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

BUSY_FROM = 0.4  # a core another process keeps busy this share of the time is not ours
SAMPLE_S = 0.25  # how long `busy_elsewhere` watches the cores
KEEP_S = 60.0  # how long `use_threads` keeps a choice before sampling again
CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ThreadChoice:
    """``threads`` for torch's intra-op pool and why, in words a user can act on."""

    threads: int
    reason: str


def _quota_cores(root: Path = CGROUP) -> float | None:
    """The cgroup CPU quota in cores (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), None when unlimited."""
    try:
        if (root / "cpu.max").is_file():
            quota, period = (root / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: every core
        return set(range(os.cpu_count() or 1))


def usable_cores() -> tuple[int, bool]:
    """(cores this process may use, whether a cgroup quota is what limits them)."""
    cores = len(_affinity())
    quota = _quota_cores()
    if quota is not None and math.ceil(quota) < cores:
        return max(1, math.ceil(quota)), True
    return max(1, cores), False


def _cpu_seconds(cpus: set[int]) -> tuple[float, float] | None:
    """(busy, total) CPU seconds of ``cpus`` since boot; None where the system does not say.
    Idle and I/O wait are not busy; a guest's time is already in ``user`` and ``nice``."""
    try:
        every = len(cpus) >= (psutil.cpu_count() or 0)
        times = [psutil.cpu_times()] if every else [t for i, t in enumerate(psutil.cpu_times(percpu=True)) if i in cpus]
    except (psutil.Error, OSError, NotImplementedError):
        return None
    busy = total = 0.0
    for t in times:
        spent = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        total += spent
        busy += spent - t.idle - getattr(t, "iowait", 0.0)
    return (busy, total) if total else None


def _cgroup_usage_s(root: Path = CGROUP) -> float | None:
    """CPU seconds the whole cgroup has used (v2 ``cpu.stat``, v1 ``cpuacct.usage``)."""
    try:
        if (root / "cpu.stat").is_file() and (root / "cpu.max").is_file():
            for line in (root / "cpu.stat").read_text().splitlines():
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        return int((root / "cpuacct" / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


def _tree_cpu_s(root: int) -> dict[int, float] | None:
    """CPU seconds (user + system) of process ``root`` and each of its living descendants, by pid;
    None where the system does not say."""
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except (psutil.Error, OSError):
        return None
    spent = {}
    for p in procs:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):  # it ended meanwhile
            continue
        except (psutil.Error, OSError):
            return None
        spent[p.pid] = t.user + t.system
    return spent


def _own_cpu_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds this process tree spent between two `_tree_cpu_s`: each process's growth (one
    that ended between them is left out, one that started counts whole)."""
    return sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in after.items())


def busy_elsewhere(window: float = SAMPLE_S, tries: int = 4) -> float | None:
    """How many cores other processes kept busy over the next ``window`` seconds (the CPU time of
    this process and of the processes it started left out); None where the system does not say.
    A process of ours that ends during the window takes its CPU time out of sight (Ray does not
    wait for its workers), so that window is sampled again, up to ``tries`` windows in all."""
    for _ in range(tries):
        busy, lost = _sample_busy(window)
        if not lost:
            break
    return busy


def _sample_busy(window: float) -> tuple[float | None, bool]:
    """(`busy_elsewhere` over one window, whether a process of ours ended during it)."""
    _, by_quota = usable_cores()
    tree, own, start = _tree_cpu_s(os.getpid()), time.process_time(), time.perf_counter()
    if by_quota:
        before = _cgroup_usage_s()
        time.sleep(window)
        after = _cgroup_usage_s()
        if before is None or after is None:
            return None, False
        cores_busy = (after - before) / (time.perf_counter() - start)
    else:
        cpus = _affinity()
        before = _cpu_seconds(cpus)
        time.sleep(window)
        after = _cpu_seconds(cpus)
        if before is None or after is None or after[1] == before[1]:
            return None, False
        cores_busy = (after[0] - before[0]) / (after[1] - before[1]) * len(cpus)  # busy share x cores
    now = _tree_cpu_s(os.getpid()) if tree is not None else None
    mine_s = _own_cpu_s(tree, now) if now is not None else time.process_time() - own  # unknown: this process
    mine = mine_s / (time.perf_counter() - start)
    return max(0.0, cores_busy - mine), now is not None and not tree.keys() <= now.keys()


def choose(cores: int | None = None, busy: float | None = -1.0, env=os.environ) -> ThreadChoice:
    """The thread count for this process now. ``cores`` and ``busy`` are measured when not given
    (``busy=None``: unknown)."""
    if env.get("OMP_NUM_THREADS", "").strip():
        try:
            n = int(env["OMP_NUM_THREADS"])
        except ValueError:
            n = 0
        if n >= 1:
            return ThreadChoice(n, f"OMP_NUM_THREADS={n} set in the environment")
    quota = False
    if cores is None:
        cores, quota = usable_cores()
    where = f"{cores} usable core{'s' * (cores != 1)}" + (" (a cgroup CPU quota)" if quota else "")
    if busy is not None and busy < 0:
        busy = busy_elsewhere()
    if busy is None:
        return ThreadChoice(cores, f"{where}; how busy they are is not known here")
    taken = min(cores, int(busy + 1 - BUSY_FROM))
    threads = max(1, cores - taken)
    return ThreadChoice(threads, f"{where}, {busy:.1f} kept busy by other processes")


_kept: tuple[float, ThreadChoice] | None = None


def use_threads() -> ThreadChoice:
    """Choose (or keep the choice of the last minute) and apply it to torch's intra-op pool."""
    global _kept
    import torch

    now = time.monotonic()
    if _kept is None or now - _kept[0] > KEEP_S:
        _kept = (now, choose())
    choice = _kept[1]
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    return choice
