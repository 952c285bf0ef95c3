"""Precision: trained tensors keep fp32 masters; the frozen body may compute in half precision.

A half-precision checkpoint (transformers 5 loads ``dtype="auto"``: a bf16 checkpoint stays bf16)
keeps its body in that dtype, which halves its memory. Everything that trains (PETL modules, the
task head, BitFit biases, trained LayerNorms) is kept in fp32 by `inject.apply_petl`: an Adam step
of 1e-5 on a bf16 weight of 0.02 is below bf16's resolution there and would vanish. Forward passes
then run under `autocast_for`, which casts each matmul's operands to the body's dtype while the
gradients land on the fp32 masters; fp16 adds loss scaling (`grad_scaler_for`).

A run may ask for a precision (`use_precision`, from ``Recipe.precision``): ``auto`` is the above
(bf16 on a GPU that computes it natively, Ampere or newer; full precision for an fp32 body on a CPU
or an older GPU); ``native`` is bf16 wherever the device computes it natively, a CPU with
AVX512-BF16 or AMX too (a new study's default: `study.experiment.NEW_STUDY_PRECISION`), full
precision elsewhere; ``bf16`` computes the matmuls in bf16 on
any device (on a CPU with native bf16, AVX512-BF16 or AMX, a training step is about twice as fast;
elsewhere it is emulated and slower); ``fp32`` keeps an fp32 body in full precision on a GPU too.
"""

from __future__ import annotations

import contextlib
import functools

import torch

HALF = (torch.float16, torch.bfloat16)
PRECISIONS = ("auto", "native", "bf16", "fp32")
_ATTR = "petl_nas_precision"  # where `use_precision` leaves a model's choice for `compute_dtype`


def master_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype trained tensors keep: fp32 for a half-precision body, else the body's own."""
    return torch.float32 if dtype in HALF else dtype


def body_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the frozen floating-point tensors (fp32 when nothing is frozen)."""
    return next((p.dtype for p in model.parameters() if not p.requires_grad and p.is_floating_point()), torch.float32)


def use_precision(model: torch.nn.Module, precision: str) -> None:
    """Make ``model``'s forward passes compute in ``precision`` (one of `PRECISIONS`; see the module
    docstring). ValueError for another name, or for ``fp32`` on a half-precision body."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32" and body_dtype(model) in HALF:
        raise ValueError(
            f"precision: fp32 needs an fp32 checkpoint; this one is {body_dtype(model)} (use auto or bf16)"
        )
    setattr(model, _ATTR, precision)


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX512-BF16 or AMX; Linux's CPU flags).
    Where it does not, ``precision: bf16`` still runs, emulated and slower than fp32."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def compute_dtype(model: torch.nn.Module, device) -> torch.dtype | None:
    """The autocast dtype for ``model`` on ``device``: the body's half precision wherever it runs;
    bf16 when `use_precision` asked for it, for ``native`` on a CPU that computes it natively, or
    (``auto`` and ``native``) for an fp32 body on a GPU that supports it; None (full precision)
    otherwise."""
    body = body_dtype(model)
    if body in HALF:
        return body
    chosen = getattr(model, _ATTR, "auto")
    if chosen == "bf16":
        return torch.bfloat16
    if chosen == "fp32":
        return None
    if chosen == "native" and torch.device(device).type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    if torch.device(device).type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.bfloat16  # native only: a pre-Ampere GPU (V100, T4) emulates it, slower
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


__all__ = [
    "master_dtype",
    "body_dtype",
    "compute_dtype",
    "autocast_for",
    "grad_scaler_for",
    "use_precision",
    "cpu_has_native_bf16",
    "HALF",
    "PRECISIONS",
]
