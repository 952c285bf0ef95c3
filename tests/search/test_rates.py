"""Measured rates per family (`petl_nas.search.rates`): each family trains at its own measured
rate, the sampler draws only a narrow multiplier, presets and the LoRA sweep train at the measured
rates, and the calibration is stored, printed, written and reused."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time

import optuna
import pytest
from conftest import tiny_experiment, tiny_model

from petl_nas import ConfigError, ModuleSpec, PetlConfig
from petl_nas.core.family_rates import at_rates, at_reference_scales, families_of
from petl_nas.search import rates
from petl_nas.study.experiment import Experiment, FinalEval, Rates
from petl_nas.study.space import SearchSpace

LORA = ModuleSpec(form="lora", targets=("q", "v"), size=2)
ADAPTER = ModuleSpec(form="adapter", position="ffn", size=4, insertion="parallel")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_each_family_of_a_configuration_trains_at_its_measured_rate_times_the_scale():
    from petl_nas import apply_petl
    from petl_nas.core.inject import parameter_families
    from petl_nas.training.loop import Recipe, param_groups

    config = PetlConfig(modules=(LORA, ADAPTER), bitfit=True)
    assert families_of(config) == ["lora", "adapter", "bitfit"]
    measured = {"adapter": 1e-4, "lora": 1e-3, "bitfit": 3e-4, "prefix": 2e-4}
    trained, lr = at_rates(measured, config, 0.5)
    assert lr == pytest.approx(0.5e-3) and dict(trained.lr_mults) == pytest.approx({"adapter": 0.1, "bitfit": 0.3})
    model = apply_petl(tiny_model(), trained)
    params = [p for p in model.parameters() if p.requires_grad]
    families = parameter_families(model)
    by_family: dict[str, set] = {}
    for group in param_groups(model, params, Recipe(lr=lr)):
        for p in group["params"]:
            by_family.setdefault(families[id(p)], set()).add(round(group["lr"], 12))
    assert by_family == {
        "lora": {5e-4},
        "adapter": {5e-5},
        "bitfit": {1.5e-4},
        "head": {5e-4},
    }  # the head follows the first family


def test_a_configuration_with_one_family_needs_no_multiples_and_a_head_alone_takes_the_first_rate():
    one, lr = at_rates({"lora": 2e-3, "adapter": 1e-4}, PetlConfig(modules=(LORA,)), 1.0)
    assert one.lr_mults == () and lr == 2e-3
    head, lr = at_rates({"lora": 2e-3, "adapter": 1e-4}, PetlConfig(), 2.0)
    assert head.lr_mults == () and lr == 4e-3


def test_the_climb_goes_up_while_the_score_rises_then_down_from_the_start():
    peak = lambda best: lambda rate: -abs(math.log(rate / best))  # noqa: E731 - a score peaking at `best`
    assert [r for r, _ in rates.climb(peak(9e-4), 1e-4, 5)] == pytest.approx([1e-4, 3e-4, 9e-4, 2.7e-3])
    assert [r for r, _ in rates.climb(peak(1e-5), 1e-4, 5)] == pytest.approx(
        [1e-4, 3e-4, 1e-4 / 3, 1e-4 / 9, 1e-4 / 27]
    )
    assert len(rates.climb(peak(1e-9), 1e-4, 3)) == 3  # never past the runs it may take
    assert [r for r, _ in rates.climb(peak(1e-4), 1e-4, 5)] == pytest.approx([1e-4, 3e-4, 1e-4 / 3])


def test_a_calibrated_space_draws_one_narrow_multiplier_and_holds_presets_at_one():
    space = SearchSpace.load("small")
    scaled = space.with_rate_scale(2.0)
    assert scaled.hash == space.hash
    study = optuna.create_study()
    for _ in range(20):
        trial = study.ask()
        _, recipe = scaled.sample(trial, 2)
        assert 0.5 <= recipe["lr"] <= 2.0 and "lr_scale" in trial.params and "lr" not in trial.params
        study.tell(trial, 0.0)
    config = space.with_head(PetlConfig(modules=(ModuleSpec(form="lora", targets=("q", "v"), size=2),)))
    params = scaled.params_for(config, 1.0, 2)
    assert params["lr_scale"] == 1.0 and "lr" not in params
    assert scaled.params_for(config, 3.0, 2) is None  # beyond the spread: not a point
    assert "lr_scale" not in space.with_rate_scale(1.0).params_for(config, 1.0, 2)  # fixed at 1


def test_rates_in_experiment_files():
    assert Experiment.from_dict({"rates": "off"}).rates.on is False
    assert Experiment.from_dict({"rates": False}).rates.on is False  # YAML 1.1 reads a bare off as false
    assert Experiment().rates == Rates(calibrate="auto", file=None, spread=2.0, share=0.15)
    for bad, what in (
        ({"spread": 0.5}, "spread"),
        ({"share": 1.5}, "share"),
        ({"calibrate": "on"}, "calibrate"),
        ({"calibrate": "off", "file": "r.json"}, "file"),
    ):
        with pytest.raises(ConfigError, match=what):
            Experiment.from_dict({"rates": bad}, "e.yaml")


def _calibrated(tmp_path, **changes):
    fields = dict(
        name="rates",
        trials=12,
        presets=["pfeiffer"],
        storage=f"sqlite:///{tmp_path}/study.db",
        budget=None,
        rates=Rates(share=0.5, spread=2.0),
    )
    return tiny_experiment(**{**fields, **changes})


@pytest.mark.slow
def test_a_calibrated_study_measures_each_family_then_trains_every_trial_at_the_measured_rates(tmp_path):
    from petl_nas.search.driver import run_search
    from petl_nas.study.records import stored_trials

    exp = _calibrated(tmp_path)
    lines = []
    began = time.perf_counter()
    run_search(exp, printer=lines.append)
    took = time.perf_counter() - began
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    record = study.user_attrs[rates.ATTR]
    assert 0 < record["cost_s"] <= took  # a part of the search, not the clock
    assert set(record["rates"]) == {"lora", "adapter", "prefix"}  # the small space's families
    assert record["runs"] == sum(line.startswith("  rates: ") for line in lines)
    assert record["planned"] == exp.trials  # no sweep, no finals: the trials alone
    assert record["runs"] <= record["allowed"] == rates.allowance(record["planned"], exp.rates.share) == 6
    done = [line for line in lines if line.startswith("  rates: ") and "running for" not in line]
    assert [line.rsplit("(", 1)[1].split(" runs")[0] for line in done] == [f"{i} of 6" for i in range(1, len(done) + 1)]
    assert "at most" in done[0]  # the share is a bound: it may stop sooner
    table = lines.index("rates, the rate each family trains at:")  # a row per family, under its header
    assert [line.split()[0] for line in lines[table + 2 : table + 5]] == ["lora", "adapter", "prefix"]
    for family, f in record["families"].items():
        if "tried" in f:  # the best score's rate is the family's
            assert f["rate"] == max(f["tried"], key=lambda t: t[1])[0]
    lora, adapter = record["families"]["lora"], record["families"]["adapter"]
    assert lora["tried"][0][0] == lora["prior"]  # the first climbs from its paper rate,
    factor = max(lora["tried"][:3], key=lambda t: t[1])[0] / lora["prior"]  # the next from its own times the
    assert adapter["tried"][0][0] == pytest.approx(min(max(adapter["prior"] * factor, 3e-3), 3e-2))  # factor
    assert json.loads((exp.run_dir / "rates.json").read_text())["rates"] == record["rates"]

    assert record["scales"] == {"lora": 2.0, "adapter": 1.0}  # the probes' scales (prefix: gated)
    assert any(line.startswith("scales: ") and "lora s=2, adapter s=1" in line for line in lines)
    trials = [t for t in stored_trials(study) if t.state.name == "COMPLETE"]
    drawn = 0
    for t in trials:
        config = t.config(resolved=False)
        assert 0.5 <= t.lr_scale <= 2.0
        expected, lr = at_rates(record["rates"], dataclasses.replace(config, lr_mults=()), t.lr_scale)
        assert (config, t.lr) == (expected, pytest.approx(lr))
        assert at_reference_scales(config, record["scales"]) == config  # every zero-start module at its family's
        drawn += sum(1 for n in study.trials[t.number].params if n.endswith(".scale"))
    assert drawn  # though the sampler drew other scales
    preset = next(t for t in trials if t.preset == "pfeiffer")
    assert preset.lr_scale == 1.0 and preset.lr == record["rates"]["adapter"]  # at the measured rate, and
    assert study.trials[preset.number].user_attrs.get("reused") == "calibration"  # from calibration's own run

    lines.clear()
    run_search(dataclasses.replace(exp, trials=13), printer=lines.append)  # resumed: not measured again
    assert not any(line.startswith("  rates: ") for line in lines)
    assert optuna.load_study(study_name=exp.study_name, storage=exp.storage_url).user_attrs[rates.ATTR] == record


@pytest.mark.slow
def test_a_rates_file_is_reused_on_the_same_backbone_and_refused_on_another(tmp_path, monkeypatch):
    from petl_nas.search.driver import run_search

    first = _calibrated(tmp_path, trials=4, presets="none")
    run_search(first, printer=lambda *a: None)
    path = str(first.run_dir / "rates.json")
    second = _calibrated(
        tmp_path,
        name="again",
        trials=2,
        presets="none",
        storage=f"sqlite:///{tmp_path}/b.db",
        task="demo_keyword",
        rates=Rates(file=path),
    )
    lines = []
    run_search(second, printer=lines.append)
    assert f"rates: from {path}, not measured again" in lines
    assert any(
        line.startswith("rates: ") and "measured on task demo_sentiment, reused for demo_keyword" in line
        for line in lines
    )
    assert not any(line.startswith("  rates: ") for line in lines)  # no calibration run
    other = dataclasses.replace(
        second,
        name="other",
        storage=f"sqlite:///{tmp_path}/c.db",
        backbone={
            "tiny": {
                "hidden_size": 48,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 64,
                "vocab_size": 600,
            }
        },
    )
    with pytest.raises(ConfigError, match="rates do not carry across backbones"):
        run_search(other, printer=lambda *a: None)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a rates file"):
        rates.read_file(str(tmp_path / "bad.json"), second)


@pytest.mark.slow
def test_a_study_made_without_rates_keeps_one_rate_per_trial_when_resumed(tmp_path):
    from petl_nas.search.driver import run_search
    from petl_nas.study.records import stored_trials

    exp = _calibrated(tmp_path, trials=2, presets="none", rates=Rates(calibrate="off"))
    run_search(exp, printer=lambda *a: None)
    older = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    older.set_user_attr(rates.SETTING, None)  # as a study made before rates existed
    run_search(dataclasses.replace(exp, trials=3, rates=Rates()), printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    assert rates.ATTR not in study.user_attrs
    assert all(t.lr_scale is None and "lr" in t.params for t in stored_trials(study) if t.params)


@pytest.mark.slow
def test_the_lora_sweep_trains_at_loras_measured_rate(tmp_path):
    from petl_nas.search.driver import run_search
    from petl_nas.study.records import stored_trials

    exp = _calibrated(tmp_path, trials=2, presets="none", budget="5%", final=FinalEval(seeds=0, baselines=True))
    lines = []
    run_search(exp, printer=lines.append)
    assert any("LoRA rank sweep queued (on top of the trials; at LoRA's measured rate)" in line for line in lines)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    lora = study.user_attrs[rates.ATTR]["rates"]["lora"]
    sweep = [t for t in stored_trials(study) if t.sweep and t.sweep.startswith("lora_")]
    assert sweep and all(t.lr_scale == 1.0 and t.lr == lora for t in sweep)
    others = [t for t in stored_trials(study) if t.sweep and not t.sweep.startswith("lora_")]
    assert others and all(t.lr_scale == 1.0 for t in others)  # today's methods, at their families' rates


def test_the_families_are_a_table_saying_how_each_rate_was_found_each_reason_once(monkeypatch):
    record = {
        "families": {
            "lora": {
                "prior": 5e-4,
                "probe": "lora",
                "rate": 4.5e-3,
                "edge": True,
                "tried": [[5e-4, 0.737], [1.5e-3, 0.813], [4.5e-3, 0.817]],
            },
            "adapter": {
                "prior": 1e-4,
                "probe": "pfeiffer",
                "rate": 3e-4,
                "edge": False,
                "tried": [[1e-4, 0.61], [3e-4, 0.65], [9e-4, -math.inf]],
            },
            "prefix": {
                "prior": 2e-4,
                "rate": 6e-4,
                "why": "not measured: calibration's share of the study's runs is spent",
            },
            "prompt": {
                "prior": 1e-3,
                "rate": 3e-3,
                "why": "not measured: calibration's share of the study's runs is spent",
            },
        },
        "factor": 3.0,
        "runs": 6,
        "trials": 40,
        "cost_s": 252.0,
        "planned": 56,
    }
    monkeypatch.delenv("PETL_NAS_VERBOSE", raising=False)
    assert rates.lines(record) == [
        "rates, the rate each family trains at:",
        "  family   rate     how chosen                     best score",
        "  lora     4.5e-03  measured on lora, 3 rates [1]      0.8170",
        "  adapter  3.0e-04  measured on pfeiffer, 3 rates      0.6500",
        "  prefix   6.0e-04  start 2.0e-04 x 3.00 [2], [3]           -",
        "  prompt   3.0e-03  start 1.0e-03 x 3.00 [2], [3]           -",
        "  [1] the best is at the edge of the rates tried: more runs (rates.share) may find a better one",
        "  [2] start x f: the family's starting rate times the factor measured on the others",
        "  [3] not measured: calibration's share of the study's runs is spent",
        "rates: calibration took 6 runs (11% of the 56 runs the study plans) and 4.2 min",
    ]
    monkeypatch.setenv("PETL_NAS_VERBOSE", "1")  # --verbose: every rate tried as well
    assert rates.lines(record)[9:11] == [
        "  lora tried: 5.0e-04 0.7370, 1.5e-03 0.8130, 4.5e-03 0.8170",
        "  adapter tried: 1.0e-04 0.6100, 3.0e-04 0.6500, 9.0e-04 diverged",
    ]
    assert (
        rates.lines({**record, "planned": None})[-1] == "rates: calibration took 6 runs (15% of 40 trials) and 4.2 min"
    )
    assert rates.lines({**record, "runs": 2, "trials": 0, "planned": None})[-1] == (  # recorded before "planned"
        "rates: calibration took 2 runs (the study asks for no trials of the sampler's; the fewest a calibration "
        "takes) and 4.2 min"
    )


def test_the_reference_scales_are_one_line_and_a_file_without_them_takes_its_probes(tmp_path):
    record = {
        "rates": {"lora": 1.5e-3, "adapter": 9e-4, "prefix": 1e-3},
        "factor": 3.0,
        "runs": 2,
        "trials": 4,
        "cost_s": 60.0,
        "planned": 8,
        "backbone": json.dumps({"tiny": {}}),
        "task": "demo_sentiment",
        "families": {
            "lora": {"prior": 5e-4, "probe": "lora", "rate": 1.5e-3, "tried": [[1.5e-3, 0.8]]},
            "adapter": {"prior": 1e-4, "probe": "pfeiffer, sizes 12 to fit", "rate": 9e-4, "tried": [[9e-4, 0.8]]},
            "prefix": {"prior": 2e-4, "rate": 1e-3, "why": "no preset of it fits the budget"},
        },
    }
    assert not any(line.startswith("scales: ") for line in rates.lines(record))  # a record from before them
    path = tmp_path / "old_rates.json"
    path.write_text(json.dumps(record))
    read, _ = rates.read_file(str(path), Experiment(backbone={"tiny": {}}, task="demo_sentiment"))
    assert read["scales"] == {"lora": 2.0, "adapter": 1.0}  # lora's preset s = 2, pfeiffer's add
    assert [line for line in rates.lines(read) if line.startswith("scales: ")] == [
        "scales: lora s=2, adapter s=1, the scales their families' rates were measured at"
    ]


def test_a_family_whose_output_never_starts_at_zero_has_no_reference_scale_to_list():
    """A multi-head adapter's scale is structure (its output does not start at zero), so neither a
    record's scales nor its line name it, not even a record from before that was known."""
    families = {
        "lora": {"prior": 5e-4, "probe": "lora", "rate": 1.5e-3, "tried": [[1.5e-3, 0.8]]},
        "mh_adapter": {"prior": 2e-4, "probe": "mh_pa", "rate": 6e-4, "tried": [[6e-4, 0.8]]},
    }
    assert rates.probe_scales({"families": families}) == {"lora": 2.0}
    old = {
        "rates": {"lora": 1.5e-3, "mh_adapter": 6e-4},
        "factor": 3.0,
        "families": families,
        "runs": 2,
        "trials": 4,
        "cost_s": 60.0,
        "planned": 8,
        "scales": {"lora": 2.0, "mh_adapter": 1.0},
    }
    (line,) = [line for line in rates.lines(old) if line.startswith("scales: ")]
    assert line.startswith("scales: lora s=2, the scales")
    assert not [line for line in rates.lines({**old, "scales": {"mh_adapter": 1.0}}) if line.startswith("scales: ")]


