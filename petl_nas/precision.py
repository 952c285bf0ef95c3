"""Precision: trained tensors keep fp32 masters; the frozen body may compute in half precision.

A half-precision checkpoint (transformers 5 loads ``dtype="auto"``: a bf16 checkpoint stays bf16)
keeps its body in that dtype, which halves its memory. Everything that trains (PETL modules, the
task head, BitFit biases, trained LayerNorms) is kept in fp32 by `inject.apply_petl`: an Adam step
of 1e-5 on a bf16 weight of 0.02 is below bf16's resolution there and would vanish. Forward passes
then run under `autocast_for`, which casts each matmul's operands to the body's dtype while the
gradients land on the fp32 masters; fp16 adds loss scaling (`grad_scaler_for`).
"""

from __future__ import annotations

import contextlib

import torch

HALF = (torch.float16, torch.bfloat16)


def master_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype trained tensors keep: fp32 for a half-precision body, else the body's own."""
    return torch.float32 if dtype in HALF else dtype


def body_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the frozen floating-point tensors (fp32 when nothing is frozen)."""
    return next((p.dtype for p in model.parameters() if not p.requires_grad and p.is_floating_point()),
                torch.float32)


def compute_dtype(model: torch.nn.Module, device) -> torch.dtype | None:
    """The autocast dtype for ``model`` on ``device``: the body's half precision wherever it runs;
    bf16 for an fp32 body on a GPU that supports it; None (full precision) otherwise."""
    body = body_dtype(model)
    if body in HALF:
        return body
    if torch.device(device).type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def autocast_for(model: torch.nn.Module, device):
    """A context for forward passes of ``model`` on ``device`` (see `compute_dtype`)."""
    dtype = compute_dtype(model, device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def grad_scaler_for(model: torch.nn.Module, device) -> torch.amp.GradScaler:
    """Loss scaling when the compute dtype is fp16 (small gradients underflow there); a no-op otherwise."""
    return torch.amp.GradScaler(torch.device(device).type, enabled=compute_dtype(model, device) == torch.float16)


__all__ = ["master_dtype", "body_dtype", "compute_dtype", "autocast_for", "grad_scaler_for", "HALF"]
