"""petl-nas report: on a real tiny search it writes a self-contained report.html and PNGs of known
size; the HTML holds the front's trials, the presets and the re-evaluations; headless Chromium
renders it with its figures; hypervolume agrees with Optuna's; bad input writes nothing."""

import base64
import html
import os
import re
import shutil
import struct
import subprocess
import uuid

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState, create_trial
from sqlalchemy.engine import make_url

from petl_nas.app.cli import main
from petl_nas.dashboards import plots, view
from petl_nas.dashboards.report import write_report
from petl_nas.errors import ConfigError
from petl_nas.study.records import sessions

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@pytest.fixture
def searched(small_study):
    return small_study


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_search_trials_carry_the_dashboard_attributes(searched):
    _, study, _ = searched
    trained = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert trained
    for t in trained:
        u = t.user_attrs
        assert {"deployable", "trainable", "pct_of_backbone", "config_text", "wall_s", "train_s", "peak_mem_mb"} <= set(
            u
        )
        assert u["epochs"] == 1 and u["k"] == 160  # the fidelity it was trained at
        assert u["wall_s"] >= u["train_s"] > 0
    assert {t.user_attrs.get("preset") for t in trained} >= {"pfeiffer", "bitfit"}
    pfeiffer = next(t for t in trained if t.user_attrs.get("preset") == "pfeiffer")
    assert pfeiffer.user_attrs["config_text"] == "ffn adapter r=2 sequential relu"  # r = d/16, d = 32
    rejected = [t for t in study.trials if t.user_attrs.get("rejected")]
    assert all("config_text" in t.user_attrs for t in rejected)


def test_report_writes_a_self_contained_html_and_pngs(searched, tmp_path, capsys):
    url, study, _ = searched
    out = tmp_path / "report"
    assert main(["report", "--storage", url, "-o", str(out)]) == 0  # --study left out: one study
    assert "report.html" in capsys.readouterr().out
    pngs = sorted(p.name[:-4] for p in out.glob("*.png"))
    # A search this small (fewer than 20 sampled trials, scores within noise: a frozen random backbone
    # learns little in one epoch) gets no importances: the page says why instead of showing a figure.
    assert pngs in (["forms", "hypervolume", "importance", "pareto"], ["forms", "hypervolume", "pareto"])
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{n}.png" for n in pngs] + ["report.html"])
    for name in pngs:
        assert png_size((out / f"{name}.png").read_bytes()) == plots.SIZES[name]
    assert plots.SIZES["pareto"] == (1000, 600)
    page = (out / "report.html").read_text()
    (session,) = sessions(study.user_attrs)  # the one run of the search, its wall time
    assert (
        f"<tr><th>wall time</th><td>{session['wall_s'] / 60:.1f} min over 1 run of the search, the first from "
        f"{session['started']}</td></tr>"
    ) in page
    assert "importance" in pngs or "<p class='note'>not shown: " in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched from a network
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == len(pngs) and base64.b64decode(images[0]) == (out / "pareto.png").read_bytes()
    for t in study.best_trials:  # the front, as a table
        row = re.search(rf'<tr id="front-trial-{t.number}">(.*?)</tr>', page).group(1)
        assert t.user_attrs["config_text"] in row and f"{int(t.values[1]):,}" in row
    front_rows = re.findall(r'<tr id="front-trial-(\d+)"', page)
    assert sorted(map(int, front_rows)) == sorted(t.number for t in study.best_trials)
    for key, final in ((k, v) for k, v in study.user_attrs.items() if k.startswith("final:")):
        assert f"{final['mean']:.4f} ± {final['std']:.4f} (2 seeds)" in page
    assert 'id="presets-trial-' in page and "pfeiffer" in page and "bitfit" in page
    baseline = study.user_attrs["baseline"]["score"]  # the hypervolume's reference: named as what it is
    assert f"from the reference point (accuracy {baseline:.4g}: the trivial baseline;" in page
    shift = study.user_attrs["input_shift"]  # search-dev against test
    assert (
        f"<th>inputs: search-dev vs test</th><td>inputs: search-dev rows have a median of {shift['search_dev_words']:g}"
    ) in page