def test_a_study_that_recorded_rates_without_scales_keeps_training_its_modules_as_drawn():
    study = optuna.create_study(directions=["maximize", "minimize"])
    old = {
        "rates": {"lora": 1e-3},
        "families": {"lora": {"prior": 5e-4, "probe": "lora", "rate": 1e-3, "tried": [[1e-3, 0.8]]}},
        "factor": 2.0,
        "runs": 1,
        "trials": 2,
        "cost_s": 1.0,
    }
    study.set_user_attr(rates.SETTING, {"calibrated": True, "spread": 2.0})
    study.set_user_attr(rates.ATTR, old)
    resolved = rates.resolve(study, Experiment(), None, None, None, printer=lambda *a: None)
    assert resolved == old and "scales" not in resolved  # resumed as recorded: nothing folded


def test_runs_left_take_a_family_at_the_edge_of_its_rates_further_while_it_rises():
    peak = lambda best: lambda rate: -abs(math.log(rate / best))  # noqa: E731
    up = [(1e-4, peak(8.1e-3)(1e-4)), (3e-4, peak(8.1e-3)(3e-4)), (9e-4, peak(8.1e-3)(9e-4))]
    assert [r for r, _ in rates.extend(peak(8.1e-3), up, 5)] == pytest.approx(
        [1e-4, 3e-4, 9e-4, 2.7e-3, 8.1e-3, 2.43e-2]
    )
    assert len(rates.extend(peak(8.1e-3), up, 1)) == 4  # no more than the runs left
    inside = [(1e-4, 0.5), (3e-4, 0.7), (9e-4, 0.6)]
    assert rates.extend(peak(8.1e-3), inside, 5) == inside  # a peak inside: nothing to extend
    down = [(1e-4, 0.5), (3e-4, 0.4)]
    assert [r for r, _ in rates.extend(lambda r: 0.6 if r > 2e-5 else 0.55, down, 5)] == pytest.approx(
        [1e-4, 3e-4, 1e-4 / 3, 1e-4 / 9]
    )


