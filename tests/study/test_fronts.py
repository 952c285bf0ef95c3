"""Baseline fronts: the LoRA rank sweep (exact counts, within budget, points of the space with the
sampler's learning rate, on top of the trials, never twice) and how the searched front compares."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution
from transformers import BertConfig

from petl_nas.core.budget import count_parameters
from petl_nas.search.baselines import budget_baselines, family_baselines, lora_sweep, seed_sweep
from petl_nas.study.fronts import compare_to_sweep, group_hypervolumes, hypervolume, pareto, sweep_line
from petl_nas.study.space import SearchSpace

D, FF, L = 384, 1536, 6
CFG = BertConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=6, intermediate_size=FF)


def test_the_sweep_counts_and_fits_the_budget():
    sweep = dict(lora_sweep(CFG, 113_566))
    expected = {f"lora_qv_r{r}": 2 * 2 * r * D * L for r in (1, 2, 4, 8, 16, 32)}  # (A + B) · (q, v)
    expected.update({f"lora_all_r{r}": (4 * 2 * r * D + 2 * r * (D + FF)) * L for r in (1, 2, 4, 8, 16, 32)})
    assert set(sweep) == {n for n, c in expected.items() if c <= 113_566}
    for name, config in sweep.items():
        assert count_parameters(CFG, config).deployable == expected[name]
    assert list(sweep) == sorted(sweep, key=expected.get)  # smallest first


def test_seeding_the_sweep_leaves_the_learning_rate_to_the_sampler():
    space = SearchSpace.load("unified")
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(0))
    n, lines = seed_sweep(study, space, CFG, 113_566, L, families=())
    assert n == 6 and "LoRA rank sweep queued" in lines[0]
    assert seed_sweep(study, space, CFG, 113_566, L, families=()) == (6, [])  # never twice
    trial = study.ask()
    config, recipe = space.sample(trial, L)
    assert trial.user_attrs["baseline"] == "lora_qv_r1" and config.modules[0].size == 1
    fixed = study.get_trials(deepcopy=False)[0].system_attrs["fixed_params"]
    assert "lr" not in fixed and "attn.rank" in fixed and space.globals["lr"].contains(recipe["lr"])
    narrow = optuna.create_study(directions=["maximize", "minimize"])
    _, lines = seed_sweep(narrow, SearchSpace.load("small"), CFG, None, L)  # qv only, r <= 8
    assert "lora_all_r1" in lines[-1] and "skipped" in lines[-1]


def test_at_measured_rates_a_sweep_point_that_is_a_preset_is_not_trained_twice():
    """LoRA r=8 on q, v at LoRA's measured rate is the LoRA preset's trial, point for point (on STS-B
    both trained, and were confirmed and re-evaluated twice): the sweep leaves it to the preset."""
    from petl_nas.search.study import seed_presets

    space = SearchSpace.load("unified").with_rate_scale(2.0)

    def seeded(presets, calibrated=True):
        study = optuna.create_study(directions=["maximize", "minimize"])
        seed_presets(study, space, presets, CFG, 113_566, L, scale=1.0 if calibrated else None)
        n, lines = seed_sweep(study, space, CFG, 113_566, L, calibrated=calibrated, presets=presets, families=())
        return n, lines, {t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False)}

    n, lines, names = seeded(["lora", "bitfit"])
    assert n == 5 and "lora_qv_r8" not in names and "lora_qv_r4" in names
    assert lines[-1] == (
        "LoRA rank sweep: the same configuration and rate as a preset, its trial stands for it: "
        "lora_qv_r8 (the lora preset)"
    )
    assert "lora_qv_r8" in seeded(["bitfit"])[2]  # no LoRA preset: the sweep trains it
    assert "lora_qv_r8" in seeded(["lora"], calibrated=False)[2]  # the sampler picks its rate: another run


def test_below_the_smallest_full_lora_the_baselines_are_built_for_the_budget():
    """0.01% of MiniLM (2,271): no sweep point fits (LoRA r=1 on q, v of 6 layers is 9,216); the
    baselines are the head alone, LoRA r=1 on q, v of the top layer (1,536), prompt tuning of 5
    tokens (1,920); at 0.05% (11,356) the sweep's lora_qv_r1 fits and none are built."""
    per_layer = 2 * 2 * D  # LoRA r=1 on q, v of one layer
    small = dict(budget_baselines(CFG, 2_271, L))
    assert list(small) == ["head_only", "lora_qv_r1_top1", "prompt_l5"]
    counts = {name: count_parameters(CFG, config).deployable for name, config in small.items()}
    assert counts == {"head_only": 0, "lora_qv_r1_top1": per_layer, "prompt_l5": 5 * D}
    assert small["lora_qv_r1_top1"].modules[0].layers == (L - 1,)
    wider = dict(budget_baselines(CFG, 4 * per_layer + 100, L))  # the top 4 layers fit, not 5
    assert "lora_qv_r1_top4" in wider and wider["prompt_l16"].prompt_length == 16  # 6,244 // 384
    below = dict(budget_baselines(CFG, per_layer * L - 1, L))  # BERT's LayerNorms (4 D L + 2 D)
    assert "lora_qv_r1_top5" in below and "layernorms" not in below and "bitfit" not in below  # never fit here
    assert budget_baselines(CFG, 11_356, L) == [] and budget_baselines(CFG, None, L) == []