def test_chromium_renders_the_report(searched, tmp_path):
    chromium = os.environ.get("PETL_NAS_CHROMIUM")
    if not chromium or not shutil.which(chromium):
        pytest.skip("set PETL_NAS_CHROMIUM to a headless Chromium to run the browser check")
    from PIL import Image

    url, study, _ = searched
    out = tmp_path / "report"
    write_report(url, "rep", out)
    page = (out / "report.html").as_uri()
    flags = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1200,1400"]
    dom = subprocess.run([*flags, "--dump-dom", page], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = " ".join(re.sub(r"<[^>]+>", " ", dom.stdout).split())
    assert "Study rep" in text and "Pareto front" in text
    assert all(f"front-trial-{t.number}" in dom.stdout for t in study.best_trials)
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", page], capture_output=True, timeout=180, check=True)
    r, g, b = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int).T
    orange = (r > 220) & (g > 90) & (g < 170) & (b < 80)  # the preset markers
    red = (r > 180) & (g < 110) & (b < 110)  # the budget line
    assert orange.sum() > 20 and red.sum() > 100, "the Pareto figure did not render in the browser"


def test_report_errors_write_nothing(searched, tmp_path, capsys):
    url, _, d = searched
    out = tmp_path / "out"
    assert main(["report", "--storage", url, "--study", "nope", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "study 'nope' is not in" in err and "rep" in err
    assert main(["report", "--storage", f"sqlite:///{d}/missing.db", "-o", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert not (d / "missing.db").exists() and not out.exists()
    empty = f"sqlite:///{tmp_path}/two.db"
    for name in ("a", "b"):
        optuna.create_study(study_name=name, storage=empty, directions=["maximize", "minimize"])
    assert main(["report", "--storage", empty, "-o", str(out)]) == 2
    assert "holds 2 studies (a, b); name one with --study" in capsys.readouterr().err
    assert main(["report", "--storage", empty, "--study", "a", "-o", str(out)]) == 2
    assert "has no complete trial yet" in capsys.readouterr().err
    assert not out.exists()


def test_a_head_only_trial_is_inside_the_pareto_plot():
    from types import SimpleNamespace

    points = [SimpleNamespace(deployable=n) for n in (0, 836, 2_048)]
    (scale, _), (left, right) = plots.x_axis(SimpleNamespace(points=points, budget=1_862))
    assert scale == "symlog" and left < 0 < 836 and right > 2_048  # 0 drawn, not off a log axis
    (scale, _), (left, _) = plots.x_axis(SimpleNamespace(points=points[1:], budget=1_862))
    assert scale == "log" and 0 < left < 836


@pytest.mark.parametrize("sizes, has_top", [((0, 836, 2_048), False), ((836, 2_048), True)])
def test_the_percent_axis_is_drawn_only_where_it_maps_right(monkeypatch, sizes, has_top):
    """On a symlog x axis (a head-only trial at 0) matplotlib would map a secondary axis linearly:
    the % of the backbone stays in the budget line's label instead of a wrong top axis."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("backbone_params", 37_248)
    study.set_user_attr("budget", 1_862)
    for i, n in enumerate(sizes):
        study.add_trial(create_trial(values=[0.6 + 0.1 * i, n], user_attrs={"config_text": f"config of {n}"}))
    figures = []
    monkeypatch.setattr(plots, "_png", lambda fig: figures.append(fig) or b"")
    plots.pareto(view.study_view(study, "sqlite://"))
    labels = [a.get_xlabel() for a in figures[0].axes[0].child_axes]
    assert ("% of the backbone's parameters" in labels) == has_top


def test_hypervolume_agrees_with_optuna():
    from optuna._hypervolume import compute_hypervolume  # the reference (private, tests only)

    rng = np.random.default_rng(0)
    points = [(float(s), int(n)) for s, n in zip(rng.uniform(0.5, 0.9, 40), rng.integers(1_000, 100_000, 40))]
    ref = (0.5, 100_000)
    losses = np.array([[-s, np.log10(n)] for s, n in points])
    assert view.hypervolume(points, ref) == pytest.approx(compute_hypervolume(losses, np.array([-0.5, 5.0])))
    assert view.hypervolume([(0.6, 1_000)], ref) == pytest.approx(0.1 * 2)  # 0.1 × two decades
    assert view.hypervolume([(0.4, 10), (0.7, 200_000)], ref) == 0.0  # beyond the reference


def test_a_trial_that_did_not_learn_adds_no_hypervolume():
    """Within noise of the trivial baseline is not above it: such a trial adds nothing, as in the
    summary's group hypervolumes (`fronts.group_hypervolumes`)."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("baseline", {"score": 0.55, "what": "constant"})
    study.set_user_attr("budget", 100_000)
    for score, n, flat in ((0.57, 1_000, True), (0.70, 10_000, False)):
        study.add_trial(create_trial(values=[score, n], user_attrs={"config_text": "c", "did_not_learn": flat}))
    history = view.hypervolume_history(view.study_view(study, "sqlite://"))
    assert [hv for _, hv in history["by_number"]] == [0.0, pytest.approx(0.15 * 1)]  # 0.15 × one decade


def test_front_and_importances_on_a_larger_study(tmp_path):
    """A hand-made study with spread scores: the front table holds exactly the non-dominated trials;
    importances are ranked; too few trials give a note, not an error."""
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="big", storage=url, directions=["maximize", "minimize"])
    study.set_user_attr("metric", "accuracy")
    rng = np.random.default_rng(1)
    dists = {
        "lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True),
        "ffn.form": optuna.distributions.CategoricalDistribution(["adapter", "lora"]),
        "ffn.rank": optuna.distributions.IntDistribution(1, 64),
    }
    for i in range(24):
        lr, form, size = float(10 ** rng.uniform(-5, -2)), ["adapter", "lora"][i % 2], int(rng.integers(1, 64))
        score = 0.6 + 0.3 * (lr > 1e-3) + 0.02 * rng.random()  # lr decides the score
        params = {"lr": lr, "ffn.form": form} | ({"ffn.rank": size} if form == "lora" else {})
        config = {"modules": [{"form": form, "position": "ffn", "size": size}]}
        study.add_trial(
            create_trial(
                values=[score, 100 * size],
                params=params,
                distributions={k: dists[k] for k in params},
                user_attrs={"petl_config": config, "recipe": {"lr": lr}, "score_se": 0.01},
            )
        )
    ranked, note = view.importances(study)
    assert ranked[0][0] == "lr" and "PED-ANOVA" in note
    write_report(url, "big", tmp_path / "r")
    assert png_size((tmp_path / "r" / "importance.png").read_bytes()) == plots.SIZES["importance"]
    page = (tmp_path / "r" / "report.html").read_text()
    assert sorted(map(int, re.findall(r'<tr id="front-trial-(\d+)"', page))) == sorted(
        t.number for t in study.best_trials
    )
    assert len(study.best_trials) < 24
    small = optuna.create_study(directions=["maximize", "minimize"])
    small.add_trials(study.trials[:3])
    assert view.importances(small) == (
        [],
        "not shown: 3 complete trials with sampled parameters; importance needs at least 20",
    )


def test_the_report_names_what_proposed_each_trial_as_the_summary_does(tmp_path):
    """A sweep point, a warm start, a sampled trial and a one-shot proposal built on a baseline: their
    source column reads lora_qv_r2, warm start, – and one-shot on lora_qv_r1 (the summary's
    `source_of`), not the preset column's – for all."""
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="src", storage=url, directions=["maximize", "minimize"])
    study.set_user_attr("metric", "accuracy")
    config = {"modules": [{"form": "lora", "position": "attn", "size": 2}]}
    dist = {"lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)}
    for score, size, attrs in [
        (0.7, 100, {"baseline": "lora_qv_r2"}),
        (0.8, 200, {"warm_start": "old trial 3"}),
        (0.9, 300, {}),
        (0.95, 400, {"oneshot": "oneshot-0", "oneshot_anchor": "lora_qv_r1"}),
    ]:
        study.add_trial(
            create_trial(
                values=[score, size],
                params={"lr": 1e-3},
                distributions=dist,
                user_attrs={"petl_config": config, "recipe": {"lr": 1e-3}, **attrs},
            )
        )
    write_report(url, "src", tmp_path / "r")
    page = (tmp_path / "r" / "report.html").read_text()
    sources = dict(re.findall(r'<tr id="front-trial-(\d+)"><td class="n">\d+</td><td>([^<]*)</td>', page))
    assert sources == {"0": "lora_qv_r2", "1": "warm start", "2": "–", "3": "one-shot on lora_qv_r1"}


def test_the_report_shows_the_confirmed_means_as_the_summary_does(tmp_path):
    """final.confirm's trials: the facts name them, each search score has the confirmed mean beside it
    in the summary's words, and the one off the front has its own table, not a front row."""
    from test_confirm import confirmed_study

    url = f"sqlite:///{tmp_path}/s.db"
    confirmed_study(url)
    write_report(url, "confirmed", tmp_path / "r")
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<tr><th>final.confirm</th><td>trials 0, 1 re-trained with extra seeds on search-dev;" in page
    assert re.findall(r'<tr id="front-trial-(\d+)"', page) == ["2", "0"]
    assert "<td class='n'>0.9000<br>confirmed: mean 0.6333 over 3 seeds</td>" in page
    assert (
        '<h2>Confirmed by final.confirm, off the front</h2>' in page
        and '<tr id="confirmed-trial-1">' in page
        and "<td class='n'>0.8000<br>confirmed: mean 0.8267 over 3 seeds, off the front</td>" in page
    )


def test_the_report_opens_with_the_plot_then_the_pick_and_the_front(searched, tmp_path):
    """The Pareto plot comes first, then the pick (the trial export writes by default, with its command)
    and the front's table, then the study's facts; the page names the trial `export.choose` picks, or
    why it picks none (the tiny study's trials learn too little)."""
    from petl_nas.deploy.export import choose

    def opening(page: str) -> dict[str, int]:
        marks = {
            "plot": 'id="fig-pareto"',
            "pick": "<p id='pick'>",
            "front": '<table id="front">',
            "facts": '<table class="facts">',
        }
        return {name: page.index(mark) for name, mark in marks.items()}

    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="picked", storage=url, directions=["maximize", "minimize"])
    study.set_user_attr("metric", "accuracy")
    dist = {"lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)}
    for score, size in [(0.7, 100), (0.9, 300), (0.8, 200)]:
        config = {"modules": [{"form": "lora", "position": "attn", "size": size // 100}]}
        study.add_trial(
            create_trial(
                values=[score, size],
                params={"lr": 1e-3},
                distributions=dist,
                user_attrs={"petl_config": config, "recipe": {"lr": 1e-3}},
            )
        )
    page = write_report(url, "picked", tmp_path / "r")[-1].read_text()
    at = opening(page)
    assert list(at) == sorted(at, key=at.get), at
    before_plot = re.sub(r"<style>.*?</style>|<[^>]+>", " ", page[: at["plot"]], flags=re.S).split()
    assert len(before_plot) < 40, " ".join(before_plot)
    pick = page[at["pick"] : page.index("</p>", at["pick"])]
    assert choose(study).number == 1 and "trial 1, attn LoRA r=3" in pick and "search accuracy 0.9000" in pick
    assert f"petl-nas export --storage {url} -o best.yaml" in pick

    page = write_report(searched[0], "rep", tmp_path / "tiny")[-1].read_text()
    at = opening(page)
    assert list(at) == sorted(at, key=at.get), at
    try:
        said = f"<strong>The pick:</strong> trial {choose(searched[1]).number}, "
    except ConfigError as e:
        said = f"<strong>The pick:</strong> none; {html.escape(str(e))}."
    assert said in page


def test_report_on_postgresql(tmp_path):
    url = os.environ.get("PETL_NAS_TEST_POSTGRES")
    if not url:
        pytest.skip("set PETL_NAS_TEST_POSTGRES to a PostgreSQL URL")
    name = f"report_{uuid.uuid4().hex[:8]}"
    study = optuna.create_study(study_name=name, storage=url, directions=["maximize", "minimize"])
    try:
        for score, n in ((0.7, 500), (0.8, 900), (0.75, 2_000)):
            study.add_trial(create_trial(values=[score, n], user_attrs={"config_text": f"config of {n}"}))
        write_report(url, name, tmp_path / "r")
        page = (tmp_path / "r" / "report.html").read_text()
        assert re.findall(r'<tr id="front-trial-(\d+)"', page) == ["0", "1"]
        assert "config of 500" in page
        password = make_url(url).password
        assert not password or f":{password}@" not in page  # never written out
    finally:
        optuna.delete_study(study_name=name, storage=url)
