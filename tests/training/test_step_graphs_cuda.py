"""CUDA graphs for a run's steps on a GPU (skipped without one; run on the device machine).

A replayed step must train exactly what the eager step trains (fp32, no dropout: same losses,
same weights, through shape changes and the learning-rate schedule); every preset must record in a
real run (bf16 autocast, length-bucketed batches padded to a multiple of 8); a step that cannot
be recorded (it waits for the GPU) must fall back to eager steps, train the same (dropout drawing
the same numbers) and say why.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config, tiny_model
from test_step_graphs import optimizer_and_schedule, split
from torch import nn

from petl_nas import apply_petl, preset, preset_names
from petl_nas.tasks import get_task
from petl_nas.training.loop import Recipe, train
from petl_nas.training.step_graphs import LENGTH_MULTIPLE, WARMUP, GraphedSteps, prepare_optimizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def no_dropout_model(name: str) -> nn.Module:
    model = apply_petl(
        tiny_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), preset(name, tiny_config())
    )
    return model.to(CUDA).train()


def batches(n: int = 10) -> list[dict]:
    """Three shapes (widths 8 and 16, a short batch of width 8), in a changing order."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        rows, width = (2, 8) if i == 6 else (4, (8, 16)[i % 2])
        out.append(
            {
                "input_ids": torch.randint(3, 120, (rows, width), generator=g),
                "attention_mask": torch.ones(rows, width, dtype=torch.long),
                "labels": torch.randint(0, 2, (rows,), generator=g),
            }
        )
        out[-1]["attention_mask"][0, width - 3 :] = 0
    return out


def run(name: str, graphed: bool, waits: bool = False, dropout: bool = False):
    """Train ``name`` on `batches` with one optimiser step each: (losses, weights, runner)."""
    model = (
        apply_petl(tiny_model(), preset(name, tiny_config())).to(CUDA).train() if dropout else no_dropout_model(name)
    )
    torch.manual_seed(0)
    params = [p for p in model.parameters() if p.requires_grad]
    opt, sched = optimizer_and_schedule(model, total=10, warmup=2)

    def optimise(batch):
        loss = model(**batch).loss
        if waits:
            float(loss)  # reads the loss on the host: cannot be recorded
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    runner = None
    if graphed:
        prepare_optimizer(opt, CUDA, graphed=True)
        runner = GraphedSteps(optimise, params, CUDA)
    losses = []
    for batch in batches():
        if runner is not None:
            loss = runner(batch)
        else:
            loss = optimise({k: v.to(CUDA) for k, v in batch.items()})
            opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        sched.step()
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return losses, weights, runner


@pytest.mark.parametrize("name", ["lora", "unipelt_apl", "compacter", "prefix", "houlsby"])
def test_replayed_steps_train_what_eager_steps_train(name):
    eager_losses, eager_weights, _ = run(name, graphed=False)
    losses, weights, runner = run(name, graphed=True)
    assert runner.info.why_not is None
    assert runner.info.eager_steps == WARMUP and runner.info.replays == 10 - WARMUP
    assert sorted(map(tuple, runner.info.shapes)) == [(2, 8), (4, 8), (4, 16)]
    assert losses[0] != losses[-1]  # it trained
    torch.testing.assert_close(losses, eager_losses, rtol=1e-4, atol=1e-5)
    for n, w in eager_weights.items():
        torch.testing.assert_close(weights[n], w, rtol=1e-4, atol=1e-5)


def test_a_step_that_waits_for_the_gpu_falls_back_to_eager_steps_and_says_why():
    """With dropout: a failed recording leaves torch's generator in capture mode, where the next
    dropout outside a graph fails; the fallback restores it, at the offset it had."""
    eager_losses, eager_weights, _ = run("lora", graphed=False, dropout=True)
    losses, weights, runner = run("lora", graphed=True, waits=True, dropout=True)
    assert runner.info.why_not.startswith("recording failed") and runner.info.replays == 0
    assert runner.info.eager_steps == 10 and not runner.graphs
    torch.testing.assert_close(losses, eager_losses, rtol=1e-4, atol=1e-5)
    for n, w in eager_weights.items():
        torch.testing.assert_close(weights[n], w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_records_in_a_bf16_run(name):
    rows = split(lengths=tuple(1 + (7 * i) % 23 for i in range(24)))
    data = type("D", (), {"train": rows, "dev": rows})()
    model = apply_petl(tiny_model(), preset(name, tiny_config()))
    result = train(
        model,
        data,
        get_task("demo_sentiment"),
        Recipe(lr=1e-2, epochs=3, batch_size=4, length_buckets=2, cuda_graphs=True),
        device="cuda",
    )
    graphs = result.graphs
    assert graphs["used"] and graphs["why_not"] is None, graphs
    assert graphs["eager_steps"] == WARMUP and graphs["replays"] == result.steps - WARMUP
    assert all(width % LENGTH_MULTIPLE == 0 for _, width in graphs["shapes"])
    assert result.steps_timed == result.steps - len(graphs["shapes"])  # each recording's step left out
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in result.history)
