"""Shared fixtures: tiny random BERT and RoBERTa classifiers (built from configs, CPU, milliseconds),
the tiny backbone experiments name (`TINY_BACKBONE`), an experiment builder (`tiny_experiment`),
one small real study that tests which only read a study share (`small_study`), a record of every
run trained from a point on (`trained_runs`), the repository's
folders (`REPO`, `SHARED_GLUE`), and a textbook prefix attention registered as `REFERENCE_ATTENTION`
to compare the ``petl`` one with. Tests mirror the package's folders (tests/core, tests/search,
...). The suite runs offline, with torch.compile's cache in a folder of its own that it removes.
``pytest -m "not slow"`` is the fast lane; `.ci/run` runs everything."""

from __future__ import annotations

import copy
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# torch.compile's cache: a folder of this run's, removed at its end (under /tmp/torchinductor_<user>
# each run from a new environment left ~40 MB of kernels behind; the one precompiled header, ~150 MB
# per environment, stays there: torch places it before any setting, and compiling without it cost
# test_compiling.py 326 s instead of 214 s). Set before torch is imported (importing its compiler
# fixes the folder); a cache the caller set is kept.
COMPILE_CACHE = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = COMPILE_CACHE = tempfile.mkdtemp(prefix="petl-nas-tests-inductor-")

import pytest
import torch
from transformers import (
    AttentionInterface,
    BertConfig,
    BertForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from petl_nas import ModuleSpec
from petl_nas.core.modules.head_attention import edits_of


def pytest_unconfigure(config):
    if COMPILE_CACHE is not None:
        shutil.rmtree(COMPILE_CACHE, ignore_errors=True)


REPO = Path(__file__).resolve().parent.parent
# Tests mirror the package's folders; a test reuses another's helpers by module name
# (`from test_search import experiment`) wherever either lives.
for _folder in sorted(p for p in Path(__file__).resolve().parent.iterdir() if p.is_dir() and p.name != "__pycache__"):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))
SHARED_GLUE = REPO.parent / "shared" / "data" / "glue"  # real GLUE rows, when ../shared is there
# The tiny random BERT an experiment or a record names as its backbone (built from a config).
TINY_BACKBONE = {
    "tiny": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "vocab_size": 400,
    }
}

TINY = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    num_labels=2,
)

BACKBONES = {
    "bert": (BertConfig, BertForSequenceClassification),
    "roberta": (RobertaConfig, RobertaForSequenceClassification),
}


def tiny_config(kind: str = "bert", **overrides):
    cfg_cls, _ = BACKBONES[kind]
    kw = dict(TINY, **overrides)
    if kind == "roberta":
        kw.update(pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=80)
    return cfg_cls(**kw)


def tiny_model(kind: str = "bert", seed: int = 0, **overrides):
    """A fresh tiny classifier in eval mode (deterministic for a given seed)."""
    _, model_cls = BACKBONES[kind]
    torch.manual_seed(seed)
    return model_cls(copy.deepcopy(tiny_config(kind, **overrides))).eval()


