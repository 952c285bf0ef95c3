"""`fidelity: auto`: the trial length is measured on presets before the search, stored, and reused.

The trainer is replaced by a table of scores per (preset, epochs), so each rule is checked exactly:
the final length first, then the shortest length at which every preset is clear of the baseline,
ranks as at the final length and no longer climbs beyond noise; the final length when no such
length exists; one calibration per study, reused on resume; ASHA's
first rung where the presets first learned.
"""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from conftest import NO_RATES, TINY_BACKBONE

from petl_nas.search import calibrate
from petl_nas.search.driver import run_search
from petl_nas.study.experiment import Experiment, Fidelity, FinalEval
from petl_nas.study.results import TrialResult

BASELINE = {"score": 0.5, "metric": "accuracy", "what": "constant"}


def scripted(monkeypatch, table: dict[tuple[str, float], float], calls: list):
    """Replace the trainer: the score of preset ``name`` trained ``epochs`` comes from ``table``."""
    from petl_nas.core.presets import preset

    names = {}

    def fake_run_trial(spec):
        name = names.get(repr(spec.config)) or next(
            n
            for n in ("lora", "bitfit", "pfeiffer", "parallel_adapter")
            if preset(n, hidden_size=32).to_dict()["modules"] == spec.config["modules"]
            and preset(n, hidden_size=32).bitfit == spec.config["bitfit"]
        )
        names[repr(spec.config)] = name
        calls.append((name, spec.recipe["epochs"], spec.recipe["evals_per_epoch"], spec.eval_split))
        return TrialResult(score=table[(name, spec.recipe["epochs"])], score_se=0.02)

    monkeypatch.setattr(calibrate, "run_trial", fake_run_trial)


def experiment(tmp_path, **kw) -> Experiment:
    kw = {"trials": 30, **kw}  # enough trials that every shorter length is worth calibrating
    return Experiment(
        rates=NO_RATES,
        name="cal",
        backbone=TINY_BACKBONE,
        task="demo_keyword",
        budget=None,
        space="small",
        presets=["lora", "bitfit"],
        executor="local",
        storage=f"sqlite:///{tmp_path}/s.db",
        fidelity=Fidelity(length_buckets=0, k=64, epochs="auto", batch_size=16, max_length=16, search_dev=32),
        final=FinalEval(seeds=0, epochs=8, baselines=False),
        **kw,
    )


def test_the_ladder_never_passes_the_final_length():
    assert calibrate.ladder(10) == [1, 2, 4, 8, 10] and calibrate.ladder(1) == [1] and calibrate.ladder(3) == [1, 2, 3]


def test_the_shortest_length_that_learned_ranked_and_settled(tmp_path, monkeypatch):
    calls = []
    scripted(
        monkeypatch,
        {
            ("lora", 8): 0.80,
            ("bitfit", 8): 0.70,
            ("parallel_adapter", 8): 0.72,  # the reference
            ("lora", 1): 0.52,
            ("bitfit", 1): 0.51,
            ("parallel_adapter", 1): 0.6,  # not all clear
            ("lora", 2): 0.74,
            ("bitfit", 2): 0.60,
            ("parallel_adapter", 2): 0.66,  # bitfit climbs
            ("lora", 4): 0.78,
            ("bitfit", 4): 0.68,
            ("parallel_adapter", 4): 0.70,
        },  # settled, ranked
        calls,
    )
    record = calibrate.calibrate(experiment(tmp_path), BASELINE, _config(), None, lambda line: None)
    assert record["epochs"] == 4 and record["stable"] and record["first_learned_epochs"] == 2
    assert [e for _, e, _, _ in calls][::3] == [8, 1, 2, 4]  # the reference first; stopped at 4
    assert [s["epochs"] for s in record["steps"]] == [1, 2, 4, 8]
    assert record["presets"] == ["lora", "bitfit", "parallel_adapter"]  # the experiment's, then an anchor
    assert all(evals == 0 and split == "search_dev" for _, _, evals, split in calls)  # scored like trials
    assert "4 epochs per trial" in calibrate.describe(record) and "final length" in calibrate.describe(record)


