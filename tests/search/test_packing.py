"""`gpus_per_trial: auto`: trials packed onto GPUs by measured memory.

The sizing is checked exactly from its formula; the searcher's gating (the first trial alone, then
shares of 1/n, halved after an out-of-memory failure) is driven through the Tune searcher itself;
and a real local Ray that declares one GPU runs a search end to end (CI has no GPU: the trials see
no CUDA device, report no GPU memory, and so each is granted a whole GPU).
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from petl_nas.search.executors import OOM, _make_searcher
from petl_nas.search.packing import CONTEXT_MB, HEADROOM, USABLE, GpuPacking, fits, share
from petl_nas.study.experiment import Experiment

H100_MB = 81_559  # torch's total_memory of one H100 80GB, in MB


def test_how_many_fit_is_the_formula():
    per_trial = 1_300 * HEADROOM + CONTEXT_MB  # a MiniLM trial measured 1.2-1.4 GiB on an H100
    assert fits(1_300, H100_MB, most=100) == math.floor(H100_MB * USABLE / per_trial) == 28
    assert fits(1_300, H100_MB, most=16) == 16  # 16 CPU slots drive at most 16
    assert fits(70_000, H100_MB, most=16) == 1  # a trial bigger than the card still runs alone
    cached = 1_300 * HEADROOM + CONTEXT_MB + 2_048  # fidelity.frozen_cache_mb: 2048, filled later
    assert fits(1_300, H100_MB, most=100, reserved_mb=2_048) == math.floor(H100_MB * USABLE / cached) == 15
    assert (
        GpuPacking(most=100, reserved_mb=2_048)
        .observe({"gpu_reserved_mb": 1_300, "gpu_total_mb": H100_MB})
        .startswith("gpus_per_trial auto: a trial held 1,300 MB of 81,559 MB; 15 trial(s) per GPU")
    )


def test_shares_always_fit_on_one_card():
    for n in range(1, 65):
        assert share(n) * n <= 1.0 and share(n) > 1.0 / n - 1e-4
    assert share(1) == 1.0 and share(3) == 0.3333


def test_packing_learns_from_the_first_trial_and_halves_after_out_of_memory():
    packing = GpuPacking(most=16)
    assert packing.fraction == 1.0 and packing.must_wait(running=1) and not packing.must_wait(running=0)
    line = packing.observe({"gpu_reserved_mb": 1_300, "gpu_total_mb": H100_MB})
    assert packing.per_gpu == 16 and "16 trial(s) per GPU" in line and not packing.must_wait(running=5)
    assert packing.observe({"gpu_reserved_mb": 40_000, "gpu_total_mb": H100_MB}) is None  # sized once
    assert "8 trial(s) per GPU" in packing.out_of_memory(0.0625) and packing.fraction == 0.125
    assert packing.out_of_memory(0.0625) is None and packing.per_gpu == 8  # one event: its other trials
    assert "4 trial(s) per GPU" in packing.out_of_memory(0.125)  # at the new share: halves again
    blind = GpuPacking(most=4)
    assert "no GPU memory" in blind.observe({}) and blind.per_gpu == 1 and not blind.must_wait(running=1)


class Source:
    """Proposals numbered 0, 1, 2, ...: what the searcher asks of the study, without one."""

    def __init__(self):
        self.n = 0

    def next(self):
        self.n += 1
        return SimpleNamespace(number=self.n - 1)


class Outcomes:
    def __init__(self):
        self.seen = []

    def reuse(self, p, spec):  # no result known in advance: every trial trains
        return False

    def complete(self, p, info):
        self.seen.append(("complete", p.number))

    def failed(self, p, reason, kind, trace=None):
        self.seen.append((kind, p.number))


def test_the_slots_count_as_ray_does():
    """1 // 0.2 is 4.0 in floats; Ray, counting in 1/10,000, fits 5 shares of 0.2 on one GPU."""
    from petl_nas.search.executors import _slots

    assert _slots({"CPU": 16, "GPU": 1}, 1, 0.2) == 5 and _slots({"CPU": 160, "GPU": 8}, 1, 0.1) == 80
    assert _slots({"CPU": 16, "GPU": 1}, 1, 0.05) == 16 and _slots({"CPU": 16}, 0.5, 0) == 32


def test_the_searcher_holds_trials_until_the_first_is_measured():
    pytest.importorskip("ray")
    packing, lines, outcomes = GpuPacking(most=8), [], Outcomes()
    searcher = _make_searcher(
        Source(), 10, lambda p: SimpleNamespace(to_dict=lambda: {"number": p.number}), outcomes, packing, lines.append
    )
    first = searcher.suggest("a")
    assert first == {"spec": {"number": 0}, "gpu": 1.0}
    assert searcher.suggest("b") is None  # the first is still measuring
    searcher.on_trial_complete("a", {"final": True, "score": 0.9, "gpu_reserved_mb": 9_000, "gpu_total_mb": H100_MB})
    assert outcomes.seen == [("complete", 0)] and "5 trial(s) per GPU" in lines[-1]
    shares = [searcher.suggest(t)["gpu"] for t in "cdefg"]
    assert shares == [0.2] * 5
    searcher.on_trial_complete("c", {"failed": "CUDA out of memory", "kind": OOM, "score": -2.0})
    assert outcomes.seen[-1] == (OOM, 1) and "2 trial(s) per GPU" in lines[-1]
    searcher.on_trial_complete("d", {"failed": "CUDA out of memory", "kind": OOM, "score": -2.0})
    assert outcomes.seen[-1] == (OOM, 2) and packing.per_gpu == 2  # filled the card with "c": halved once
    assert searcher.suggest("h")["gpu"] == 0.5


