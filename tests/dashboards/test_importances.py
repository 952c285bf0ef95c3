"""Parameter importances are shown only when the trials can support them: 20 sampled complete trials
at least, and scores that spread beyond the noise of one score (twice its median standard error);
otherwise the report says which of the two is missing, in one line, and draws no figure."""

import html

import numpy as np
import optuna
import pytest
from optuna.trial import create_trial

from petl_nas.dashboards import view
from petl_nas.dashboards.report import write_report

DISTS = {
    "lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True),
    "ffn.form": optuna.distributions.CategoricalDistribution(["adapter", "lora"]),
}


def study_of(n, effect, noise, se, storage=None):
    """``n`` sampled trials whose score rises by ``effect`` when lr > 1e-3, plus Gaussian ``noise``;
    each stores ``se`` as its score's standard error (None: stores none)."""
    study = optuna.create_study(study_name="imp", storage=storage, directions=["maximize", "minimize"])
    study.set_user_attr("metric", "accuracy")
    rng = np.random.default_rng(0)
    for i in range(n):
        lr, form = float(10 ** rng.uniform(-5, -2)), ["adapter", "lora"][i % 2]
        score = 0.7 + effect * (lr > 1e-3) + noise * float(rng.standard_normal())
        attrs = {"petl_config": {"modules": [{"form": form, "position": "ffn", "size": 4}]}, "recipe": {"lr": lr}}
        study.add_trial(
            create_trial(
                values=[score, 1000 + i],
                params={"lr": lr, "ffn.form": form},
                distributions=DISTS,
                user_attrs=attrs | ({"score_se": se} if se else {}),
            )
        )
    return study


@pytest.mark.parametrize("n", [8, 19])
def test_fewer_than_20_trials_get_no_ranking(n):
    """The quickstart's 8 trials ranked attn.scale at 0.49: PED-ANOVA's top 10% was one trial."""
    assert view.importances(study_of(n, effect=0.2, noise=0.01, se=0.01)) == (
        [],
        f"not shown: {n} complete trials with sampled parameters; importance needs at least 20",
    )


def test_scores_that_spread_within_their_noise_get_no_ranking():
    ranked, note = view.importances(study_of(30, effect=0.0, noise=0.004, se=0.012))
    assert ranked == []
    assert note.startswith("not shown: the scores' spread (sd 0.00")
    assert note.endswith("is within 2x the noise of one score (median se 0.012), so a ranking would rank noise")


def test_a_spread_just_inside_twice_the_noise_is_refused_and_just_beyond_it_is_shown():
    trials = study_of(30, effect=0.0, noise=0.01, se=None).trials
    sd = float(np.std([t.values[0] for t in trials], ddof=1))
    for t in trials:
        t.user_attrs["score_se"] = sd / 2 * 1.01  # sd < 2·se: noise
    assert view.importance_refusal(trials).startswith("the scores' spread")
    for t in trials:
        t.user_attrs["score_se"] = sd / 2 * 0.99  # sd > 2·se: beyond it
    assert view.importance_refusal(trials) is None


def test_twenty_trials_with_a_real_spread_are_ranked():
    ranked, note = view.importances(study_of(20, effect=0.2, noise=0.01, se=0.012))
    assert ranked[0][0] == "lr" and note.startswith("PED-ANOVA") and note.endswith("by search score")


def test_scores_without_standard_errors_are_ranked_and_the_note_says_noise_was_not_ruled_out():
    ranked, note = view.importances(study_of(30, effect=0.0, noise=0.004, se=None))
    assert ranked and note.endswith("; no standard errors stored: noise not ruled out")


def test_the_report_says_why_instead_of_drawing_the_figure(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    study = study_of(30, effect=0.0, noise=0.004, se=0.012, storage=url)
    write_report(url, "imp", tmp_path / "r")
    assert not (tmp_path / "r" / "importance.png").exists()
    _, note = view.importances(study)
    assert f"<p class='note'>{html.escape(note)}</p>" in (tmp_path / "r" / "report.html").read_text()