def test_a_family_whose_presets_are_over_the_budget_is_measured_on_one_shrunk_to_fit():
    """On MiniLM's shape at 0.5% (113,566) the prefix preset (l=30) is over the budget: the family is
    measured on it with its length halved until it fits, not left to a factor measured on others."""
    from transformers import BertConfig

    from petl_nas.core.budget import count_parameters

    minilm = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    space = SearchSpace.load("unified").with_rate_scale(2.0)
    name, config = rates.probe("prefix", space, minilm, 113_566)
    assert name == "prefix, sizes 15 to fit" and [m.size for m in config.modules] == [15]
    assert count_parameters(minilm, config).deployable <= 113_566
    assert rates.probe("lora", space, minilm, None)[0] == "lora"  # a preset that fits is taken as it is
    assert rates.probe("bitfit", space, minilm, 100) is None  # nothing to shrink
    name, config = rates.probe("compacter", space, minilm, 17_100)  # 12 halved is 6: not a multiple of n=4
    assert name.endswith("sizes 4 to fit") and [m.size for m in config.modules] == [4]  # (an error at 0.01%)
    assert count_parameters(minilm, config).deployable <= 17_100
    assert rates.probe("compacter", space, minilm, 2_271) is None  # 0.01%: the LayerNorms alone are over it
    name, config = rates.probe("ia3", space, minilm, 2_271)  # no size: its bottom layers go
    assert name == "ia3_kv, layers 4-5 to fit" and config.modules[0].layers == (4, 5)  # ia3 on one layer: 2,304
    assert count_parameters(minilm, config).deployable == 2 * 2 * 384 <= 2_271
    name, config = rates.probe("ln", space, minilm, 2_271)
    assert name == "ln_tuning, layers 5 to fit" and count_parameters(minilm, config).deployable == 2 * 2 * 384