@pytest.mark.slow
def test_a_second_call_of_a_search_goes_on_from_the_packing_it_learned(tmp_path, monkeypatch):
    """A search calls the Ray executor again when trials are left to train (failed ones retried): that
    call neither measures a first trial alone again nor forgets an out-of-memory halving, which
    would pack the card as densely as before and run out of memory again. (Tune's Tuner is replaced
    by one that keeps the searcher; a local Ray declares one GPU and 8 CPUs.)"""
    ray = pytest.importorskip("ray")
    from ray import tune

    from petl_nas.search import executors

    searchers = []

    class KeepsTheSearcher:
        def __init__(self, trainable, tune_config, run_config):
            searchers.append(tune_config.search_alg)

        def fit(self):
            pass

    monkeypatch.setattr(tune, "Tuner", KeepsTheSearcher)
    make_spec = lambda p: SimpleNamespace(to_dict=lambda: {"number": p.number})  # noqa: E731
    lines = []
    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        first = executors.run_ray(
            Source(), 10, make_spec, Outcomes(), n_evals=1, run_dir=str(tmp_path), printer=lines.append
        )
        searcher = searchers[-1]
        assert searcher.suggest("a")["gpu"] == 1.0 and searcher.suggest("b") is None  # measuring alone
        searcher.on_trial_complete(
            "a", {"final": True, "score": 0.9, "gpu_reserved_mb": 3_000, "gpu_total_mb": H100_MB}
        )
        assert first.per_gpu == 8  # the CPUs bound it
        assert searcher.suggest("c")["gpu"] == 0.125
        searcher.on_trial_complete("c", {"failed": "CUDA out of memory", "kind": OOM, "score": -2.0})
        assert first.per_gpu == 4
        second = executors.run_ray(
            Source(), 10, make_spec, Outcomes(), n_evals=1, run_dir=str(tmp_path), packing=first, printer=lines.append
        )
    finally:
        ray.shutdown()
    assert second is first and lines[-1] == "gpus_per_trial auto: 4 trial(s) per GPU, as learned earlier in this search"
    assert searchers[-1].suggest("d")["gpu"] == 0.25  # at once: no measuring trial, still halved


@pytest.mark.slow
def test_a_ray_search_on_a_gpu_node_asks_for_gpu_shares(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from test_search import experiment

    from petl_nas.search.driver import run_search

    monkeypatch.chdir(tmp_path)
    import petl_nas.search.executors as executors

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    lines, asked = [], {}
    real = executors.EXECUTORS["ray"]
    monkeypatch.setitem(executors.EXECUTORS, "ray", lambda *a, **kw: asked.update(kw) or real(*a, **kw))
    try:
        exp: Experiment = experiment(
            tmp_path,
            executor="ray",
            scheduler="fifo",
            trials=3,
            gpus_per_trial="auto",
            fidelity=dataclasses.replace(experiment(tmp_path).fidelity, epochs=1, frozen_cache_mb=64),
        )
        summary = run_search(exp, printer=lines.append)
    finally:
        ray.shutdown()
    assert summary.counts["complete"] == 3
    assert asked["reserved_mb"] == 64  # each packed worker's frozen-layer cache, on its GPU
    assert any("1 GPU(s); the first trial runs alone" in line for line in lines)
    assert any("reported no GPU memory" in line for line in lines)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    done = sorted((t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: t.datetime_complete)
    assert [t.user_attrs["gpu_share"] for t in done] == [1.0, 1.0, 1.0]  # what Ray granted each trial


def test_gpus_per_trial_in_files_and_flags():
    from petl_nas import ConfigError
    from petl_nas.app.cli import build_parser

    assert (
        Experiment().gpus_per_trial == "auto" and Experiment.from_dict({"gpus_per_trial": 0.25}).gpus_per_trial == 0.25
    )
    with pytest.raises(ConfigError, match="gpus_per_trial: expected auto or"):
        Experiment.from_dict({"gpus_per_trial": "lots"}, "e.yaml")
    with pytest.raises(ConfigError, match="a number from 0 to 1 .a trial trains on one GPU"):
        Experiment.from_dict({"gpus_per_trial": 2}, "e.yaml")  # two reserved, one used
    assert Experiment.from_dict({"gpus_per_trial": 1}).gpus_per_trial == 1
    assert build_parser().parse_args(["search", "--gpus-per-trial", "auto"]).gpus_per_trial == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["search", "--gpus-per-trial", "lots"])


def test_a_first_trial_out_of_memory_is_the_measurement_nothing_waits_after_it():
    packing = GpuPacking(most=8)
    assert packing.out_of_memory(1.0) is None and packing.per_gpu == 1  # alone already: nothing to halve
    assert packing.measured and not packing.must_wait(running=1)


def test_out_of_memory_is_told_apart_however_the_system_spells_it():
    """ENOMEM from the OS reads "Cannot allocate memory": an out-of-memory failure, which halves the packing."""
    from petl_nas.search.executors import _kind

    assert _kind(OSError(12, "Cannot allocate memory")) == OOM
    assert _kind(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) == OOM
    assert _kind(ValueError("bad row")) == "error: ValueError"
