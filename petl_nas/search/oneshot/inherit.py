"""A proposal scored with the supernet's own weights: each gate exactly open or shut, no training.

With exactly a selection's components open (`derive.Selection`) and every other shut, the
supernet computes that configuration with the weights it learned (a gate at 1 or 0 is the larger
or smaller module exactly: `tests/search/test_oneshot.py`). Its search-dev score is the weight-sharing
estimate of one-shot NAS: one evaluation instead of a training run. The knob search
(`knobs.py`) compares supernet runs by it; a proposal entering a study is still trained from
scratch and scored like every trial.
"""

from __future__ import annotations

import contextlib

import torch

from .derive import Selection
from .gates import CLOSED

OPEN = -CLOSED  # log α at which a gate's deterministic value is exactly 1


@contextlib.contextmanager
def only(net, selection: Selection):
    """``net`` with exactly ``selection`` open (UniPELT choices: the gated forms it derives);
    every gate's parameters are back as they were on exit."""
    saved = [u.gate.raw.detach().clone() for u in net.units]
    try:
        for i, u in enumerate(net.units):
            value = torch.full_like(u.gate.raw, CLOSED)
            if u.gate_of is None:
                value[selection.kept.get(i, [])] = OPEN
            elif u.gate_of in selection.gated:
                value[:] = OPEN
            u.gate.set_log_alpha(value)
        yield net
    finally:
        for u, raw in zip(net.units, saved):
            u.gate.load_raw(raw)


def inherited_score(net, selection: Selection, evaluate) -> float:
    """``evaluate(model)`` (a search-dev score) of ``net`` with exactly ``selection`` open."""
    with only(net, selection):
        return float(evaluate(net.model))


__all__ = ["OPEN", "inherited_score", "only"]