def test_a_family_climbs_from_its_paper_rate_times_the_factor_measured_before_it():
    lora = rates.Climb(None, {}, "lora", 5e-4, [(5e-4, 0.737), (1.5e-3, 0.813), (4.5e-3, 0.817)])  # best: 9x
    compacter = rates.Climb(None, {}, "compacter_pp", 1e-3, [(1e-3, 0.80), (3e-3, 0.82), (9e-3, 0.81)])  # best: 3x
    assert rates.factor_so_far({}) == 1.0
    assert rates.factor_so_far({"lora": lora}) == pytest.approx(9.0)
    assert rates.factor_so_far({"lora": lora, "compacter": compacter}) == pytest.approx(math.sqrt(27))


def test_calibration_starts_each_family_from_what_the_families_before_it_measured(monkeypatch):
    """Scripted runs (a score peaking at each family's own rate) on MiniLM's shape: LoRA climbs from
    its paper rate 5e-4 to its peak 4.5e-3 (9x); the adapter then starts at 1e-4 x 9 = 9e-4, not at
    1e-4, and reaches its peak 8.1e-3 with the runs it saved."""
    from transformers import BertConfig

    from petl_nas.core.family_rates import families_of
    from petl_nas.search import worker
    from petl_nas.study.results import TrialResult

    peaks = {
        "lora": 4.5e-3,
        "adapter": 8.1e-3,
        "compacter": 3e-3,
        "prefix": 6e-4,
        "mh_adapter": 1.8e-3,
        "prompt": 3e-3,
        "bitfit": 2.7e-3,
        "lokr": 1.5e-3,
        "ia3": 9e-3,
        "ln": 3e-3,
        "vera": 1.2e-2,
        "fourierft": 5e-2,
    }

    def scripted(spec, **kw):
        family = families_of(PetlConfig.from_dict(spec.config))[0]
        return TrialResult(score=0.9 - abs(math.log(spec.recipe["lr"] / peaks[family])) / 10, score_se=0.01)

    monkeypatch.setattr(worker, "run_trial", scripted)
    minilm = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    exp = tiny_experiment(space="unified", trials=100, rates=Rates(share=0.5))
    space = SearchSpace.load("unified").with_rate_scale(2.0)
    record = rates.calibrate(exp, space, minilm, None, printer=lambda *a: None)
    lora, adapter = record["families"]["lora"], record["families"]["adapter"]
    assert [r for r, _ in lora["tried"]] == pytest.approx([5e-4, 1.5e-3, 4.5e-3, 1.35e-2])
    assert [r for r, _ in adapter["tried"]] == pytest.approx([9e-4, 2.7e-3, 8.1e-3, 2.43e-2])
    assert record["rates"]["lora"] == pytest.approx(4.5e-3) and record["rates"]["adapter"] == pytest.approx(8.1e-3)