def test_a_length_at_which_a_preset_still_climbs_ranks_speed_not_quality(tmp_path, monkeypatch):
    """SST-2 v4, as measured (search-dev; Compacter++ played by bitfit here): at 2 epochs every
    pair the 4-epoch run told apart was already in order, so the rule "rank as at the next length"
    chose 2 epochs, where LoRA at its paper rate was still 12 points below its 10-epoch score.
    The final-length reference turns that down, and 4 epochs too (the parallel adapter at 62.4)."""
    scripted(
        monkeypatch,
        {
            ("lora", 1): 0.598,
            ("parallel_adapter", 1): 0.597,
            ("bitfit", 1): 0.729,
            ("lora", 2): 0.708,
            ("parallel_adapter", 2): 0.593,
            ("bitfit", 2): 0.794,
            ("lora", 4): 0.813,
            ("parallel_adapter", 4): 0.624,
            ("bitfit", 4): 0.813,
            ("lora", 8): 0.833,
            ("parallel_adapter", 8): 0.814,
            ("bitfit", 8): 0.821,
        },
        [],
    )
    monkeypatch.setattr(calibrate, "did_not_learn", lambda score, se, baseline: score < 0.576)
    record = calibrate.calibrate(experiment(tmp_path), BASELINE, _config(), None, lambda line: None)
    by_length = {s["epochs"]: s for s in record["steps"]}
    assert calibrate.ranks_as(by_length[2], by_length[4])  # what the old rule accepted
    assert not calibrate.settled(by_length[2], by_length[8]) and not calibrate.settled(by_length[4], by_length[8])
    assert record["epochs"] == 8 and not record["stable"]
    assert "no shorter length ranked and scored as the final length did" in calibrate.describe(record)


def test_an_order_decided_within_noise_is_no_ranking(tmp_path, monkeypatch):
    """SST-2, as measured: at 1 epoch LoRA and the parallel adapter were 0.1 points apart (se 1.5)
    in the order the 2-epoch run gave them 11 points apart. That is no ranking yet: 2 epochs is."""
    scripted(
        monkeypatch,
        {
            ("lora", 1): 0.598,
            ("parallel_adapter", 1): 0.597,
            ("bitfit", 1): 0.729,
            ("lora", 2): 0.708,
            ("parallel_adapter", 2): 0.593,
            ("bitfit", 2): 0.794,
            ("lora", 8): 0.730,
            ("parallel_adapter", 8): 0.610,
            ("bitfit", 8): 0.800,
        },
        [],
    )
    monkeypatch.setattr(calibrate, "did_not_learn", lambda score, se, baseline: score < 0.576)
    record = calibrate.calibrate(experiment(tmp_path), BASELINE, _config(), None, lambda line: None)
    assert record["epochs"] == 2 and record["first_learned_epochs"] == 1


def test_no_length_that_ranks_and_settles_means_the_final_length(tmp_path, monkeypatch):
    flips = {("lora", e): s for e, s in ((1, 0.7), (2, 0.6), (4, 0.7), (8, 0.75))}
    flips.update({("bitfit", e): s for e, s in ((1, 0.6), (2, 0.7), (4, 0.6), (8, 0.85))})
    flips.update({("parallel_adapter", e): 0.65 for e in (1, 2, 4, 8)})
    scripted(monkeypatch, flips, [])
    record = calibrate.calibrate(experiment(tmp_path), BASELINE, _config(), None, lambda line: None)
    assert record["epochs"] == 8 and not record["stable"] and record["first_learned_epochs"] == 1
    assert "no shorter length" in calibrate.describe(record)


