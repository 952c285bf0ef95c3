"""The trial trainer: one readable loop from a PETL-applied model and encoded data to a score.

AdamW on the trainable parameters (fp32 masters), linear warm-up then linear decay, gradient
clipping; forward passes under `precision.autocast_for` (bf16 on a GPU, the checkpoint's own half precision for
a half-precision body, with loss scaling for fp16; ``Recipe.precision`` may ask for bf16 on a CPU too, or full
precision on a GPU). Generation tasks train with the label-smoothed loss (`seq2seq.seq2seq_loss`) and are scored
by beam search (`decode`), or by token accuracy for a causal LM (`causal_lm`). It evaluates ``evals_per_epoch``
times per epoch on the scoring split, hands each evaluation to
``report`` (the search's intermediate values, where a scheduler may stop the trial),
and returns the best and last scores, wall time and peak memory. A non-finite loss stops the trial
with `NonFiniteLoss`. On a GPU, ``Recipe.cuda_graphs`` replays each training step as a CUDA graph
recorded once per batch shape (`step_graphs`). Its CPU thread count is chosen from the cores
other processes leave free (`threads`).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..core.head import start_regression_at_mean
from ..core.inject import parameter_families
from ..core.precision import autocast_for, grad_scaler_for, use_precision
from ..tasks.significance import standard_error
from . import checkpoint
from .compiling import check_mode, fresh_compiled, graphs_compiled
from .costs import MemoryProbe
from .frozen import FrozenReuse
from .recipe import Recipe
from .step_clock import StepClock, first_of_each_shape
from .step_graphs import LENGTH_MULTIPLE, GraphedSteps, GraphInfo, prepare_optimizer, why_not
from .threads import use_threads


@dataclass
class TrainResult:
    score: float  # the task's main metric at the best evaluation
    last_score: float
    metrics: dict  # all metrics at the best evaluation
    history: list[dict] = field(default_factory=list)
    steps: int = 0
    wall_s: float = 0.0
    peak_mem_mb: float = 0.0  # the run's own peak (costs.MemoryProbe), not the whole process's
    train_step_ms: float = (
        0.0  # mean time of one optimiser step (CPU time on a CPU), what is not a step's left out (`step_clock`)
    )
    steps_timed: int = 0  # the steps that mean is over (this call's: not a checkpoint's before it)
    frozen: dict | None = None  # what frozen-layer reuse did (`frozen.ReuseInfo`), when it applied
    graphs: dict | None = None  # what CUDA graphs did (`step_graphs.GraphInfo`), when asked for
    threads: int = 0  # torch's CPU threads for this run (`threads.use_threads`)
    row_predictions: list = field(default_factory=list)  # per evaluation, as `history`: its per-row
    #   predictions (`evaluate`'s ``per_row``); None for one a resumed checkpoint recorded without them
    report_metrics: dict | None = None  # ``data.report``'s metrics after the last step, where given

    def rows_of(self, scored: dict):
        """The per-row predictions of the evaluation ``scored`` (one of ``history``), or None."""
        at = next((i for i, m in enumerate(self.history) if m is scored), None)
        return self.row_predictions[at] if at is not None and at < len(self.row_predictions) else None


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite."""


