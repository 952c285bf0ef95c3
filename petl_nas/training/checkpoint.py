"""Training state at an epoch boundary: what `train.train` saves so a killed run resumes where it was.

A state holds the trainable tensors (by name), the optimiser, the learning-rate schedule, the loss
scaler, the random generators (dropout and the one-shot gates draw from them) and the history of
evaluations so far, with the step and epoch reached. Each epoch's data order is a function of the
seed and the epoch (`train.epoch_seed`), so a run resumed from a state trains exactly as the
uninterrupted run would have from there. `save` writes the file beside its final name and renames
it over, so a run killed while saving leaves the previous state whole.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError


def capture(model: nn.Module, opt, sched, scaler, step: int, epoch: int, history: list[dict]) -> dict:
    """The training state after ``epoch`` epochs (``step`` optimiser steps)."""
    state = {
        "step": step,
        "epoch": epoch,
        "history": [dict(h) for h in history],
        "params": {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad},
        "opt": opt.state_dict(),
        "sched": sched.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict, model: nn.Module, opt, sched, scaler) -> tuple[int, int, list[dict]]:
    """Put ``state`` back into the model (already on its device) and the optimiser; (step, epoch, history)."""
    params = dict(model.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    if set(state["params"]) != trainable:
        missing, extra = sorted(trainable - set(state["params"])), sorted(set(state["params"]) - trainable)
        raise ValueError(f"the checkpoint does not fit this model (missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        for name, value in state["params"].items():
            params[name].copy_(value)
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state and torch.cuda.is_available():  # saved where more GPUs were visible: those there are
        for device, rng in enumerate(state["cuda_rng"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(rng, device)
    return state["step"], state["epoch"], [dict(h) for h in state["history"]]


def save(state: dict, path: str | Path) -> None:
    """Write ``state`` to ``path`` whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    torch.save(state, part)
    os.replace(part, path)


def load(path: str | Path) -> dict | None:
    """The state saved at ``path``, or None when there is none.

    Read with ``weights_only=True``: a state is tensors, numbers, strings and containers, so a file
    that needs anything else to unpickle (code, a crafted object) is refused, never run."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:  # code to run, or not torch's format
        raise ConfigError(
            f"{path}: not a training state petl-nas can load safely ({type(e).__name__}); "
            f"nothing in it was run. Delete it to start that run over"
        ) from None


__all__ = ["capture", "restore", "save", "load"]
