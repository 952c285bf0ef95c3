"""Export, train and load: the documented choice under several budgets, round-trips, weights the
size of the deployable count, identical logits after loading, and clear errors that write nothing."""

import json
import re

import optuna
import pytest
import torch
from conftest import NO_RATES, TINY_BACKBONE
from optuna.distributions import FloatDistribution
from safetensors.torch import load_file
from transformers import BartConfig, BertConfig

from petl_nas import ConfigError, ModuleSpec, PetlConfig, preset
from petl_nas.deploy.export import choose, read_record, record, write_record
from petl_nas.deploy.interop import NotExpressible, to_adapters, to_peft

LORA = PetlConfig(modules=(ModuleSpec(form="lora", size=2, scale=2.0),)).to_dict()


def make_study(url, rows, finals=()):
    """A study by hand: rows are (score, deployable, preset)."""
    study = optuna.create_study(study_name="s", storage=url, directions=["maximize", "minimize"])
    for k, v in {
        "backbone": json.dumps(TINY_BACKBONE),
        "task": "demo_sentiment",
        "task_spec": "demo_sentiment",
        "metric": "accuracy",
        "backbone_params": 10_000,
        "space_name": "small",
        "space_hash": "abc",
        "fidelity": {"k": 200, "batch_size": 32, "max_length": 24},
        "data_seed": 111,
        "final": {"seeds": 1, "epochs": 1, "k": -1},
    }.items():
        study.set_user_attr(k, v)
    for score, n, name in rows:
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": 1e-3},
                distributions={"lr": FloatDistribution(1e-4, 1e-2)},
                values=[score, n],
                user_attrs={
                    "petl_config": PetlConfig(bitfit=True).to_dict() if name == "bitfit" else LORA,
                    "deployable": n,
                    "trainable": n,
                    "recipe": {"lr": 3e-3},
                    **({"preset": name} if name else {}),
                },
            )
        )
    for number, mean in finals:
        study.set_user_attr(f"final:{number}", {"mean": mean, "std": 0.01, "scores": [mean]})
    return study


ROWS = [(0.80, 100, None), (0.85, 1000, None), (0.86, 5000, None), (0.70, 50, "bitfit"), (0.75, 2000, None)]


def test_margins_are_points_of_rouge_and_bleu_as_written():
    """ROUGE and BLEU are 0-100 already: smallest-within=7 is 7 of their points, not 0.07."""
    study = make_study("sqlite://", [(6.89, 2964, None), (0.5, 768, None), (4.0, 1500, None)])
    study.set_user_attr("metric", "rougeL")
    assert choose(study, pick="smallest-within=7").number == 1
    assert choose(study, pick="smallest-within=3").number == 2
    study.set_user_attr("metric", "accuracy")  # the same numbers as a 0-1 metric: 700 points
    assert choose(study, pick="smallest-within=7").number == 0


def test_a_candidate_exactly_on_the_margin_is_within_it():
    """``within=X`` keeps scores >= best - X points: 0.75 is exactly 12.5 points under 0.875 (all
    three numbers exact in binary), so it is the smallest within 12.5 and not within 12.4."""
    study = make_study("sqlite://", [(0.875, 5000, None), (0.8125, 1000, None), (0.75, 100, None)])
    assert choose(study, pick="smallest-within=12.5").number == 2
    assert choose(study, pick="smallest-within=12.4").number == 1


@pytest.mark.parametrize(
    "budget, pick, expected",
    [
        (None, "best", 2),
        (2000, "best", 1),
        (100, "best", 0),
        (60, "best", 3),
        (None, "smallest-within=1.5", 1),
        (None, "smallest-within=7", 0),
        (None, "smallest-within=20", 3),
    ],
)
def test_choice_under_budgets(tmp_path, budget, pick, expected):
    study = make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    assert choose(study, budget, pick).number == expected


@pytest.mark.parametrize("pick", ["best", "smallest-within=1.5", "smallest-within=7"])
def test_test_split_scores_never_change_the_choice(tmp_path, pick):
    """Every permutation of the held-out scores stored for the front leaves the choice as it is:
    export ranks by search score, and the test split only reports."""
    import itertools

    front = [0, 1, 2, 3]  # ROWS' Pareto front (trial 4 is dominated)
    expected = choose(make_study(None, ROWS), None, pick).number
    for i, order in enumerate(itertools.permutations([0.95, 0.60, 0.83, 0.71])):
        study = make_study(None, ROWS, finals=list(zip(front, order)))  # in memory
        assert choose(study, None, pick).number == expected, order


def test_choice_errors(tmp_path):
    study = make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    with pytest.raises(ConfigError, match=r"below every front member .*\(the smallest has 50 deployable"):
        choose(study, 10)
    with pytest.raises(ConfigError, match="smallest-within=X"):
        choose(study, None, "smallest")
    empty = optuna.create_study(storage=f"sqlite:///{tmp_path}/e.db", directions=["maximize", "minimize"])
    with pytest.raises(ConfigError, match="no complete trial"):
        choose(empty)


def test_record_round_trip_and_bad_files(tmp_path):
    study = make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    rec = record(study, choose(study), "sqlite:///x")
    path = write_record(rec, tmp_path / "best.yaml")
    assert read_record(path) == rec
    assert rec.provenance["trial"] == 2 and rec.provenance["space_hash"] == "abc"
    assert rec.counts["deployable"] == 5000 and rec.recipe["lr"] == 3e-3
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("recipe:", "recipee:"))
    with pytest.raises(ConfigError, match="unknown key 'recipee' \\(did you mean 'recipe'\\?\\)"):
        read_record(bad)