def test_a_length_that_cannot_repay_its_calibration_is_not_tried(tmp_path, monkeypatch):
    """With 8 trials of 8 epochs, 4 epochs would save at most 8 x 4 = 32 trial-epochs, but
    calibration would by then have trained 3 presets x (8 + 1 + 2 + 4) = 45: it stops at 2."""
    calls = []
    climbing = {(n, e): 0.6 + 0.03 * e for n in ("lora", "bitfit", "parallel_adapter") for e in (1, 2, 4, 8)}
    scripted(monkeypatch, climbing, calls)
    lines = []
    record = calibrate.calibrate(experiment(tmp_path, trials=8), BASELINE, _config(), None, lines.append)
    assert sorted({e for _, e, _, _ in calls}) == [1, 2, 8] and record["skipped"] == [4]
    assert record["epochs"] == 8 and not record["stable"]
    assert any("stops before 4 epochs" in line for line in lines) and "could not repay" in calibrate.describe(record)
    assert calibrate.pays(44, 8, 8, 2) and not calibrate.pays(45, 8, 8, 4)


def test_the_line_names_the_shorter_lengths_tried_or_says_none_was():
    record = {
        "rule": "final",
        "stable": False,
        "final_learned": True,
        "epochs": 10,
        "skipped": [4, 8],
        "steps": [{"epochs": 1}, {"epochs": 2}, {"epochs": 10}],
        "presets": ["lora"],
        "cost_s": 60,
    }
    assert (
        "no shorter length ranked and scored as the final length did up to 2 epochs; 4, 8 could not repay"
        in calibrate.describe(record)
    )
    record.update(skipped=[1, 2, 4, 8], steps=[{"epochs": 10}])  # the final length first, nothing shorter paid
    assert calibrate.describe(record) == (
        "fidelity auto: 10 epochs per trial (no shorter length was tried: 1, 2, "
        "4, 8 epochs could not repay calibrating them; lora; calibration took "
        "1.0 min)"
    )


def test_presets_that_never_learn_stop_calibration_at_the_final_length(tmp_path, monkeypatch):
    """CoLA v5, as measured: no preset cleared MCC 0 at 10 epochs; shorter lengths cannot rank them."""
    calls = []
    scripted(monkeypatch, {(n, 8): 0.51 for n in ("lora", "bitfit", "parallel_adapter")}, calls)
    record = calibrate.calibrate(experiment(tmp_path), BASELINE, _config(), None, lambda line: None)
    assert {e for _, e, _, _ in calls} == {8} and record["skipped"] == [1, 2, 4]
    assert record["epochs"] == 8 and record["final_learned"] is False and record["first_learned_epochs"] is None
    assert "not every preset learned even at the final length" in calibrate.describe(record)


def test_no_preset_under_the_budget_means_the_final_length_not_the_shortest(tmp_path, monkeypatch):
    """With nothing to rank, every rule holds vacuously: calibration must not pick 1 epoch from no run."""
    calls, lines = [], []
    scripted(monkeypatch, {}, calls)
    record = calibrate.calibrate(experiment(tmp_path), BASELINE, _config(), 10, lines.append)  # budget 10
    assert calls == [] and record["epochs"] == 8 and record["stable"] is False and record["presets"] == []
    assert "no preset fits the budget of 10" in lines[0]
    assert calibrate.describe(record) == (
        "fidelity auto: 8 epochs per trial, the final length (no preset fits the "
        "budget, so none could calibrate a shorter length)"
    )


def test_a_record_of_the_older_rule_is_described_as_it_was_made():
    old = {"presets": ["lora"], "steps": [], "epochs": 2, "stable": True, "first_learned_epochs": 1, "cost_s": 60}
    assert "ranked as at the next length" in calibrate.describe(old)