def n_evaluations(n_train: int, recipe: Recipe) -> int:
    """How many evaluations (reports) a run of ``recipe`` on ``n_train`` examples makes."""
    steps_per_epoch = math.ceil(n_train / recipe.batch_size)
    total = _total_steps(steps_per_epoch, recipe)
    if recipe.evals_per_epoch == 0:
        return 1
    every = max(1, steps_per_epoch // max(1, recipe.evals_per_epoch))
    return total // every + (total % every > 0)


def _total_steps(steps_per_epoch: int, recipe: Recipe) -> int:
    total = max(1, math.ceil(steps_per_epoch * recipe.epochs))
    return min(total, recipe.max_steps) if recipe.max_steps else total


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffling seed of one epoch, distinct for every (seed, epoch): with ``seed + epoch``, seed
    k's epoch 1 would repeat seed k+1's epoch 0 and two seeds would share all but one data order."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def _linear_schedule(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def evaluate(
    model: nn.Module,
    split,
    task,
    batch_size: int,
    device,
    max_rows: int | None = None,
    reuse: FrozenReuse | None = None,
    per_row: list | None = None,
) -> dict:
    """Metrics of ``task`` on an encoded split, or on its first ``max_rows`` rows (no gradient, eval
    mode); ``reuse`` feeds the frozen layers' cached output where it has it for ``split``. A
    ``per_row`` list gets the per-row predictions appended, one value per row in the split's order
    (class ids, or scores), for the metric's paired bootstrap over rows (none for generation)."""
    if task.kind == "seq2seq":
        from ..tasks.decode import evaluate_generation

        with autocast_for(model, device):
            return evaluate_generation(model, split, task, batch_size, device, max_rows)
    if task.kind == "causal_lm":
        from ..tasks.causal_lm import evaluate_lm

        with autocast_for(model, device):
            return evaluate_lm(model, split, task, batch_size, device, max_rows)
    split = split.head(max_rows) if max_rows else split
    model.eval()
    order = split.by_length()  # batches of similar lengths: little padding to compute
    preds, refs = [], []
    with torch.no_grad(), autocast_for(model, device):
        for rows, batch in _with_rows(split, reuse, batch_size, order=order):
            labels = batch.pop("labels")
            with reuse.feeding(split, rows) if reuse is not None else contextlib.nullcontext():
                logits = model(**{k: v.to(device) for k, v in batch.items()}).logits.float()
            preds.append(logits.cpu().numpy())
            refs.append(labels.numpy())
    back = np.argsort(order.numpy())  # rows in their stored order again
    preds, refs = np.concatenate(preds)[back], np.concatenate(refs)[back]
    metrics = task.compute_metrics(preds, refs)
    if per_row is not None:
        per_row.append(preds.argmax(-1) if task.kind == "classification" and preds.ndim == 2 else preds.ravel())
    se = standard_error(task, preds, refs)  # the main metric's standard error over these rows
    return {**metrics, "se": se} if se is not None else metrics


def training_loss(model: nn.Module, batch: dict, task) -> torch.Tensor:
    """The loss a step minimises: label-smoothed cross-entropy for seq2seq, the model's own otherwise."""
    if task.kind == "seq2seq":
        from ..tasks.seq2seq import seq2seq_loss

        return seq2seq_loss(model, batch, task.seq2seq.label_smoothing)
    return model(**batch).loss  # [] cross-entropy, MSE (num_labels=1) or next-token CE


def param_groups(model: nn.Module, params: list, recipe: Recipe) -> list[dict]:
    """AdamW groups: weight decay on matrices only (not biases, LayerNorms, gates' scalars); each
    family of parameters at its multiple of the recipe's rate (`PetlConfig.lr_mult`: the head's
    ``head_lr_mult``, the others' ``lr_mults``). A configuration at one rate has the two groups it
    always had (a saved optimizer state resumes), the head after the rest."""
    config = getattr(getattr(model, "petl", None), "config", None)
    families = parameter_families(model) if config is not None else {}
    mult_of = {id(p): config.lr_mult(families.get(id(p), "head")) if config is not None else 1.0 for p in params}
    head = {id(p) for p in params if families.get(id(p)) == "head"}
    mults = list(
        dict.fromkeys(
            [mult_of[id(p)] for p in params if id(p) not in head] + [mult_of[id(p)] for p in params if id(p) in head]
        )
    )
    groups = []
    for mult in mults:
        for decays in (True, False):
            members = [p for p in params if mult_of[id(p)] == mult and (p.ndim >= 2) == decays]
            if members:
                groups.append(
                    {"params": members, "lr": recipe.lr * mult, "weight_decay": recipe.weight_decay if decays else 0.0}
                )
    return groups


