"""Counting the aten operations a block of code dispatches: the CPU stand-in for a GPU's kernel
count (`bench/ops_per_step.py`; tests that check a change removed products or kernels)."""

from __future__ import annotations

import collections

from torch.utils._python_dispatch import TorchDispatchMode


class Operations(TorchDispatchMode):
    """Counts the aten operations dispatched inside the block, by name (``mm``, ``addmm``, ...)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


__all__ = ["Operations"]
