"""``torch.compile`` for a run's model (``Recipe.compile``, ``fidelity.compile``).

On a GPU a PETL training step is bound by the host: Python and one launch per small kernel (a
Compacter or UniPELT step launches 2-3× the frozen model's kernels, `bench/step_time.py`).
Compiling fuses the small element-wise kernels into few, and ``reduce-overhead`` also replays the
step's kernels as CUDA graphs, launched at once. Compiling costs time before the first step and
again for each new input shape (length-bucketed batches have many). Measured on one H100: a
compiled step took 0.13-0.23× its eager time, but a 320-step trial 5× longer; on 2 CPU cores,
where a step is bound by its matmuls, it gained nothing (`bench/results/README.md`). So it is off
by default, and meant for long runs on a GPU (`petl-nas train --compile`). For trials,
``fidelity.cuda_graphs`` (`step_graphs`) removes the host bound without compiling.

Modes are torch's own: ``off`` (the default: eager), ``default``, ``reduce-overhead``,
``max-autotune``. On a CPU the last two behave like ``default`` (no CUDA graphs there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


def check_mode(mode: str) -> str:
    """``mode`` if it is one of `COMPILE_MODES`, else ValueError naming them."""
    if mode not in COMPILE_MODES:
        hint = (
            " (YAML reads a bare off, on, yes or no as true or false: write 'off' in quotes)"
            if isinstance(mode, bool)
            else ""
        )
        raise ValueError(f"compile: expected one of {', '.join(COMPILE_MODES)}, got {mode!r}{hint}")
    return mode


def graphs_compiled() -> int | None:
    """How many graphs torch.compile has compiled in this process so far (Dynamo's own count), or
    None where this torch does not keep it (`step_clock`: a step at a new shape may compile)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - an internal that may move
        return None


def fresh_compiled(model: nn.Module, mode: str) -> nn.Module:
    """`compiled`, after dropping every graph compiled before in this process: a worker runs one
    run at a time, and the graphs of earlier runs (each configuration its own) would only count
    towards Dynamo's recompile limit, past which it runs the model eagerly without saying so."""
    if check_mode(mode) != "off":
        import torch

        torch.compiler.reset()
    return compiled(model, mode)


def compiled(model: nn.Module, mode: str) -> nn.Module:
    """``model`` compiled for ``mode`` (``model`` itself for ``off``). The result runs the compiled
    code and shares ``model``'s parameters and train/eval state; ``model`` stays eager for what comes
    after the run (merging LoRA for deployment, saving, measuring latency), which would otherwise
    recompile."""
    if check_mode(mode) == "off":
        return model
    import torch

    # Dynamo shares compiled code between instances of one model class and by default does not
    # guard on module hooks, which is where PETL modules live: a second model of the same class
    # compiled in one process ran the first one's graph (a MAM model computed as the frozen floor).
    # Guarding on hooks gives each configuration its own graph (tests/training/test_compiling.py).
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    return torch.compile(model, mode=None if mode == "default" else mode)


__all__ = ["COMPILE_MODES", "check_mode", "compiled", "fresh_compiled", "graphs_compiled"]