def adamw(groups: list, lr: float) -> torch.optim.AdamW:
    """AdamW, fused (one kernel per step instead of a loop over tensors) where torch has it: every
    parameter a float tensor on a CPU or a CUDA device. A PETL model has many small tensors: for
    UniPELT (APL) on MiniLM's shape (103 tensors) the loop took 22-28 ms a step on one CPU core, the
    fused step 4 ms (`bench/optimizer_step.py`)."""
    params = [p for g in groups for p in g["params"]] if groups and isinstance(groups[0], dict) else list(groups)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(groups, lr=lr, fused=True if fused else None)


class LossWatch:
    """Raises `NonFiniteLoss` for a NaN or infinite training loss without a host-device sync per step.

    Reading a loss on the host (``torch.isfinite(loss)`` in an ``if``) waits for the GPU to finish
    the step, so the host cannot queue the next one meanwhile. The watch keeps each step's loss
    on the device and reads them together in `check`: at every evaluation, at the end of every
    epoch and every ``every`` steps. A bad loss is still named with its own step; the steps in
    between only change a run that then fails."""

    def __init__(self, every: int = 32):
        self.every, self.first_step, self.pending = every, 0, []

    def see(self, loss: torch.Tensor, step: int) -> None:
        """Keep ``loss`` (a copy: CUDA graphs reuse their output's memory) of optimiser step ``step``."""
        if not self.pending:
            self.first_step = step
        self.pending.append(loss.detach().float().clone())
        if len(self.pending) >= self.every:
            self.check()

    def check(self) -> None:
        if not self.pending:
            return
        losses, self.pending = torch.stack(self.pending), []
        bad = (~torch.isfinite(losses)).nonzero()
        if len(bad):
            i = int(bad[0, 0])
            raise NonFiniteLoss(f"loss is {losses[i].item()} at step {self.first_step + i}")