def batch(kind: str = "bert", seed: int = 1, n: int = 3, length: int = 9):
    """Random ids with one right-padded row, so padding masks matter."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, TINY["vocab_size"], (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[-1, length - 3 :] = 0
    ids[-1, length - 3 :] = 1 if kind == "roberta" else 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(params=sorted(BACKBONES))
def kind(request):
    return request.param


def reference_prefix_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_bias=None, **_
):
    """Textbook attention over [prefix; tokens]: eager softmax, float mask (eager_mask), T5's bias, GQA by
    repetition; the prefix indexed here, not through its per-forward cache."""
    e = edits_of(module)
    b = query.shape[0]
    if e is not None and e.prefix is not None:
        pk, pv = e.prefix.all_kv()[e.prefix_index]
        n = pk.shape[1]
        key = torch.cat([pk.expand(b, -1, -1, -1), key], 2)
        value = torch.cat([pv.expand(b, -1, -1, -1), value], 2)
        pad = lambda t: None if t is None else torch.nn.functional.pad(t, (n, 0))  # noqa: E731
        attention_mask, position_bias = pad(attention_mask), pad(position_bias)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    for extra in (position_bias, attention_mask):
        if extra is not None:
            scores = scores + extra
    return (scores.softmax(-1) @ value).transpose(1, 2), None


REFERENCE_ATTENTION = "reference_prefix"
AttentionInterface.register(REFERENCE_ATTENTION, reference_prefix_attention)
AttentionMaskInterface.register(REFERENCE_ATTENTION, eager_mask)


# Modules whose Δh is exactly 0 at initialisation (LoRA's B, an adapter's up projection start at 0).
ZERO_INIT = {
    "parallel adapter": ModuleSpec(form="adapter", position="ffn", size=4, init="lora"),
    "scaled PA at attn": ModuleSpec(
        form="adapter", position="attn", size=4, init="lora", composition="scaled", scale=4.0
    ),
    "sequential adapter": ModuleSpec(form="adapter", position="attn", insertion="sequential", size=4, init="lora"),
    "lora qkvo": ModuleSpec(form="lora", size=4, targets=("q", "k", "v", "o")),
    "lora ffn": ModuleSpec(form="lora", position="ffn", size=4),
    "mh_adapter": ModuleSpec(form="mh_adapter", size=4),
    "compacter": ModuleSpec(form="compacter", position="ffn", insertion="sequential", size=8, init="lora"),
    "vera qkvo": ModuleSpec(form="vera", size=8, targets=("q", "k", "v", "o")),
    "fourierft ffn, zero start": ModuleSpec(form="fourierft", position="ffn", size=16, init="lora", scale=10.0),
}


def _no_rates():
    from petl_nas.study.experiment import Rates

    return Rates(calibrate="off")


NO_RATES = _no_rates()  # one rate per trial, drawn from the space (tests not about measured rates)


def tiny_experiment(**changes):
    """A real experiment small enough for a test (~2 s a trial): the tiny backbone on the sentiment
    demo task, the small space, the local executor, no final re-evaluation; ``changes`` override
    any field (``fidelity=Fidelity(length_buckets=0, ...)`` replaces the whole fidelity)."""
    from petl_nas.study.experiment import Experiment, Fidelity, FinalEval

    fields = dict(
        name="tiny",
        rates=NO_RATES,
        backbone=TINY_BACKBONE,
        task="demo_sentiment",
        budget="5%",
        space="small",
        trials=2,
        presets="none",
        executor="local",
        fidelity=Fidelity(length_buckets=0, k=80, epochs=1, batch_size=16, max_length=16, search_dev=32),
        final=FinalEval(seeds=0, baselines=False),
    )
    return Experiment(**{**fields, **changes})


@pytest.fixture(scope="session")
def small_study(tmp_path_factory):
    """One real tiny search (local executor, ~10 s) with presets and a 2-seed re-evaluation, shared
    by the tests that only read a study: (storage URL, the study, its folder). Do not write to it."""
    import optuna

    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import Experiment, Fidelity, FinalEval

    d = tmp_path_factory.mktemp("small_study")
    exp = Experiment(
        rates=NO_RATES,
        name="rep",
        backbone=TINY_BACKBONE,
        task="demo_sentiment",
        budget="5%",
        space="small",
        trials=6,
        presets=["pfeiffer", "bitfit", "prefix"],
        executor="local",
        storage=f"sqlite:///{d}/study.db",
        fidelity=Fidelity(
            length_buckets=0, k=160, epochs=1, batch_size=32, max_length=24, evals_per_epoch=2, search_dev=64
        ),
        final=FinalEval(seeds=2, epochs=1, max_front=2, baselines=False),
    )
    cwd = os.getcwd()
    os.chdir(d)  # runs/rep goes here
    try:
        run_search(exp, printer=lambda *a: None)
    finally:
        os.chdir(cwd)
    return exp.storage_url, optuna.load_study(study_name="rep", storage=exp.storage_url), d


def trained_runs(monkeypatch) -> list:
    """The spec of every trial, confirmation and final run trained from now on, in order: each place
    that trains one (the executors, the worker and the finals, which import ``run_trial``) counts it."""
    from petl_nas.search import executors, finals, worker

    specs, real = [], worker.run_trial

    def counted(spec, *a, **kw):
        specs.append(spec)
        return real(spec, *a, **kw)

    for module in (executors, worker, finals):
        monkeypatch.setattr(module, "run_trial", counted)
    return specs