@pytest.mark.slow
def test_a_rate_the_length_calibration_already_trained_is_not_trained_again(tmp_path, monkeypatch):
    """`fidelity: auto` trains LoRA at its paper rate and the final length; the rate climb starts at
    the same spec: it takes that run (its score, said so) instead of training it a second time."""
    from petl_nas.search import calibrate, worker
    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import Fidelity, FinalEval

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(calibrate, "pays", lambda *a: False)  # the final length only
    trained = []
    real = worker.run_trial
    for module in (worker, calibrate):  # the rates' runs, the length's runs
        monkeypatch.setattr(module, "run_trial", lambda spec, **kw: trained.append(spec) or real(spec, **kw))
    exp = _calibrated(
        tmp_path,
        presets=["lora"],
        trials=4,
        fidelity=Fidelity(length_buckets=0, k=80, epochs="auto", batch_size=16, max_length=16, search_dev=32),
        final=FinalEval(seeds=0, epochs=2, baselines=False),
    )
    lines = []
    run_search(exp, printer=lines.append)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    length = study.user_attrs["fidelity_calibration"]
    first = next(line for line in lines if line.startswith("  rates: lora (lora) at "))
    lora = next(s for s in length["steps"] if s["epochs"] == 2)["scores"]["lora"]["score"]
    assert first.endswith(
        f": {lora:.4f} ± "
        + first.split(" ± ")[1].split(" ")[0]
        + " (the trial length's calibration run of this spec, not trained again)"
    )
    assert study.user_attrs[rates.ATTR]["families"]["lora"]["tried"][0][1] == lora
    climbed = [s for s in trained if s.config == trained[0].config and s.recipe == trained[0].recipe]
    assert len(climbed) == 1  # that spec trained once, by the length's


