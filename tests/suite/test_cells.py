"""The suite's table tells a study not run yet, running, and finished with nothing learned apart,
compares the pick with the best baseline and with the best of the 2021–22 methods, names the
winning families, and the finals train that older baseline, on resume too."""

from __future__ import annotations

import dataclasses
import statistics
import time
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from test_search import experiment

from petl_nas.core.config import ModuleSpec, PetlConfig
from petl_nas.core.eras import family_name, uses_recent_method
from petl_nas.search import finals
from petl_nas.search.baselines import best_2022_baseline
from petl_nas.search.specs import trial_recipe
from petl_nas.study.experiment import FinalEval
from petl_nas.study.records import mark_finished, record_session, run_state
from petl_nas.suite.cells import cell, empty, macro, markdown, plot_notes, plot_png

LORA = PetlConfig(modules=(ModuleSpec(form="lora", targets=("q", "v"), size=2),))
VERA = PetlConfig(modules=(ModuleSpec(form="vera", targets=("q", "v"), size=256),))
DORA = PetlConfig(modules=(ModuleSpec(form="lora", targets=("q", "v"), size=1, dora=True),))
LORA_R1 = PetlConfig(modules=(ModuleSpec(form="lora", targets=("q", "v"), size=1),), prompt_length=4)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def add(study, score: float, params: int, config: PetlConfig, state=TrialState.COMPLETE, **attrs) -> None:
    done = state == TrialState.COMPLETE
    trial = create_trial(
        state=state,
        values=[score, float(params)] if done else None,
        params={"x": 0.5},
        distributions={"x": FloatDistribution(0, 1)},
        user_attrs={"petl_config": config.to_dict(), **attrs},
    )
    if attrs.get("did_not_learn"):
        trial.set_constraint("learned", 1.0)  # as the search stores it: off the front
    study.add_trial(trial)