def test_train_saves_deployable_weights_and_load_reproduces(tmp_path):
    from petl_nas.deploy.runs import load, predict, train_record
    from petl_nas.tasks import load_splits
    from petl_nas.tasks.encoding import encode

    config = PetlConfig(
        modules=(ModuleSpec(form="prefix", size=4, reparam=16), ModuleSpec(form="adapter", position="ffn", size=4))
    )
    rec = {
        "backbone": TINY_BACKBONE,
        "task": "demo_sentiment",
        "data_dir": None,
        "data_seed": 111,
        "k": 200,
        "petl_config": config.to_dict(),
        "recipe": {"lr": 3e-3, "epochs": 1, "batch_size": 32, "max_length": 24},
        "seeds": 1,
        "counts": {},
    }
    summary = train_record(rec, out=tmp_path / "out", progress=False, printer=lambda *a: None, keep_models=True)
    trained = summary.pop("models")[0].eval()
    weights = load_file(tmp_path / "out" / "seed_0" / "petl_weights.safetensors")  # seed_N/ even for one run
    from petl_nas import count_model

    count = count_model(trained)
    assert sum(t.numel() for t in weights.values()) == count.deployable + count.head
    assert count.trainable > count.deployable  # the prefix MLP was flattened
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["mean"] == summary["mean"]

    loaded = load(None, tmp_path / "out" / "seed_0")
    splits = load_splits("demo_sentiment", k=200, data_seed=111)
    batch = next(encode(splits, loaded.petl_tokenizer, 24).test.batches(16))
    batch.pop("labels")
    assert torch.allclose(loaded(**batch).logits, trained(**batch).logits, atol=1e-5)
    preds = predict(loaded, [("a great film",), ("awful dull movie",)])
    assert {p["label"] for p in preds} <= {"negative", "positive"} and len(preds) == 2
    for p in preds:  # each class's probability under its name; the label is the likeliest
        assert list(p["probabilities"]) == ["negative", "positive"]
        assert p["label"] == max(p["probabilities"], key=p["probabilities"].get)
        assert abs(sum(p["probabilities"].values()) - 1) < 1e-5


def test_a_preset_the_study_trained_exports_as_that_trial(tmp_path, capsys):
    """The study trained BitFit (trial 3, at the space's learning rate 3e-3, not its paper rate):
    `export --preset bitfit` is that trial, the baseline the study measured and compared."""
    from petl_nas.app.cli import main
    from petl_nas.core.presets import preset_lr
    from petl_nas.deploy.export import preset_record

    url = f"sqlite:///{tmp_path}/s.db"
    study = make_study(url, ROWS, finals=[(3, 0.71)])
    rec = preset_record(study, "bitfit", url)
    assert rec.recipe["lr"] == 3e-3 != preset_lr("bitfit")
    assert rec.provenance["trial"] == 3 and rec.provenance["preset"] == "bitfit"
    assert rec.provenance["search_score"] == 0.70 and rec.provenance["test_mean"] == 0.71
    assert main(["export", "--storage", url, "--study", "s", "--preset", "bitfit", "-o", str(tmp_path / "b.yaml")]) == 0
    out = capsys.readouterr().out
    assert "preset bitfit as the study trained it (trial 3, lr 0.003)" in out
    assert "on search dev, test 0.7100 (1 seed);" in out  # one seed has no spread to show
    assert (
        main(["export", "--storage", url, "--study", "s", "--preset", "pfeiffer", "-o", str(tmp_path / "p.yaml")]) == 0
    )
    assert "preset pfeiffer at its paper learning rate 0.0001 (the study did not train it)" in capsys.readouterr().out
    assert read_record(tmp_path / "p.yaml").provenance["pick"] == "preset pfeiffer"  # how it was chosen