def test_a_family_baseline_takes_its_largest_shape_within_the_budget():
    """The rule every per-budget baseline is built by (`core.budget.fitted`): the preset as it is
    where it fits; else the most top layers at the smallest size, then the largest size there."""
    from petl_nas.core.budget import fitted
    from petl_nas.core.presets import preset

    lora = preset("lora", CFG)  # r=8 on q, v: 2 · 2 · 8 · D · L
    per_rank_layer = 2 * 2 * D  # r=1 on q, v of one layer
    assert fitted(CFG, lora, None, L) is lora and fitted(CFG, lora, 8 * per_rank_layer * L, L) is lora
    small = fitted(CFG, lora, 2_271, L)  # 0.01% of MiniLM: r=1, top layer
    assert small.modules[0].size == 1 and small.modules[0].layers == (L - 1,)
    assert count_parameters(CFG, small).deployable == per_rank_layer
    mid = fitted(CFG, lora, 30_000, L)  # every layer; r=3, not a power of 2
    assert mid.modules[0].size == 3 and mid.modules[0].layers is None
    assert count_parameters(CFG, mid).deployable == 3 * per_rank_layer * L
    top3 = fitted(CFG, lora, 3 * per_rank_layer + 10, L)
    assert top3.modules[0].layers == (L - 3, L - 2, L - 1) and top3.modules[0].size == 1
    assert fitted(CFG, preset("compacter", CFG), 2_271, L) is None  # its LayerNorms alone are over it
    names = ["lora_ffn", "lora", "compacter", "bitfit"]
    assert list(dict(family_baselines(CFG, 2_271, L, names=names))) == ["lora_r1_top1"]  # nothing else fits
    found = dict(family_baselines(CFG, 4_000, L, names=names))
    assert list(found) == ["lora_r1_top2", "lora_ffn_r1_top1"]  # smallest first
    assert count_parameters(CFG, found["lora_ffn_r1_top1"]).deployable == 2 * (D + FF)
    assert list(dict(family_baselines(CFG, None, L, names=["lora"]))) == ["lora"]


def test_the_probe_of_a_family_no_size_of_which_fits_is_its_per_budget_baseline():
    """At 0.01% no LoRA preset fits at any rank on every layer: its rate is measured on its
    per-budget baseline's shape (the top layer), not left at its paper rate."""
    from petl_nas.search import rates

    space = SearchSpace.load("unified").with_rate_scale(2.0)
    name, config = rates.probe("lora", space, CFG, 2_271)
    assert name == "lora, sizes 1 on the top 1 layers to fit" and config.modules[0].layers == (L - 1,)
    assert count_parameters(CFG, config).deployable == 2 * 2 * D


@pytest.mark.parametrize("calibrated", [False, True])
def test_budget_baselines_are_queued_and_trained_as_given(calibrated):
    """Those the space cannot hold are queued whole (the head alone is a point of it), at the
    families' measured rates or with the sampler's rate, as every baseline; never twice."""
    from petl_nas.search.study import TrialSource

    space = SearchSpace.load("unified").with_rate_scale(2.0) if calibrated else SearchSpace.load("unified")
    study = optuna.create_study(directions=["maximize", "minimize"])
    n, lines = seed_sweep(study, space, CFG, 2_271, L, calibrated=calibrated, presets="auto", families=())
    assert n == 3 and lines[0].startswith("baselines for this budget queued") and "head_only" in lines[0]
    assert seed_sweep(study, space, CFG, 2_271, L, calibrated=calibrated, presets="auto", families=()) == (3, [])
    queued = {t.user_attrs["baseline"]: t for t in study.get_trials(deepcopy=False)}
    assert "petl_config" not in queued["head_only"].user_attrs  # a point of the space
    whole = queued["prompt_l5"].user_attrs
    assert whole["petl_config"]["prompt_length"] == 5
    assert (whole.get("recipe") == {"lr_scale": 1.0}) == calibrated and bool(whole.get("lr_from_sampler")) != calibrated
    prompt = optuna.create_study(directions=["maximize", "minimize"])  # 20 tokens fit: the preset's trial
    _, lines = seed_sweep(prompt, space, CFG, 8_000, L, calibrated=calibrated, presets=["prompt_tuning"], families=())
    assert lines[-1].endswith("its trial stands for it: prompt_l20 (the prompt_tuning preset)")
    source = TrialSource(
        study, space, CFG, 2_271, L, rates={"prompt": 3e-3, "lora": 1e-3, "head": 1e-3} if calibrated else None
    )
    sizes = sorted(source.next().deployable for _ in range(3))
    assert sizes == [0, 2 * 2 * D, 5 * D]