def to_device(batch: dict, device: torch.device) -> dict:
    """A batch's tensors on ``device``; to a GPU through pinned memory without waiting (a plain copy
    from pageable memory synchronises the host with the GPU once per batch)."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def train(
    model: nn.Module,
    data,
    task,
    recipe: Recipe,
    device="cpu",
    report: Callable[[int, dict, bool], None] | None = None,
    progress: bool = False,
    regularizer: Callable[[], torch.Tensor] | None = None,
    resume: dict | None = None,
    on_epoch: Callable[[dict], None] | None = None,
) -> TrainResult:
    """Train ``model`` (PETL already applied) on ``data.train``; score on ``data.dev``. A new
    regression head starts at the training labels' mean (`head.start_regression_at_mean`).

    Args:
        data: encoded splits with ``train`` and ``dev`` (each exposes ``batches(size, shuffle, seed)``
            and ``len()``).
        report: called after each evaluation with (evaluation index from 1, metrics, is_last).
        progress: show a progress bar with the loss and the last evaluation's metric.
        regularizer: a term added to every step's loss, computed after the forward pass (the
            one-shot supernet's count penalty).
        resume: a state from `checkpoint.capture` to go on from (a killed run's last epoch).
        on_epoch: called with the training state (`checkpoint.capture`) after every epoch.
    """
    start = time.perf_counter()
    threads = use_threads()  # chosen from the free cores, not torch's one per core
    device = torch.device(device)
    memory = MemoryProbe(device).start()
    net = _prepared(model, data, task, recipe, device)  # what the steps and evaluations call
    steps_per_epoch = math.ceil(len(data.train) / recipe.batch_size)
    total = _total_steps(steps_per_epoch, recipe)
    o = optimisation(model, net, task, recipe, device, total, regularizer)
    step, epoch, history = 0, 0, []
    if resume is not None:
        step, epoch, history = checkpoint.restore(resume, model, o.opt, o.sched, o.scaler)
        prepare_optimizer(o.opt, device, graphed=False)  # a state saved by a graphed run holds tensor rates
    reuse = _frozen_reuse(model, data, task, recipe, device)
    train_mode = reuse.train_mode if reuse is not None else model.train
    graphs, graph_info = _graphed_steps(
        o.optimise, o.params, o.opt, device, recipe, o.scaler, regularizer, reuse, _has_layerdrop(model)
    )
    padding = {"multiple": LENGTH_MULTIPLE} if graphs is not None else {}  # few shapes: few graphs to record
    eval_every = max(1, steps_per_epoch // recipe.evals_per_epoch) if recipe.evals_per_epoch else total + 1
    clock = _step_clock(graphs, recipe, device)
    bar = ProgressBar(progress, total, step, task.main_metric)
    evals = Evaluations(net, data, task, recipe, device, reuse, report, bar, history)
    watch = LossWatch()
    with contextlib.closing(reuse) if reuse is not None else contextlib.nullcontext():
        while step < total:
            train_mode()
            seed = epoch_seed(recipe.seed, epoch)
            order = _epoch_order(data.train, recipe, seed)
            for rows, batch in _with_rows(
                data.train, reuse, recipe.batch_size, shuffle=True, seed=seed, order=order, **padding
            ):
                with clock.step(batch):
                    loss = _one_step(o, graphs, reuse, data.train, rows, batch, device)
                watch.see(loss, step)
                o.sched.step()
                step += 1
                bar.stepped(step, loss, history)
                if step % eval_every == 0 or step == total:
                    watch.check()
                    step_loss = loss.item()  # before evaluating: CUDA graphs reuse the step's output memory
                    with clock.aside():
                        evals(step, total, step / steps_per_epoch, step_loss)
                        train_mode()
                if step >= total:
                    break
            epoch += 1
            watch.check()
            if on_epoch is not None:
                with clock.aside():
                    on_epoch(checkpoint.capture(model, o.opt, o.sched, o.scaler, step, epoch, history))
    bar.close()
    measured = dict(wall_s=time.perf_counter() - start, peak_mem_mb=memory.peak_mb(), threads=threads.threads)
    return _result(evals, task.main_metric, step, clock, reuse, graph_info, **measured)


def _epoch_order(split, recipe: Recipe, seed: int):
    """The rows' order for one epoch where batches are bucketed by length (None: shuffled plainly)."""
    return split.bucketed_order(recipe.batch_size, seed, recipe.length_buckets) if recipe.length_buckets else None


def _one_step(o: Optimisation, graphs, reuse: FrozenReuse | None, split, rows, batch: dict, device) -> torch.Tensor:
    """One optimiser step on ``batch``: replayed from its recorded graph, else run here with the
    frozen layers' cached output fed in (``reuse``) and the gradients cleared after."""
    if graphs is not None:
        return graphs(batch)  # recorded once per shape, then replayed
    feed = reuse.feeding(split, rows) if reuse is not None else contextlib.nullcontext()
    loss = o.optimise(to_device(batch, device), feed)
    o.opt.zero_grad(set_to_none=True)
    return loss


def _result(
    evals: Evaluations, metric: str, steps: int, clock: StepClock, reuse, graph_info, **measured
) -> TrainResult:
    """The run's result: its best evaluation's score and metrics, the last's score, the history and
    what was measured (``measured``: wall time, peak memory, threads)."""
    best = max(evals.history, key=lambda m: m[metric])
    return TrainResult(
        score=best[metric],
        last_score=evals.history[-1][metric],
        metrics=best,
        history=evals.history,
        steps=steps,
        train_step_ms=clock.ms_per_step(),
        steps_timed=clock.steps_timed(),
        frozen=reuse.info.to_dict() if reuse is not None else None,
        graphs=graph_info.to_dict() if graph_info is not None else None,
        row_predictions=evals.row_predictions,
        report_metrics=evals.reported,
        **measured,
    )


def _prepared(model: nn.Module, data, task, recipe: Recipe, device) -> nn.Module:
    """``model`` seeded, on ``device`` at the recipe's precision, a new regression head at the
    training labels' mean; returns what the steps call (compiled, or ``model``, which stays eager)."""
    torch.manual_seed(recipe.seed)
    if task.kind == "regression" and len(data.train):
        start_regression_at_mean(model, float(data.train.labels.float().mean()))
    if check_mode(recipe.compile) != "off" and recipe.frozen_cache_mb:
        raise ValueError(
            "compile and frozen_cache_mb cannot be combined: the cached layers' per-batch "
            "feeding would recompile the model at every step (use one of them)"
        )
    model.to(device)
    use_precision(model, recipe.precision)
    return fresh_compiled(model, recipe.compile)


def _has_layerdrop(model: nn.Module) -> bool:
    """Whether the model drops layers at random while training (BART-likes' encoder_layerdrop, ...):
    drawn on the host, so its steps cannot be graphed."""
    hf_config = getattr(model, "config", None)
    return hf_config is not None and any(v for k, v in hf_config.to_dict().items() if k.endswith("layerdrop"))


@dataclass
class Optimisation:
    """What a run optimises with: the trained parameters, AdamW over their groups, the warm-up then
    linear schedule, the loss scaler, and ``optimise(batch, feed)``: one step on a batch already on
    the device (the gradients left set)."""

    params: list
    opt: torch.optim.Optimizer
    sched: object
    scaler: object
    optimise: Callable


def optimisation(model, net, task, recipe: Recipe, device, total: int, regularizer=None) -> Optimisation:
    """The optimiser, schedule and step of a run of ``total`` steps (`Optimisation`); ``net`` is what
    the step calls (compiled or ``model``), ``regularizer`` a term added to every step's loss."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = adamw(param_groups(model, params, recipe), recipe.lr)
    warmup = max(1, int(recipe.warmup_ratio * total))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _linear_schedule(s, total, warmup))
    scaler = grad_scaler_for(model, device)

    def optimise(batch: dict, feed=contextlib.nullcontext()) -> torch.Tensor:
        with autocast_for(model, device), feed:
            loss = training_loss(net, batch, task)
            if regularizer is not None:
                loss = loss + regularizer()
        if loss.grad_fn is None:  # LayerDrop (M2M100 trains with it) skipped every layer holding PETL
            return loss  # modules: nothing depends on a trained parameter, nothing to step
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(params, recipe.max_grad_norm)
        scaler.step(opt)
        scaler.update()
        return loss

    return Optimisation(params, opt, sched, scaler, optimise)


def _step_clock(graphs, recipe: Recipe, device) -> StepClock:
    """The clock of the training steps, which leaves out the steps that record or compile."""
    if graphs is not None:  # a new shape is recorded: a one-off cost, always
        return StepClock(device, graphs.will_record)
    if recipe.compile != "off":  # a new shape may compile (not once a graph is dynamic)
        return StepClock(device, first_of_each_shape(), graphs_compiled)
    return StepClock(device)


class ProgressBar:
    """A run's progress bar (``enabled``: tqdm) with the loss and the last evaluation's metric;
    nothing at all when disabled."""

    def __init__(self, enabled: bool, total: int, initial: int, metric: str):
        self.metric, self.total, self.bar = metric, total, None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def stepped(self, step: int, loss: torch.Tensor, history: list[dict]) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        if step % 25 == 1 or step == self.total:  # reading the loss waits for the GPU: not every step
            self.bar.set_postfix(
                loss=f"{loss.item():.4f} (step {step})",  # read every 25th
                **({self.metric: f"{history[-1][self.metric]:.4f}"} if history else {}),
            )

    def scored(self, step: int, step_loss: float, metrics: dict) -> None:
        """The bar ends on the score the run reports."""
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{step_loss:.4f} (step {step})", **{self.metric: f"{metrics[self.metric]:.4f}"})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass
class Evaluations:
    """A run's evaluations on its dev split: each appended to ``history`` with its rows'
    predictions, shown on the bar, passed to ``report``; after the last step, the report split's
    metrics (``reported``) where the data has one."""

    net: nn.Module
    data: object
    task: object
    recipe: Recipe
    device: object
    reuse: FrozenReuse | None
    report: Callable | None
    bar: ProgressBar
    history: list
    row_predictions: list = field(default_factory=list)
    reported: dict | None = None

    def __call__(self, step: int, total: int, epoch: float, step_loss: float) -> None:
        got: list = []
        r = self.recipe
        metrics = evaluate(
            self.net, self.data.dev, self.task, r.eval_batch_size, self.device, r.eval_rows, self.reuse, per_row=got
        )
        metrics.update(step=step, epoch=epoch, loss=step_loss)
        self.row_predictions += [None] * (len(self.history) - len(self.row_predictions))  # a checkpoint's
        self.history.append(metrics)
        self.row_predictions.append(got[0] if got else None)
        self.bar.scored(step, step_loss, metrics)
        if self.report is not None:
            self.report(len(self.history), metrics, step == total)
        if step == total and getattr(self.data, "report", None) is not None:
            self.reported = evaluate(
                self.net, self.data.report, self.task, r.eval_batch_size, self.device, self.data.report_rows, self.reuse
            )


def _with_rows(split, reuse: FrozenReuse | None, batch_size: int, **kw):
    """(row indices, batch) pairs; the indices only where frozen-layer reuse feeds by them (a split
    type of the caller's own need only have ``batches``)."""
    if reuse is not None:
        return split.row_batches(batch_size, **kw)
    return ((None, batch) for batch in split.batches(batch_size, **kw))


def _graphed_steps(optimise, params, opt, device, recipe: Recipe, scaler, regularizer, reuse, layerdrop: bool):
    """(`GraphedSteps` for this run's steps, its `GraphInfo`) when ``recipe.cuda_graphs`` asks and they
    can be recorded; else (None, a `GraphInfo` saying why not), or (None, None) when not asked."""
    if not recipe.cuda_graphs:
        return None, None
    why = why_not(
        device,
        scaled=scaler.is_enabled(),
        regularized=regularizer is not None,
        frozen_reuse=reuse is not None,
        compiled=recipe.compile != "off",
        layerdrop=layerdrop,
    )
    if why is not None:
        return None, GraphInfo(used=False, why_not=why)
    prepare_optimizer(opt, device, graphed=True)
    runner = GraphedSteps(optimise, params, device)
    return runner, runner.info


def _frozen_reuse(model: nn.Module, data, task, recipe: Recipe, device) -> FrozenReuse | None:
    """Frozen-layer reuse for this run (``recipe.frozen_cache_mb``), its splits cached where they fit."""
    if not recipe.frozen_cache_mb:
        return None
    reuse = FrozenReuse.prepare(model, task.kind, data.train, recipe.frozen_cache_mb, device)
    if reuse is not None:
        reuse.cache(data.train, "train", recipe.eval_batch_size)
        if recipe.eval_rows is None:  # a capped evaluation scores a subset, which runs every layer
            reuse.cache(data.dev, "dev", recipe.eval_batch_size)
        if getattr(data, "report", None) is not None and data.report_rows is None:
            reuse.cache(data.report, "report", recipe.eval_batch_size)  # as a final run caches it
    return reuse


__all__ = [
    "Recipe",
    "TrainResult",
    "NonFiniteLoss",
    "LossWatch",
    "train",
    "adamw",
    "evaluate",
    "training_loss",
    "n_evaluations",
    "epoch_seed",
    "to_device",
]