def test_calibration_takes_its_share_of_every_run_the_study_plans():
    """A one-shot study (``trials: 0``) still trains its presets, sweep, baselines, proposals,
    confirmation and finals: calibration's share is of all of them, not of the sampler's trials."""
    from petl_nas.study.experiment import Experiment, FinalEval, OneShot

    exp = Experiment(
        strategy="oneshot",
        trials=0,
        oneshot=OneShot(rungs=10),
        final=FinalEval(seeds=3, confirm=3, confirm_seeds=2, baselines=True),
    )
    planned = rates.planned_runs(exp, 13, exp.oneshot.rungs)  # 7 presets and 6 sweep points queued
    assert planned == 13 + 10 + (3 + 1) * 2 + 3 * 2 == 37
    assert rates.allowance(planned, exp.rates.share) == 5 and rates.allowance(0, exp.rates.share) == 2
    no_finals = Experiment(strategy="oneshot", trials=0, final=FinalEval(seeds=0, confirm=3))
    assert rates.planned_runs(no_finals, 13, 10) == 23  # no re-evaluation: no confirmation


def test_a_one_shot_study_calibrates_with_the_share_of_the_runs_it_plans(tmp_path, monkeypatch):
    """The driver passes the runs it plans (queued trials, the ladder's proposals, confirmation,
    finals), not ``trials: 0``, to calibration."""
    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import FinalEval, OneShot

    seen = {}

    class Stop(Exception):
        pass

    def captured(exp, space, model_config, budget, printer, known=(), planned=None):
        seen["planned"] = planned
        raise Stop

    monkeypatch.setattr(rates, "calibrate", captured)
    monkeypatch.chdir(tmp_path)
    exp = _calibrated(
        tmp_path,
        strategy="oneshot",
        trials=0,
        presets=["pfeiffer", "lora"],
        budget="5%",
        oneshot=OneShot(rungs=6),
        final=FinalEval(seeds=2, confirm=2, confirm_seeds=1, baselines=False),
    )
    lines = []
    with pytest.raises(Stop):
        run_search(exp, printer=lines.append)
    queued = int(re.search(r"(\d+) to train besides the supernet's proposals", "\n".join(lines)).group(1))
    assert queued >= 1 and seen["planned"] == rates.planned_runs(exp, queued, 6) == queued + 6 + (2 + 1) * 1 + 2 * 1