def test_a_study_calibrates_once_and_its_trials_run_at_the_chosen_length(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = []
    rank = {"lora": 0.1, "parallel_adapter": 0.05, "bitfit": 0.0}
    table = {(n, e): 0.7 + r + 0.001 * e for n, r in rank.items() for e in (1, 2, 4, 8)}  # one order throughout
    scripted(monkeypatch, table, calls)
    monkeypatch.setattr(calibrate, "pays", lambda *a: True)  # one trial here; the cost rule is tested below
    freed = []  # the presets' GPU memory, given back
    monkeypatch.setattr(calibrate, "free_memory", lambda: freed.append(len(calls)))
    lines = []
    exp = experiment(tmp_path, trials=1)
    run_search(exp, printer=lines.append)
    assert freed == [len(calls)]  # once, after every preset calibration trained (calls: only those)
    study = optuna.load_study(study_name="cal", storage=exp.storage_url)
    assert study.user_attrs["fidelity_calibration"]["epochs"] == 1
    assert study.user_attrs["fidelity"]["epochs"] == 1  # what export's --recipe search reads
    assert all(t.user_attrs["epochs"] == 1 for t in study.trials if t.user_attrs.get("epochs"))
    assert any(line.startswith("fidelity auto: 1 epochs per trial") for line in lines)
    assert "  calibration: lora at 8 epochs: 0.8080 (1 of 3 runs, about 1 min left)" in lines  # said per run
    assert "  calibration: parallel_adapter at 8 epochs: 0.7580 (3 of 3 runs)" in lines
    # The presets' trials at the chosen (shorter) length are calibration's runs, not trained again.
    presets = {t.user_attrs["preset"]: t for t in study.trials if t.user_attrs.get("preset")}
    assert set(presets) == {"lora", "bitfit"}
    assert all(t.user_attrs.get("reused") == "calibration" for t in presets.values())
    assert {n: t.values[0] for n, t in presets.items()} == {n: table[(n, 1)] for n in presets}
    n = len(calls)
    run_search(dataclasses.replace(exp, trials=2), printer=lines.append)  # resume: no new calibration
    assert len(calls) == n


def test_calibration_says_what_it_trains_while_a_run_goes_on(tmp_path, monkeypatch):
    """A run prints a line at least every `progress.EVERY_S` while it trains (a run of 10 epochs
    takes minutes on 2 cores; the issue's user saw nothing for 40)."""
    import threading

    from petl_nas.search import progress

    monkeypatch.setattr(progress, "EVERY_S", 0.01)
    lines, beat = [], threading.Event()

    def printer(line):
        lines.append(line)
        beat.set() if "running for" in line else None

    def slow_run(spec):  # returns once a heartbeat was printed during it
        beat.clear()
        assert beat.wait(30)
        return TrialResult(score=0.8, score_se=0.02)

    monkeypatch.setattr(calibrate, "run_trial", slow_run)
    monkeypatch.setattr(calibrate, "pays", lambda *a: False)
    calibrate.calibrate(experiment(tmp_path), BASELINE, _config(), None, printer)
    assert any(line.startswith("  calibration: lora at 8 epochs: running for ") for line in lines)
    assert any(
        line.startswith("  calibration: bitfit at 8 epochs: running for ")
        and "min left in this stage (1 of 3 runs done)" in line
        for line in lines
    )


def test_a_fixed_length_study_resumed_with_auto_is_refused_a_calibrated_one_is_not():
    """`--epochs auto` on a study of 3-epoch trials would calibrate and train the next at another length."""
    from petl_nas.search.study import changed_settings

    auto, three = {"fidelity": {"epochs": "auto"}}, {"fidelity": {"epochs": 3}}
    assert changed_settings(three, auto) == ["fidelity.epochs 3 (now auto)"]
    calibrated = {"fidelity": {"epochs": 1}, "fidelity_calibration": {"epochs": 1}}
    assert changed_settings(calibrated, auto) == []  # auto again: its choice, 1
    assert changed_settings(calibrated, {"fidelity": {"epochs": 4}}) == ["fidelity.epochs 1 (now 4)"]
    assert changed_settings(auto, three) == []  # made auto, not calibrated yet
    assert changed_settings(three, three) == []


def test_fidelity_auto_in_files_and_flags(tmp_path):
    assert Experiment.from_dict({"fidelity": "auto"}).fidelity.epochs == "auto"
    assert Experiment().fidelity.epochs == "auto"  # the default
    with pytest.raises(Exception, match="fidelity: epochs: expected auto or a number > 0, got 'soon'"):
        Experiment.from_dict({"fidelity": {"epochs": "soon"}})


def _config():
    from petl_nas.tasks import get_task
    from petl_nas.training.loading import model_config_for

    return model_config_for(TINY_BACKBONE, get_task("demo_keyword"))


@pytest.mark.slow
def test_presets_calibrated_at_the_trials_length_are_recorded_from_calibration_not_trained_again(tmp_path, monkeypatch):
    """When the trials run at the final length, calibration already trained each preset with the
    trial's exact spec: the preset trials take those results (marked ``reused``), and they equal
    what training the trials again gives."""
    import petl_nas.search.executors as executors

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(calibrate, "pays", lambda *a: False)  # no shorter length: the final one
    trained = []
    real = executors.run_trial
    monkeypatch.setattr(executors, "run_trial", lambda spec, **kw: trained.append(spec) or real(spec, **kw))

    def study_of(name, reuse: bool):
        if not reuse:
            monkeypatch.setattr(calibrate, "known_results", lambda record: [])
        exp = dataclasses.replace(
            experiment(tmp_path, trials=3),
            name=name,
            storage=f"sqlite:///{tmp_path}/{name}.db",
            final=FinalEval(seeds=0, epochs=2, baselines=False),
        )
        run_search(exp, printer=lambda *a: None)
        return optuna.load_study(study_name=name, storage=exp.storage_url)

    study = study_of("reused", True)
    record = study.user_attrs["fidelity_calibration"]
    assert record["epochs"] == 2 and set(record["presets"]) >= {"lora", "bitfit"}
    presets = {t.user_attrs["preset"]: t for t in study.trials if t.user_attrs.get("preset")}
    assert set(presets) == {"lora", "bitfit"} and all(t.state.name == "COMPLETE" for t in presets.values())
    assert all(t.user_attrs.get("reused") == "calibration" for t in presets.values())
    final_step = next(s for s in record["steps"] if s["epochs"] == 2)
    assert {n: t.values[0] for n, t in presets.items()} == {n: final_step["scores"][n]["score"] for n in presets}
    assert not any(s.config == t.user_attrs["petl_config"] for s in trained for t in presets.values())
    assert len(trained) == 1  # the sampler's one trial: trained

    again = study_of("trained", False)  # the same study, presets trained again
    twice = {t.user_attrs["preset"]: t for t in again.trials if t.user_attrs.get("preset")}
    assert not any(t.user_attrs.get("reused") for t in twice.values())
    assert {n: t.values[0] for n, t in twice.items()} == {n: t.values[0] for n, t in presets.items()}


def test_a_calibration_preset_exactly_at_the_budget_is_used():
    """`calibration_presets`: the budget is a most, as for every preset; one that equals it calibrates."""
    from types import SimpleNamespace

    from test_warm_start import CFG

    from petl_nas.core.budget import count_parameters
    from petl_nas.core.presets import preset

    exp = SimpleNamespace(presets=["lora", "bitfit"])
    budget = count_parameters(CFG, preset("lora", CFG)).deployable
    assert calibrate.calibration_presets(exp, CFG, budget)[0] == "lora"
    assert "lora" not in calibrate.calibration_presets(exp, CFG, budget - 1)


def test_ranks_as_asks_every_pair_the_longer_length_separates_to_be_separated_the_same_way_round():
    """`ranks_as`: a pair apart beyond noise at the longer length must be apart beyond noise, in the
    same order, at the shorter one; a pair within noise there asks nothing."""
    from petl_nas.search.calibrate import ranks_as

    def at(a, b, se=0.01):
        return {"scores": {"a": {"score": a, "se": se}, "b": {"score": b, "se": se}}}

    long = at(0.80, 0.70)  # a clearly above b
    assert ranks_as(at(0.78, 0.66), long)  # the same order, beyond noise
    assert not ranks_as(at(0.66, 0.78), long)  # the other way round
    assert not ranks_as(at(0.75, 0.75), long)  # not told apart yet
    assert ranks_as(at(0.60, 0.75), at(0.80, 0.79))  # within noise at the longer length: nothing asked