def _study(rows):
    """rows: (score, params, group name or None, se)."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("baseline", {"score": 0.5, "metric": "accuracy", "what": "constant"})
    study.set_user_attr("budget", 10_000)
    for score, n, group, se in rows:
        attrs = {
            "score_se": se,
            **({"baseline": group} if group and group.startswith("lora") else {}),
            **({"preset": group} if group and not group.startswith("lora") else {}),
        }
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": 1e-3},
                distributions={"lr": FloatDistribution(1e-4, 1e-2)},
                values=[score, n],
                user_attrs=attrs,
            )
        )
    return study


def test_the_searched_front_against_the_sweep():
    study = _study(
        [
            (0.80, 100, "lora_qv_r1", 0.01),
            (0.85, 1000, "lora_qv_r8", 0.01),
            (0.83, 90, None, 0.01),
            (0.86, 900, None, 0.01),
            (0.70, 50, "pfeiffer", 0.01),
        ]
    )
    rows = compare_to_sweep(study)
    assert [(r["sweep"], r["searched"], r["higher"], r["beyond_noise"]) for r in rows] == [
        ("lora_qv_r1", 2, True, True),
        ("lora_qv_r8", 3, True, False),
    ]
    hv = group_hypervolumes(study)
    assert hv["searched"] > hv["sweep"] > 0 and "preset" in hv
    assert sweep_line(study).startswith(
        "searched front vs the LoRA rank sweep (search-dev): higher at 2 of 2 sweep sizes, beyond noise at 1"
    )
    assert [t.number for t in pareto(study.trials)] == [4, 2, 3]


def test_a_sweep_whose_points_were_all_pruned_is_named_not_denied():
    study = _study([(0.83, 90, None, 0.01)])
    assert sweep_line(study) is None  # no sweep at all
    for rank in (1, 2):
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState.PRUNED,
                params={"lr": 1e-3},
                distributions={"lr": FloatDistribution(1e-4, 1e-2)},
                user_attrs={"baseline": f"lora_qv_r{rank}"},
            )
        )
    assert sweep_line(study) == (
        "LoRA rank sweep: none of its 2 points completed (2 pruned); nothing to compare the searched front with"
    )


def test_hypervolume_is_the_staircase_area():
    assert hypervolume([(0.8, 10), (0.9, 100)], (0.5, 1000)) == pytest.approx(1 * 0.3 + 1 * 0.4)
    assert hypervolume([(0.4, 10)], (0.5, 1000)) == 0.0  # below the floor


def test_pareto_drops_a_point_with_the_same_score_and_more_parameters():
    points = [(0.80, 100), (0.80, 200), (0.90, 300), (0.85, 400)]
    assert pareto(points, score=lambda p: p[0], size=lambda p: p[1]) == [(0.80, 100), (0.90, 300)]


def test_a_searched_trial_of_the_sweep_points_own_size_is_compared_with_it():
    (row,) = compare_to_sweep(_study([(0.80, 9216, "lora_qv_r1", 0.01), (0.86, 9216, None, 0.01)]))
    assert (row["searched"], row["higher"], row["beyond_noise"]) == (1, True, True)


def test_a_sweep_point_of_exactly_the_budget_fits():
    """A budget admits configurations up to and including its count: lora_qv_r1 on this backbone
    is (A + B) on q and v, 2·2·1·384·6 = 9,216 deployable parameters."""
    cfg = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536)
    assert [name for name, _ in lora_sweep(cfg, 9_216)] == ["lora_qv_r1"]
    assert lora_sweep(cfg, 9_215) == []


def test_each_of_todays_methods_is_a_baseline_wherever_a_shape_of_it_fits():
    """The given suite's budgets on all-MiniLM-L6-v2's shape (0.01%, 0.05%, 0.5% of 22,713,216):
    every family marked ``budget_baseline`` that fits in some shape is a baseline, at the largest
    shape that fits; counts are the papers' formulas."""
    qv = 2  # adapted weights per layer (q, v)
    expected = {
        2_271: {
            "ia3_kv_top2": 2 * qv * D,
            "ln_tuning_top1": 2 * 2 * D,
            "lokr_r2_top3": 3 * qv * (16 * 16 + 2 * 2 * 24),
            "vera_r183_top2": 2 * qv * (D + 183),
            "fourierft_n189": 189 * qv * L,
        },
        11_357: {
            "ia3_kv": qv * D * L,
            "lokr": L * qv * (16 * 16 + 8 * 2 * 24),
            "dora_r1_top4": 4 * qv * (2 * D + D),
            "ia3_top4": 4 * (2 * D + FF),
            "ln_tuning": 2 * 2 * D * L,
            "vera_r562": L * qv * (D + 562),
            "fourierft_n946": 946 * qv * L,
        },
        113_566: {
            "ia3_kv": qv * D * L,
            "lokr": L * qv * (16 * 16 + 8 * 2 * 24),
            "ln_tuning": 2 * 2 * D * L,
            "fourierft": 1000 * qv * L,
            "ia3": (2 * D + FF) * L,
            "vera": L * qv * (D + 1024),
            "dora": L * qv * (8 * 2 * D + D),
        },
    }
    for budget, names in expected.items():
        found = dict(family_baselines(CFG, budget, L))
        assert {n: count_parameters(CFG, c).deployable for n, c in found.items()} == names, budget
        assert all(n <= budget for n in names.values())