def test_the_runs_a_study_plans_buy_more_families_their_own_rate(monkeypatch):
    """Two sampler trials afford 2 calibration runs (LoRA's first climb step); the same study
    planning 40 runs affords 6, and more families are measured rather than guessed."""
    from transformers import BertConfig

    from petl_nas.core.family_rates import families_of
    from petl_nas.search import worker
    from petl_nas.study.results import TrialResult

    def scripted(spec, **kw):  # every family peaks at 1e-3
        assert families_of(PetlConfig.from_dict(spec.config))
        return TrialResult(score=0.9 - abs(math.log(spec.recipe["lr"] / 1e-3)) / 10, score_se=0.01)

    monkeypatch.setattr(worker, "run_trial", scripted)
    minilm = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    exp = tiny_experiment(space="unified", trials=2, rates=Rates())
    space = SearchSpace.load("unified").with_rate_scale(2.0)
    few = rates.calibrate(exp, space, minilm, None, printer=lambda *a: None)
    many = rates.calibrate(exp, space, minilm, None, printer=lambda *a: None, planned=40)
    assert (few["allowed"], few["runs"], many["allowed"]) == (2, 2, 6) and 2 < many["runs"] <= 6
    measured = [f for f, v in many["families"].items() if "tried" in v]
    assert len(measured) > len([f for f, v in few["families"].items() if "tried" in v])