def four_kinds() -> optuna.Study:
    """A searched LoRA (0), the VeRA preset (1, the best baseline), LoRA r=1 with a prompt (2, the
    best 2022 baseline) and DoRA (3, a 2024 one); 0 and 1 confirmed, 0 beating 1 on every seed."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for key, value in {
        "metric": "accuracy",
        "budget": 10_000,
        "baseline": {"score": 0.5},
        "final": {"confirm": 2, "confirm_baselines": 1},
        "confirm:0": [0.90, 0.91],
        "confirm:1": [0.85, 0.86],
    }.items():
        study.set_user_attr(key, value)
    add(study, 0.90, 3000, LORA)
    add(study, 0.85, 7680, VERA, preset="vera")
    add(study, 0.80, 2000, LORA_R1, baseline="lora_qv_r1_prompt")
    add(study, 0.82, 1500, DORA, baseline="dora_qv_r1")
    return study


def test_a_configuration_is_of_2023_24_where_it_uses_a_form_added_then_or_dora():
    assert [uses_recent_method(c) for c in (LORA, VERA, DORA, LORA_R1, PetlConfig())] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert [family_name(c) for c in (LORA, VERA, DORA, LORA_R1, PetlConfig())] == [
        "lora",
        "vera",
        "dora",
        "lora + prompt",
        "head only",
    ]
    assert family_name(PetlConfig(train_layernorms=True, bitfit=True)) == "bitfit + layernorms"


def test_the_best_2022_baseline_leaves_out_todays_methods_and_prefers_a_confirmed_mean():
    study = four_kinds()
    assert best_2022_baseline(study).number == 2  # VeRA and DoRA score higher: of 2023-24
    add(study, 0.99, 100, PetlConfig(bitfit=True), preset="bitfit", did_not_learn=True)
    assert best_2022_baseline(study).number == 2  # one that did not learn is not the best
    add(study, 0.79, 900, PetlConfig(prompt_length=2), preset="prompt_tuning")
    study.set_user_attr("final", {"confirm": 6, "confirm_baselines": 6})
    study.set_user_attr("confirm:5", [0.79, 0.80])  # confirmed beats a higher single score
    assert best_2022_baseline(study).number == 5
    assert best_2022_baseline(optuna.create_study(directions=["maximize", "minimize"])) is None


def with_finals(study, numbers, seeds=(0.80, 0.82)) -> None:
    for n in numbers:
        scores = [s + 0.01 * n for s in seeds]
        study.set_user_attr(f"final:{n}", {"mean": statistics.fmean(scores), "scores": scores})


def test_a_cell_has_the_paired_delta_to_both_best_baselines_and_their_families():
    study = four_kinds()
    with_finals(study, (0, 1, 2))
    mark_finished(study, True)
    row = cell(study, "sst2", "0.05%")
    assert row["state"] == "measured"
    assert (row["pick"]["number"], row["baseline"]["number"], row["baseline_2022"]["number"]) == (0, 1, 2)
    assert (row["pick"]["family"], row["baseline"]["family"], row["baseline_2022"]["family"]) == (
        "lora",
        "vera",
        "lora + prompt",
    )
    assert row["delta"]["mean"] == pytest.approx(-1.0) and row["delta_2022"]["mean"] == pytest.approx(-2.0)
    text = markdown("s", [row, empty("cola", "0.05%")])
    assert (
        "| sst2 | 0.05% (10,000) | measured | trial 0 (searched, 3,000) | lora | 81.00 ± 1.41 | "
        "trial 1 (vera, 7,680) | vera | 82.00 ± 1.41 | -1.00 ± 0.00 | 2 | trial 2 (lora_qv_r1_prompt, 2,000) | "
        "lora + prompt | 83.00 ± 1.41 | -2.00 ± 0.00 | yes |"
    ) in text
    assert "| 0.05% | -1.00 ± 0.00 | -1.00 | 1 of 2 | -2.00 ± 0.00 | -2.00 | 1 of 2 |" in text
    assert [m["mean"] for m in macro([row], "delta_2022")] == [pytest.approx(-2.0)]


def test_a_cell_not_run_running_or_finished_with_nothing_learned_says_which():
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("metric", "accuracy")
    study.set_user_attr("baseline", {"score": 0.6912})
    add(study, 0.70, 2000, LORA, did_not_learn=True)
    add(study, 0.65, 1000, LORA_R1, baseline="lora_qv_r1_prompt", did_not_learn=True)
    assert run_state(study) == "running"  # nothing recorded yet: a first run goes on
    record_session(study, time.time() - 60)
    assert run_state(study) == "finished"  # a study from before the mark: its run recorded
    mark_finished(study, False)
    assert run_state(study) == "running"  # a run that started and has not ended
    mark_finished(study, True)
    assert run_state(study) == "finished"
    add(study, 0.0, 0, LORA, state=TrialState.RUNNING)
    assert cell(study, "cola", "0.01%")["state"] == "running"  # resumed: a trial runs
    study.tell(study.trials[-1].number, state=TrialState.FAIL)
    row = cell(study, "cola", "0.01%")
    assert row["state"] == "nothing learned" and row["delta"] is None
    text = markdown("s", [row, empty("cola", "0.05%"), empty("sst2", "0.01%", "running")])
    assert "| cola | 0.01% | nothing learned (best search-dev 70.00, trivial 69.12) | - |" in text
    assert "| cola | 0.05% | not run yet | - |" in text and "| sst2 | 0.01% | running | - |" in text
    cells = [row, empty("cola", "0.05%"), empty("sst2", "0.01%", "running")]
    assert plot_notes(cells) == [
        (0, 0, "cola: nothing learned (best search-dev 70.00, trivial 69.12)"),
        (1, 0, "cola: not run yet"),
        (0, 1, "sst2: running"),
    ]
    assert plot_png(cells).startswith(b"\x89PNG")


def finals_study(tmp_path, done=()):
    exp = experiment(
        tmp_path,
        final=FinalEval(seeds=2, epochs=1, max_front=1, presets="none", confirm=2, confirm_seeds=1, baselines=False),
    )
    study = four_kinds()
    with_finals(study, done)
    return exp, study


def scripted_finals(monkeypatch) -> list:
    """The final runs asked for, as (trial number, seed); each scores 0.8."""
    asked = []

    def run_all(specs, labels, where, stage, run):
        for i, spec in enumerate(specs):
            asked.append((spec.number, spec.recipe["seed"]))
            yield i, SimpleNamespace(history=[{"accuracy": 0.8}])

    monkeypatch.setattr(finals, "run_all", run_all)
    return asked


@pytest.mark.slow
def test_the_finals_train_the_best_2022_baseline_on_the_picks_seeds_and_resume_trains_just_those(tmp_path, monkeypatch):
    asked = scripted_finals(monkeypatch)
    exp, study = finals_study(tmp_path, done=(0, 1))  # finished before the 2022 baseline was asked for
    task = SimpleNamespace(main_metric="accuracy", customary_metric="accuracy")
    recipe = trial_recipe(exp)
    finals.reevaluate_front(study, exp, task, recipe, printer=lambda line: None)
    assert sorted(asked) == [(2, 0), (2, 1)]  # only the missing ones, the pick's seeds
    assert study.user_attrs["final:2"]["scores"] == [0.8, 0.8]
    asked.clear()
    finals.reevaluate_front(study, exp, task, recipe, printer=lambda line: None)
    assert asked == []  # nothing trained twice
    exp, study = finals_study(tmp_path)
    finals.reevaluate_front(study, exp, task, dataclasses.replace(recipe), printer=lambda line: None)
    assert sorted({n for n, _ in asked}) == [0, 1, 2]