def test_export_says_what_it_picked_and_how(tmp_path, capsys):
    """A pick that is a preset is named as one; the record keeps the rule and budget that chose it;
    a test score measured at the final recipe says so beside a record at the search's; a PEFT
    file, which has no recipe, gets no note about the record's length."""
    from petl_nas.app.cli import main

    url = f"sqlite:///{tmp_path}/s.db"
    study = make_study(url, ROWS, finals=[(3, 0.71)])
    study.set_user_attr("fidelity", {**study.user_attrs["fidelity"], "epochs": 3})  # the final recipe trains 1
    assert main(["export", "--storage", url, "--budget", "60", "-o", str(tmp_path / "b.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("trial 3, preset bitfit (accuracy 0.7000 on search dev, test 0.7100 (1 seed); 50 ")
    assert "note: the record trains 1 epoch, the search scored 3" in out
    provenance = read_record(tmp_path / "b.yaml").provenance
    assert provenance["pick"] == "best" and provenance["pick_budget"] == 60
    assert (
        main(["export", "--storage", url, "--budget", "60", "--recipe", "search", "-o", str(tmp_path / "s.yaml")]) == 0
    )
    assert "test 0.7100 (1 seed) at the final recipe; " in capsys.readouterr().out
    assert main(["export", "--storage", url, "--pick", "smallest-within=20", "-o", str(tmp_path / "w.yaml")]) == 0
    assert read_record(tmp_path / "w.yaml").provenance["pick"] == "smallest-within=20"
    capsys.readouterr()
    assert (
        main(["export", "--storage", url, "--budget", "500", "--format", "peft", "-o", str(tmp_path / "p.json")]) == 0
    )
    assert "note:" not in capsys.readouterr().out


def test_preset_record_uses_the_study_recipe_and_the_preset_rate(tmp_path):
    from petl_nas.core.budget import count_parameters
    from petl_nas.core.presets import preset_lr
    from petl_nas.deploy.export import preset_record
    from petl_nas.tasks import resolve_task
    from petl_nas.training.loading import model_config_for

    study = make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    rec = preset_record(study, "pfeiffer", "sqlite:///x")
    cfg = model_config_for(TINY_BACKBONE, resolve_task("demo_sentiment"))
    expected = count_parameters(cfg, preset("pfeiffer", cfg), num_labels=2).deployable
    assert rec.counts["deployable"] == expected == 2 * (32 * 2 + 2 + 2 * 32 + 32)  # d/16 = 2, two layers
    assert rec.recipe["lr"] == preset_lr("pfeiffer") and rec.recipe["epochs"] == 1
    assert rec.provenance["preset"] == "pfeiffer" and rec.provenance["trial"] is None
    assert read_record(write_record(rec, tmp_path / "p.yaml")) == rec
    with pytest.raises(ConfigError, match="unknown name 'lorra'.*did you mean 'lora'"):
        preset_record(study, "lorra")


def test_a_preset_the_study_did_not_train_exports_at_the_rates_the_study_measured(tmp_path, capsys):
    """In a study with measured rates (``rates: auto``) every baseline trains at its families' rates,
    so the baseline `export --preset` writes for one the study did not train does too: a preset of
    two families gets the first's rate and the second's as a multiple of it, not its paper rate."""
    from petl_nas.app.cli import main
    from petl_nas.core.config import PetlConfig
    from petl_nas.deploy.export import preset_record
    from petl_nas.study.records import RATE_CALIBRATION

    url = f"sqlite:///{tmp_path}/s.db"
    study = make_study(url, ROWS)
    study.set_user_attr(RATE_CALIBRATION, {"rates": {"lora": 1.5e-3, "adapter": 9e-4, "prefix": 1e-3}})
    rec = preset_record(study, "pfeiffer", url)
    assert rec.recipe["lr"] == 9e-4 and rec.provenance["rates"] == "measured"
    mam = PetlConfig.from_dict(preset_record(study, "mam", url).petl_config)
    assert {m.form for m in mam.modules} == {"prefix", "adapter"}
    first = "prefix" if mam.modules[0].form == "prefix" else "adapter"
    lr = preset_record(study, "mam", url).recipe["lr"]
    assert lr == {"prefix": 1e-3, "adapter": 9e-4}[first]
    assert dict(mam.lr_mults) == {
        ({"prefix", "adapter"} - {first}).pop(): pytest.approx(
            {"prefix": 1e-3, "adapter": 9e-4}[({"prefix", "adapter"} - {first}).pop()] / lr
        )
    }
    assert (
        main(["export", "--storage", url, "--study", "s", "--preset", "pfeiffer", "-o", str(tmp_path / "p.yaml")]) == 0
    )
    assert "preset pfeiffer at the rates the study measured for its families, lr 0.0009" in capsys.readouterr().out


@pytest.mark.slow
def test_interrupted_train_resumes_at_the_first_missing_seed(tmp_path):
    from petl_nas.core.budget import count_parameters
    from petl_nas.deploy.runs import train_record
    from petl_nas.tasks import resolve_task
    from petl_nas.training.loading import model_config_for

    rec = {
        "backbone": TINY_BACKBONE,
        "task": "demo_sentiment",
        "data_dir": None,
        "data_seed": 111,
        "k": 120,
        "petl_config": LORA,
        "recipe": {"lr": 3e-3, "epochs": 1, "batch_size": 32, "max_length": 24},
        "seeds": 2,
        "counts": {},
    }
    first = train_record(rec, out=tmp_path / "out", progress=False, printer=lambda *a: None)
    (tmp_path / "out" / "seed_1" / "petl_config.json").unlink()  # as if killed while saving seed 1
    lines = []
    again = train_record(rec, out=tmp_path / "out", progress=False, printer=lines.append)
    assert "already trained" in lines[0] and "already trained" not in lines[1]
    assert again["runs"][0] == first["runs"][0] and again["runs"][1]["last"] == first["runs"][1]["last"]
    assert (
        first["deployable"]
        == count_parameters(
            model_config_for(TINY_BACKBONE, resolve_task("demo_sentiment")), PetlConfig.from_dict(LORA), num_labels=2
        ).deployable
        > 0
    )
    changed = {**rec, "recipe": {**rec["recipe"], "lr": 1e-3}}  # another recipe is another run
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    with pytest.raises(
        ConfigError,
        match=r"output folder '.*out' holds runs of another record \(seed_0, seed_1\); "
        r"choose another --out, or pass --overwrite to replace them",
    ):
        train_record(changed, out=tmp_path / "out", progress=False, printer=lambda *a: None)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()} == before
    lines.clear()
    train_record(changed, out=tmp_path / "out", progress=False, printer=lines.append, overwrite=True)
    assert not any("already trained" in line for line in lines)
    assert sum("holds a run of another record" in line and "it is replaced" in line for line in lines) == 2
    lines.clear()  # one seed of the first record: the other record's seed_1 goes
    one = train_record({**rec, "seeds": 1}, out=tmp_path / "out", progress=False, printer=lines.append, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["metrics.json", "seed_0"]
    assert any("seed_1: a run of another record" in line and "removed" in line for line in lines)
    assert [r["dir"] for r in one["runs"]] == [str(tmp_path / "out" / "seed_0")]
    train_record(rec, out=tmp_path / "out", progress=False, printer=lambda *a: None)
    train_record({**rec, "seeds": 1}, out=tmp_path / "out", progress=False, printer=lambda *a: None)
    assert (tmp_path / "out" / "seed_1").is_dir()  # a further seed of the same record is kept
    for counted in (first["deployable"], 7):  # 7: as if exported for another backbone
        lines.clear()
        train_record(
            {**rec, "counts": {"deployable": counted}}, out=tmp_path / "out", progress=False, printer=lines.append
        )
        notes = [line for line in lines if line.startswith("note:")]
        assert notes == (
            []
            if counted == first["deployable"]
            else [
                f"note: on this backbone the configuration has {first['deployable']:,} deployable parameters; the "
                f"record's counts say 7 (it was exported for another backbone or task)"
            ]
        )
    (tmp_path / "merged").mkdir()  # another tool's folder: not mixed into
    (tmp_path / "merged" / "config.json").write_text("{}")
    with pytest.raises(
        ConfigError,
        match=r"output folder '.*merged' holds other files \(config\.json\); "
        r"choose another --out",
    ):
        train_record(rec, out=tmp_path / "merged", progress=False, printer=lambda *a: None)


def test_cli_train_and_predict(tmp_path, capsys, monkeypatch):
    from petl_nas.app.cli import main
    from petl_nas.training import threads

    rec = {
        "backbone": TINY_BACKBONE,
        "task": "demo_sentiment",
        "data_dir": None,
        "data_seed": 111,
        "k": 120,
        "petl_config": LORA,
        "recipe": {"lr": 3e-3, "epochs": 1, "batch_size": 32, "max_length": 24},
        "seeds": 2,
        "counts": {},
    }
    write_record(rec, tmp_path / "best.yaml")
    assert main(["train", "--config", str(tmp_path / "best.yaml"), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    assert (tmp_path / "o" / "seed_1" / "petl_weights.safetensors").exists()
    seeds = [line for line in capsys.readouterr().out.splitlines() if line.startswith("seed ")]
    assert len(seeds) == 2 and all(re.search(r" \(\d+ CPU threads?\) -> ", line) for line in seeds)  # chosen, said
    (tmp_path / "in.txt").write_text("a great film\nawful dull movie\n")
    monkeypatch.setattr(threads, "_kept", None)
    assert main(["predict", "--run", str(tmp_path / "o" / "seed_0"), "--input", str(tmp_path / "in.txt")]) == 0
    assert threads._kept is not None  # predicting chose its threads too
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["text"] for line in lines] == ["a great film", "awful dull movie"]


def test_a_run_on_files_predicts_after_its_files_are_gone(tmp_path, capsys):
    """A trained directory is what deploys: predict reads the classes it recorded, not the train file."""
    import shutil

    from petl_nas.app.cli import main

    data = tmp_path / "data"
    data.mkdir()
    words = "good great fine dull bad awful plot film".split()
    rows = [(f"{words[i % 8]} {words[(3 * i) % 8]} film", ["neg", "neu", "pos"][i % 3]) for i in range(60)]
    for name, part in (("train.csv", rows[:45]), ("dev.csv", rows[45:])):
        (data / name).write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in part))
    task = {"train": str(data / "train.csv"), "dev": str(data / "dev.csv"), "text_columns": ["text"]}
    rec = {
        "backbone": TINY_BACKBONE,
        "task": task,
        "data_dir": None,
        "data_seed": 111,
        "k": None,
        "petl_config": LORA,
        "recipe": {"lr": 3e-3, "epochs": 1, "batch_size": 16, "max_length": 16},
        "seeds": 1,
        "counts": {},
    }
    write_record(rec, tmp_path / "best.yaml")
    assert main(["train", "--config", str(tmp_path / "best.yaml"), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    shutil.rmtree(data)
    (tmp_path / "in.txt").write_text("a great film 😀\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--run", str(tmp_path / "o" / "seed_0"), "--input", str(tmp_path / "in.txt")]) == 0
    out = capsys.readouterr().out
    assert '"a great film 😀"' in out  # as written, not \ud83d\ude00
    (line,) = [json.loads(line) for line in out.splitlines()]
    assert list(line["probabilities"]) == ["neg", "neu", "pos"] and line["label"] in line["probabilities"]


def test_train_reports_every_metric_of_the_task_and_the_rows_it_scored(tmp_path, capsys):
    """A regression task has three metrics: the line and metrics.json give all of them, each the mean
    over seeds of its last evaluation; a recipe scoring the first eval_rows test rows says so; one
    seed has no standard deviation."""
    from petl_nas.app.cli import main

    words = "good great fine dull bad awful plot film".split()
    rows = [(f"{words[i % 8]} {words[(3 * i) % 8]} film", (i % 8) / 1.4) for i in range(80)]
    for name, part in (("train.csv", rows[:60]), ("dev.csv", rows[60:])):
        (tmp_path / name).write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in part))
    task = {
        "train": str(tmp_path / "train.csv"),
        "dev": str(tmp_path / "dev.csv"),
        "kind": "regression",
        "text_columns": ["text"],
    }
    rec = {
        "backbone": TINY_BACKBONE,
        "task": task,
        "data_dir": None,
        "data_seed": 111,
        "k": None,
        "petl_config": LORA,
        "recipe": {"lr": 3e-3, "epochs": 1, "batch_size": 16, "max_length": 16, "eval_rows": 8},
        "seeds": 1,
        "counts": {},
    }
    write_record(rec, tmp_path / "best.yaml")
    capsys.readouterr()
    assert main(["train", "--config", str(tmp_path / "best.yaml"), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    summary = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert set(summary["metrics"]) == {"pearson", "spearman", "pearson_spearman"}
    assert summary["metrics"]["pearson_spearman"] == summary["mean"] == summary["runs"][0]["last"]
    assert summary["metrics"]["pearson_spearman"] == pytest.approx(
        (summary["metrics"]["pearson"] + summary["metrics"]["spearman"]) / 2
    )
    assert summary["std"] is None and (summary["test_rows"], summary["test_rows_of"]) == (8, 20)
    m = summary["metrics"]
    assert (
        f"test pearson_spearman: {m['pearson_spearman']:.4f} (1 seed) (pearson {m['pearson']:.4f}, spearman "
        f"{m['spearman']:.4f}) on the first 8 of 20 test rows (recipe.eval_rows)"
    ) in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["export", "--storage", "sqlite:///{d}/s.db", "--budget", "10", "-o", "{d}/x.yaml"],
            "below every front member",
        ),
        (["export", "--storage", "sqlite:///{d}/e.db", "-o", "{d}/x.yaml"], "no complete trial"),
        (
            ["export", "--storage", "sqlite:///{d}/s.db", "--study", "nope", "-o", "{d}/x.yaml"],
            "study 'nope' is not in",
        ),
        (
            ["export", "--storage", "sqlite:///{d}/s.db", "--format", "peft", "-o", "{d}/x.yaml", "--budget", "60"],
            "not expressible in HF PEFT: bitfit without LoRA (PEFT trains biases only beside a tuner that takes "
            "bias='all'); the nearest front member that does: trial 0 (100 deployable parameters, search score 0.8000)",
        ),
        (["train", "--config", "{d}/bad.yaml", "--out", "{d}/x"], "unknown key 'seed'"),
        (
            ["train", "--config", "{d}/experiment.yaml", "--out", "{d}/x"],
            "experiment.yaml: this is an experiment file (key 'name'): petl-nas search --experiment runs it; "
            "train takes a record that petl-nas export writes",
        ),
        (["train", "--config", "{d}/missing.yaml", "--out", "{d}/x"], "no such file"),
        (["export", "--storage", "sqlite:///{d}/typo.db", "-o", "{d}/x.yaml"], "typo.db': no such file"),  # not created
        (
            [
                "export",
                "--storage",
                "sqlite:///{d}/s.db",
                "--preset",
                "lora",
                "--pick",
                "smallest-within=1",
                "-o",
                "{d}/x.yaml",
            ],
            "give --pick or --preset, not both",
        ),
        (
            [
                "export",
                "--storage",
                "sqlite:///{d}/e.db",
                "--pick",
                "worst",
                "-o",
                "{d}/x.yaml",
            ],  # the flag, not the study
            "--pick: expected 'best', 'best-mean', 'smallest-within-noise', 'smallest-within=X' or 'fastest-within=X'",
        ),
        (
            ["train", "--config", "{d}/nodata.yaml", "--out", "{d}/runs/x"],
            "SST-2/train.tsv does not exist",
        ),  # after mkdir
        (
            ["train", "--config", "{d}/nomodel.yaml", "--out", "{d}/runs/x"],
            "model '/no/such/bert': no such local directory",
        ),
        (
            ["export", "--storage", "sqlite:///{d}/s.db", "--list", "--budget", "60"],
            "--list prints the whole front and writes nothing; give --budget without --list (what an export writes)",
        ),
        (
            ["export", "--storage", "sqlite:///{d}/s.db", "--list", "--pick", "smallest-within=1", "-o", "{d}/x.yaml"],
            "give -o, --pick without --list",
        ),
        (
            ["export", "--storage", "sqlite:///{d}/s.db", "--list", "--recipe", "search", "--format", "peft"],
            "give --recipe, --format without --list",
        ),
        (
            ["export", "--storage", "sqlite:///{d}/s.db", "--preset", "lora", "--budget", "60", "-o", "{d}/x.yaml"],
            "give --budget or --preset, not both",
        ),
        (
            ["export", "--storage", "sqlite:///{d}/s.db", "--no-retime", "-o", "{d}/x.yaml"],
            "--no-retime is for --pick fastest-within=X",
        ),
        (["export", "--storage", "sqlite:///{d}/s.db", "-o", "{d}/afile/x.yaml"], "afile is a file, not a folder"),
        (
            [
                "export",
                "--storage",
                "sqlite:///{d}/s.db",
                "--format",
                "peft",
                "--budget",
                "500",
                "-o",
                "{d}/afile/x.json",
            ],
            "afile is a file, not a folder",
        ),
    ],
)
def test_cli_errors_write_nothing(tmp_path, capsys, args, words):
    from petl_nas.app.cli import main

    make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    optuna.create_study(study_name="e", storage=f"sqlite:///{tmp_path}/e.db", directions=["maximize", "minimize"])
    (tmp_path / "bad.yaml").write_text("backbone: x\ntask: sst2\npetl_config: {}\nrecipe: {}\nseed: 1\n")
    (tmp_path / "experiment.yaml").write_text("name: mine\nbackbone: x\ntask: sst2\nbudget: 0.5%\n")
    write_record(
        {
            "backbone": TINY_BACKBONE,
            "task": "sst2",
            "data_dir": str(tmp_path / "nodata"),
            "data_seed": 111,
            "k": 100,
            "petl_config": LORA,
            "recipe": {"lr": 1e-3, "epochs": 1},
            "seeds": 1,
            "counts": {},
        },
        tmp_path / "nodata.yaml",
    )
    write_record(
        {
            "backbone": "/no/such/bert",
            "task": "demo_keyword",
            "petl_config": LORA,
            "recipe": {"lr": 1e-3, "epochs": 1},
            "counts": {},
        },
        tmp_path / "nomodel.yaml",
    )
    (tmp_path / "afile").write_text("")
    before = sorted(p.name for p in tmp_path.iterdir())
    rc = main([a.format(d=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_output_that_is_a_folder_is_named_not_a_temporary_file(tmp_path, capsys):
    from petl_nas.app.cli import main

    make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    (tmp_path / "best.yaml").mkdir()
    assert main(["export", "--storage", f"sqlite:///{tmp_path}/s.db", "-o", str(tmp_path / "best.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == f"petl-nas: error: {tmp_path / 'best.yaml'}: Is a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml", "s.db"]  # no temporary file left


def test_saving_a_model_without_petl_is_one_error_and_makes_no_folder(tmp_path):
    from conftest import tiny_model

    from petl_nas import save_petl

    with pytest.raises(
        ConfigError,
        match=r"save_petl: this BertForSequenceClassification has no PETL modules "
        r"\(apply_petl first\)",
    ):
        save_petl(tiny_model("bert"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_api_on_the_wrong_model_is_one_clear_error():
    import torch
    from conftest import tiny_model

    from petl_nas import apply_petl, count_model, preset

    with pytest.raises(
        ConfigError,
        match=r"count_model: this BertForSequenceClassification has no PETL modules "
        r"\(apply_petl first\)",
    ):
        count_model(tiny_model("bert"))
    with pytest.raises(
        ConfigError,
        match=r"apply_petl: expected a transformers model \(a PreTrainedModel, .*\), "
        r"got a Linear",
    ):
        apply_petl(torch.nn.Linear(3, 3), preset("lora", hidden_size=32))


def test_misuse_of_the_api_is_one_config_error():
    from conftest import tiny_model

    from petl_nas import apply_petl, merge_lora, petl_disabled, remove_petl

    plain = tiny_model("bert")
    for call, name in ((remove_petl, "remove_petl"), (merge_lora, "merge_lora")):
        with pytest.raises(ConfigError, match=f"{name}: this BertForSequenceClassification has no PETL modules"):
            call(plain)
    with pytest.raises(ConfigError, match="petl_disabled: this BertForSequenceClassification has no PETL"):
        with petl_disabled(plain):
            pass
    for wrong in ({"modules": []}, "lora", ModuleSpec(form="lora")):
        with pytest.raises(ConfigError, match=f"apply_petl: expected a PetlConfig .*got a {type(wrong).__name__}"):
            apply_petl(plain, wrong)


def test_a_failed_apply_or_load_leaves_the_model_as_it_was(tmp_path):
    """A user's backbone stays reusable: no PETL modules, nothing frozen, the same outputs."""
    from conftest import batch, tiny_model

    from petl_nas import apply_petl, load_petl, save_petl
    from petl_nas.core.inject import ROOT

    def state(model):
        with torch.no_grad():
            return model(**batch()).logits, [p.requires_grad for p in model.parameters()], hasattr(model, ROOT)

    three = apply_petl(tiny_model("bert", num_labels=3), PetlConfig(modules=(ModuleSpec(form="lora", size=2),)))
    save_petl(three, tmp_path / "three")  # a 3-label head
    fresh = tiny_model("bert")
    before = state(fresh)
    with pytest.raises(ConfigError, match="classifier.bias has shape .3,., the backbone expects .2,."):
        load_petl(fresh, tmp_path / "three")
    after = state(fresh)
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:] == (before[1], False)
    roberta = tiny_model("roberta")
    with pytest.raises(ConfigError, match="pooling: the roberta classifier has no pooler"):
        apply_petl(roberta, PetlConfig(modules=(ModuleSpec(form="lora", size=2),), pooling="pooler_trained"))
    assert not hasattr(roberta, ROOT) and all(p.requires_grad for p in roberta.parameters())
    apply_petl(roberta, PetlConfig(modules=(ModuleSpec(form="lora", size=2),)))  # the corrected retry works
    (tmp_path / "three" / "petl_weights.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no petl_weights.safetensors beside its petl_config.json"):
        load_petl(tiny_model("bert"), tmp_path / "three")


def test_loading_onto_another_architecture_is_refused(tmp_path):
    from conftest import tiny_model

    from petl_nas import apply_petl, load_petl, save_petl

    save_petl(apply_petl(tiny_model("bert"), preset("lora")), tmp_path)
    with pytest.raises(ConfigError, match="saved for the bert backbone, got roberta"):
        load_petl(tiny_model("roberta"), tmp_path)


# ---- AdapterHub and PEFT ---------------------------------------------------------------------
def test_an_adapterhub_adapter_on_some_layers_leaves_out_the_others():
    """AdapterHub's ``leave_out`` lists the layers without the adapter: the complement of ours."""
    config = PetlConfig(modules=(ModuleSpec(form="adapter", size=48, layers=(0, 2)),))
    out = to_adapters(config, 768, 4)
    assert out["leave_out"] == [1, 3]
    assert to_adapters(PetlConfig(modules=(ModuleSpec(form="adapter", size=48),)), 768, 4)["leave_out"] == []


def test_mam_as_an_adapterhub_union():
    out = to_adapters(preset("mam", hidden_size=768), 768, 12)
    assert out["architecture"] == "union"
    prefix, adapter = out["configs"]
    assert prefix["prefix_length"] == 30 and prefix["bottleneck_size"] == 800 and not prefix["flat"]
    assert adapter["is_parallel"] and adapter["scaling"] == 4.0 and adapter["reduction_factor"] == 1.5


BERT_BASE = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)


def test_lora_as_a_peft_config_and_prefix_named():
    peft = pytest.importorskip("peft")
    lora = to_peft(preset("lora"), BERT_BASE)
    assert lora["r"] == 8 and lora["lora_alpha"] == 16
    assert isinstance(peft.get_peft_config(lora), peft.LoraConfig)
    with pytest.raises(
        NotExpressible,
        match=r"modules\[0\] \(prefix at attn\): PEFT's prefix tuning passes past "
        r"key values, which transformers' bert models do not take",
    ):
        to_peft(preset("prefix"), BERT_BASE)


@pytest.mark.parametrize(
    "name, library, words",
    [
        ("unipelt_apl", "peft", "UniPELT gate"),
        ("mh_pa", "adapters", "multi-head parallel adapter"),
        ("bitfit", "adapters", "no BitFit"),
        ("houlsby", "peft", "no bottleneck adapters"),
    ],
)
def test_what_is_not_expressible_is_named(name, library, words):
    with pytest.raises(NotExpressible, match=words):
        if library == "peft":
            to_peft(preset(name, hidden_size=768), BERT_BASE)
        else:
            to_adapters(preset(name, hidden_size=768), 768, 12)


def test_pooling_is_a_classifiers_and_does_not_refuse_a_generation_tasks_adapters():
    mean = PetlConfig(modules=(ModuleSpec(form="lora", size=8),), pooling="mean")
    with pytest.raises(NotExpressible, match=r"pooling: mean \(AdapterHub's classification heads"):
        to_adapters(mean, 768, 12)
    for kind in ("seq2seq", "causal_lm"):
        assert to_adapters(mean, 768, 12, kind)["architecture"] == "lora"


def test_restricted_blocks_and_other_backbones_are_named_not_dropped():
    decoder_only = PetlConfig(modules=(ModuleSpec(form="lora", size=8, blocks=("decoder",)),))
    with pytest.raises(NotExpressible, match=r"restricted to the decoder blocks"):
        to_adapters(decoder_only, 768, 12)
    with pytest.raises(
        NotExpressible, match="PEFT's prefix tuning on the bart backbone moves the real tokens' positions"
    ):
        to_peft(
            preset("prefix"),
            BartConfig(
                d_model=16,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=32,
                decoder_ffn_dim=32,
            ),
        )


def test_record_carries_the_final_step_and_decoding_caps(tmp_path):
    study = make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    assert "max_steps" not in record(study, choose(study)).recipe
    study.set_user_attr("final", {"seeds": 1, "epochs": 1, "k": -1, "max_steps": 500, "eval_rows": 64})
    recipe = record(study, choose(study)).recipe
    assert recipe["max_steps"] == 500 and recipe["eval_rows"] == 64


def test_search_recipe_trains_at_the_length_the_trial_was_scored(tmp_path):
    study = make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    study.set_user_attr("fidelity", {"k": 200, "epochs": 5, "batch_size": 16, "max_length": 24, "max_steps": 40})
    study.set_user_attr("final", {"seeds": 3, "epochs": 10, "k": 1000})
    final, search = (record(study, choose(study), "sqlite:///x", recipe=r) for r in ("final", "search"))
    assert (final.recipe["epochs"], final.k, "max_steps" in final.recipe) == (10, 1000, False)
    assert (search.recipe["epochs"], search.k, search.recipe["max_steps"]) == (5, 200, 40)
    assert search.recipe["lr"] == final.recipe["lr"] == 3e-3 and search.seeds == 3
    assert (final.provenance["recipe"], search.provenance["recipe"]) == ("final", "search")
    from petl_nas.deploy.export import preset_record

    assert preset_record(study, "lora", recipe="search").recipe["epochs"] == 5
    with pytest.raises(ConfigError, match="--recipe: expected one of final, search, got 'short'"):
        record(study, choose(study), recipe="short")


def test_records_compute_in_the_precision_the_trials_were_scored_in(tmp_path):
    """The pick and the presets it is compared with train their final runs in the study's
    ``fidelity.precision``; the default (auto) leaves the record as before."""
    from petl_nas.deploy.export import preset_record
    from petl_nas.training.loop import Recipe

    study = make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    assert "precision" not in record(study, choose(study)).recipe
    study.set_user_attr("fidelity", {"k": 200, "epochs": 5, "batch_size": 16, "max_length": 24, "precision": "bf16"})
    for rec in (record(study, choose(study)), preset_record(study, "lora")):
        assert Recipe(**rec.recipe).precision == "bf16"


def test_records_compile_as_the_trials_did(tmp_path):
    """A study searched with ``fidelity.compile`` exports records whose runs compile the same way;
    the default (off) leaves the record as before."""
    from petl_nas.deploy.export import preset_record
    from petl_nas.training.loop import Recipe

    study = make_study(f"sqlite:///{tmp_path}/s.db", ROWS)
    assert "compile" not in record(study, choose(study)).recipe
    study.set_user_attr(
        "fidelity", {"k": 200, "epochs": 5, "batch_size": 16, "max_length": 24, "compile": "reduce-overhead"}
    )
    for rec in (record(study, choose(study)), preset_record(study, "lora")):
        assert Recipe(**rec.recipe).compile == "reduce-overhead"


def test_an_empty_front_is_said_not_printed_as_a_bare_header():
    import optuna

    from petl_nas.deploy.export import front_table

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("backbone_params", 1000)
    assert front_table(study).splitlines()[1] == "(no trial on the front: no trial has completed yet)"
    trial = study.ask()
    trial.set_constraint("learned", 1.0)  # within noise of the baseline: off the front
    study.tell(trial, [0.5, 10.0])
    assert front_table(study).splitlines()[1] == (
        "(no trial on the front: none of the 1 complete trials learned: "
        "each scored within noise of the trivial baseline)"
    )


def test_count_reads_an_export_record_and_a_trained_model(tmp_path, capsys):
    """`count --config best.yaml` as `count --help` shows it: the record's configuration (and a
    trained model's folder or its petl_config.json), not an error about the record's other keys."""
    from conftest import tiny_model

    from petl_nas import apply_petl, count_parameters, save_petl
    from petl_nas.app.cli import main

    tiny_model().save_pretrained(tmp_path / "m")
    write_record(
        {
            "backbone": TINY_BACKBONE,
            "task": "demo_sentiment",
            "data_dir": None,
            "data_seed": 111,
            "k": 120,
            "petl_config": LORA,
            "recipe": {"lr": 3e-3, "epochs": 1},
            "seeds": 1,
            "counts": {},
        },
        tmp_path / "best.yaml",
    )
    save_petl(apply_petl(tiny_model(), PetlConfig.from_dict(LORA)), tmp_path / "trained")
    counts = []
    for config in ("best.yaml", "trained", "trained/petl_config.json"):
        assert main(["count", "--model", str(tmp_path / "m"), "--config", str(tmp_path / config), "--json"]) == 0
        counts.append(json.loads(capsys.readouterr().out)["deployable"])
    assert counts == [count_parameters(tiny_model().config, PetlConfig.from_dict(LORA)).deployable] * 3 != [0] * 3


def test_the_front_table_shows_each_trials_source_and_the_studys_own_costs(tmp_path):
    from petl_nas.deploy.export import front_table

    study = make_study(f"sqlite:///{tmp_path}/s.db", [])
    study.set_user_attr("objectives", ["score", "params", "step_time", "memory"])
    for score, n, attrs in [
        (0.8, 100, {"oneshot": "oneshot-0", "oneshot_budget": 120}),
        (0.7, 50, {"preset": "bitfit"}),
        (0.9, 900, {}),
    ]:
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": 1e-3},
                distributions={"lr": FloatDistribution(1e-4, 1e-2)},
                values=[score, n],
                user_attrs={
                    "petl_config": LORA,
                    "deployable": n,
                    "trainable": n,
                    "recipe": {"lr": 3e-3},
                    "train_step_ms": 12.5,
                    "peak_mem_mb": 300.0,
                    "latency_ms": 4.0,
                    **attrs,
                },
            )
        )
    head, *rows = front_table(study).splitlines()
    assert head.split() == [
        "trial",
        "source",
        "search",
        "test",
        "(±std)",
        "deployable",
        "%",
        "step_time",
        "ms",
        "memory",
        "MB",
    ]  # its objectives, not latency
    assert [row.split()[1] for row in rows] == ["bitfit", "one-shot", "-"]
    assert rows[0].split()[-2:] == ["12.5", "300.0"]
    one_shot = record(study, study.trials[0]).provenance
    assert (one_shot["source"], one_shot["oneshot"], one_shot["oneshot_budget"]) == ("oneshot", "oneshot-0", 120)
    assert record(study, study.trials[2]).provenance["source"] == "searched"


@pytest.mark.slow
def test_train_reproduces_the_final_reevaluation_when_the_search_dev_comes_out_of_k(tmp_path, monkeypatch):
    """120 training rows, K=100 and a search dev of 30: the search trains on 70 rows (the search dev
    comes out of the K). The record carries the search dev's size, so `petl-nas train` trains on
    the same 70 and scores what the final re-evaluation scored, seed for seed."""
    from petl_nas.deploy.runs import train_record
    from petl_nas.search.driver import run_search
    from petl_nas.study.experiment import Experiment, Fidelity, FinalEval

    monkeypatch.chdir(tmp_path)
    words = "good great fine dull bad awful plot film".split()
    for name, n in (("train.csv", 120), ("dev.csv", 40)):
        (tmp_path / name).write_text(
            "text,label\n" + "".join(f"{words[i % 8]} {words[(3 * i) % 8]} {i},{'ab'[i % 3 == 0]}\n" for i in range(n))
        )
    task = {"train": str(tmp_path / "train.csv"), "dev": str(tmp_path / "dev.csv"), "text_columns": ["text"]}
    exp = Experiment(
        rates=NO_RATES,
        name="cut",
        backbone=TINY_BACKBONE,
        task=task,
        budget=None,
        space="small",
        trials=1,
        presets=["lora"],
        executor="local",
        storage=f"sqlite:///{tmp_path}/s.db",
        fidelity=Fidelity(length_buckets=0, k=100, epochs=1, batch_size=16, max_length=16, search_dev=30),
        final=FinalEval(seeds=1, epochs=1, presets="all", baselines=False),
    )
    run_search(exp, printer=lambda *a: None)
    study = optuna.load_study(study_name="cut", storage=exp.storage_url)
    (lora,) = [t for t in study.trials if t.user_attrs.get("preset") == "lora"]
    rec = record(study, lora)
    assert rec.search_dev == 30
    from petl_nas.deploy import runs as deploy

    rows, real_train = [], deploy.train
    monkeypatch.setattr(
        deploy, "train", lambda model, data, *a, **kw: rows.append(len(data.train)) or real_train(model, data, *a, **kw)
    )
    summary = train_record(rec, seeds=1, out=tmp_path / "o", progress=False, printer=lambda *a: None)
    assert rows == [70]
    assert summary["mean"] == pytest.approx(study.user_attrs[f"final:{lora.number}"]["mean"], abs=1e-6)