def test_every_family_a_per_budget_baseline_trains_is_measured_on_that_baseline(monkeypatch):
    """At 0.01% of MiniLM (2,271) calibration's share affords 2 runs; each family a per-budget
    baseline trains is measured anyway, on that baseline's own configuration (so its best run is the
    baseline's trial), with one climb step at least; a family only the space draws keeps the
    factor measured on the others."""
    from transformers import BertConfig

    from petl_nas.core.family_rates import families_of
    from petl_nas.search import worker
    from petl_nas.search.baselines import queued_baselines
    from petl_nas.study.results import TrialResult

    def scripted(spec, **kw):  # every family peaks at 3e-3
        assert families_of(PetlConfig.from_dict(spec.config))
        return TrialResult(score=0.9 - abs(math.log(spec.recipe["lr"] / 3e-3)) / 10, score_se=0.01)

    monkeypatch.setattr(worker, "run_trial", scripted)
    minilm = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    exp = tiny_experiment(space="unified", trials=2, rates=Rates(), final=FinalEval(seeds=0, baselines=True))
    space = SearchSpace.load("unified").with_rate_scale(2.0)
    record = rates.calibrate(exp, space, minilm, 2_271, printer=lambda *a: None)
    queued = dict(queued_baselines(minilm, 2_271, 6))
    trained = {families_of(c)[0] for c in queued.values() if len(families_of(c)) == 1}
    assert trained >= {"lora", "prompt", "ia3", "ln", "lokr", "vera", "fourierft"}
    assert record["allowed"] == 2 and set(record["baselines"]) == trained
    for family in trained:
        f = record["families"][family]
        assert len(f["tried"]) >= rates.MIN_RUNS, family
        name, config = rates.probe(family, space, minilm, 2_271, rates.baseline_probes(space, minilm, 2_271)[family])
        assert f["probe"] == name and config == space.with_head(queued[name.split(",")[0]]), family
    assert rates.baseline_probes(space, minilm, 2_271)["prompt"][0] == "prompt_l5"  # 5 tokens, not the preset's 20
    assert "tried" not in record["families"]["adapter"]  # the space's alone: the share is spent


@pytest.mark.slow
def test_a_baseline_that_measured_its_family_is_recorded_from_that_run_not_trained_again(tmp_path):
    """A real tiny study at 0.5% of the tiny BERT: each family a per-budget baseline trains is
    measured on that baseline, and the baseline's trial is calibration's best run of it."""
    from petl_nas.search.driver import run_search

    exp = _calibrated(tmp_path, space="unified", presets="none", budget="0.5%", trials=1, rates=Rates())
    exp = dataclasses.replace(exp, final=FinalEval(seeds=0, baselines=True))
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)
    record = study.user_attrs[rates.ATTR]
    assert {"lora", "prompt", "lokr", "ln", "vera", "fourierft"} <= set(record["baselines"])
    by_name = {t.user_attrs.get("baseline"): t for t in study.trials}
    for family in record["baselines"]:
        name = record["families"][family]["probe"].split(",")[0]
        if name in by_name:  # a preset that fits as it is has no baseline trial of its own name
            assert by_name[name].user_attrs.get("reused") == "calibration", family
