"""The command line speaks as its neighbours do: ``--storage`` takes a path or a run folder, every
default shows in ``--help`` (read from where the code keeps it), ``-o/--output`` names outputs,
``--run`` names a trained run, and ``predict`` reads ``--text`` and standard input and says GLUE's
label names."""

from __future__ import annotations

import argparse
import io
import json
import sys
import types

import pytest

from petl_nas.app.cli import build_parser, main
from petl_nas.errors import ConfigError
from petl_nas.study.experiment import Experiment, Fidelity, OneShot
from petl_nas.study.storage_url import as_url, existing_url

# ---- --storage: a URL, a SQLite file's path or a run folder ---------------------------------------


@pytest.mark.parametrize(
    "given, url",
    [
        ("runs/x/study.db", "sqlite:///runs/x/study.db"),
        ("study.db", "sqlite:///study.db"),
        ("runs/x/", "sqlite:///runs/x/study.db"),
        ("/abs/x/study.db", "sqlite:////abs/x/study.db"),
        ("sqlite:///runs/x/study.db", "sqlite:///runs/x/study.db"),
        ("postgresql+psycopg2://u:pw@h/db", "postgresql+psycopg2://u:pw@h/db"),
    ],
)
def test_a_storage_is_a_url_a_file_or_a_folder(given, url):
    assert as_url(given) == url
    assert Experiment(storage=given).storage_url == url  # search and quickstart read it there


@pytest.mark.parametrize("given", ["just some words", "sqlite:/runs/x.db", "runs/x", "study.txt"])
def test_what_is_no_clear_path_is_left_to_the_opener_as_a_url(tmp_path, monkeypatch, capsys, given):
    """A stray word or a mistyped URL never becomes a new SQLite file: the opener refuses it in words."""
    monkeypatch.chdir(tmp_path)
    assert as_url(given) == given
    assert main(["export", "--list", "--storage", given]) == 2
    assert "is not an SQLAlchemy URL or a path (expected e.g. runs/NAME/" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_an_existing_folder_named_without_a_slash_is_a_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    assert as_url("runs/x") == "sqlite:///runs/x/study.db"


def _reader_calls(monkeypatch):
    """export, report and dashboard with what opens the study replaced: the URLs each was given."""
    from petl_nas.dashboards import launcher, report
    from petl_nas.study import records

    seen = []

    def stop(url, *args, **kwargs):
        seen.append(url)
        raise ConfigError("stopped here")

    monkeypatch.setattr(records, "load_study", stop)
    monkeypatch.setattr(report, "write_report", stop)
    monkeypatch.setattr(launcher, "serve", stop)
    return seen


READERS = [["export", "--list"], ["report", "-o", "out"], ["dashboard"]]


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
@pytest.mark.parametrize("given", ["runs/x/study.db", "runs/x/", "runs/x", "sqlite:///runs/x/study.db"])
def test_every_reading_command_takes_each_form(tmp_path, monkeypatch, capsys, command, given):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "study.db").write_bytes(b"")
    seen = _reader_calls(monkeypatch)
    assert main([*command, "--storage", given]) == 2
    assert seen == ["sqlite:///runs/x/study.db"]
    assert capsys.readouterr().err == "petl-nas: error: stopped here\n"


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    "given, words",
    [
        ("runs/nope/study.db", "--storage runs/nope/study.db: no such file"),
        ("runs/nope/", "--storage runs/nope/: no such folder"),
        ("runs/empty/", "--storage runs/empty/: no study.db in that folder"),
        ("runs/empty", "--storage runs/empty: no study.db in that folder"),
    ],
)
def test_a_path_that_names_no_study_is_one_line_naming_it(tmp_path, monkeypatch, capsys, command, given, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    seen = _reader_calls(monkeypatch)
    assert main([*command, "--storage", given]) == 2
    err = capsys.readouterr().err
    assert err == f"petl-nas: error: {words}\n" and "sqlite:" not in err  # no URL the user did not type
    assert not seen and not (tmp_path / "runs" / "nope").exists()  # nothing opened, nothing made


def test_doctor_checks_the_url_a_path_names(tmp_path, monkeypatch):
    from petl_nas.app import doctor

    seen = []
    monkeypatch.setattr(doctor, "run", lambda storage, **kw: seen.append(storage) or 0)
    assert main(["doctor", "--storage", "runs/x/"]) == 0
    assert main(["doctor"]) == 0
    assert seen == ["sqlite:///runs/x/study.db", doctor.DEFAULT_STORAGE]


def test_existing_url_leaves_a_url_to_the_opener():
    assert existing_url("sqlite:///no/such.db") == "sqlite:///no/such.db"  # check_existing says that one


# ---- every default in --help, read from where the code keeps it ------------------------------------


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _help_of(parser: argparse.ArgumentParser, flag: str) -> str:
    """The help ``parser --help`` prints for ``flag``, on one line."""
    action = next(a for a in parser._actions if flag in a.option_strings)
    return " ".join(parser._get_formatter()._expand_help(action).split())


SEARCH_DEFAULTS = {  # flag: (the dataclass that keeps its default, field)
    "--name": (Experiment, "name"),
    "--model": (Experiment, "backbone"),
    "--task": (Experiment, "task"),
    "--budget": (Experiment, "budget"),
    "--space": (Experiment, "space"),
    "--trials": (Experiment, "trials"),
    "--sampler": (Experiment, "sampler"),
    "--strategy": (Experiment, "strategy"),
    "--presets": (Experiment, "presets"),
    "--executor": (Experiment, "executor"),
    "--scheduler": (Experiment, "scheduler"),
    "--cpus-per-trial": (Experiment, "cpus_per_trial"),
    "--gpus-per-trial": (Experiment, "gpus_per_trial"),
    "--objectives": (Experiment, "objectives"),
    "--seed": (Experiment, "seed"),
    "--k": (Fidelity, "k"),
    "--epochs": (Fidelity, "epochs"),
    "--oneshot-runs": (OneShot, "runs"),
}


def _shown(value) -> str:
    return ",".join(value) if isinstance(value, tuple) else f"{value:g}" if isinstance(value, float) else str(value)


@pytest.mark.parametrize("flag", sorted(SEARCH_DEFAULTS))
def test_search_help_shows_the_experiments_defaults(flag):
    cls, name = SEARCH_DEFAULTS[flag]
    said = _help_of(_subparsers()["search"], flag)
    assert said.endswith(f"(default {_shown(getattr(cls, name))})"), said


def test_ray_schedules_as_the_experiment_says_by_default():
    import inspect

    from petl_nas.search.executors import run_ray

    params = inspect.signature(run_ray).parameters
    assert params["scheduler"].default == Experiment.scheduler
    assert params["cpus_per_trial"].default == Experiment.cpus_per_trial
    assert params["gpus_per_trial"].default == Experiment.gpus_per_trial


def test_every_argparse_default_shows_in_its_help():
    missing = []
    for command, parser in _subparsers().items():
        for action in parser._actions:
            if (
                action.default in (None, False, argparse.SUPPRESS)
                or not action.option_strings
                or action.help == argparse.SUPPRESS
                or isinstance(action, argparse._HelpAction)
            ):
                continue
            said = _help_of(parser, action.option_strings[-1])
            value = action.default
            if not any(f"{v}" in said for v in (value, f"{value:,}" if isinstance(value, int) else value)):
                missing.append(f"{command} {action.option_strings[-1]} (default {value!r}): {said}")
    assert not missing, "\n".join(missing)


# ---- -o/--output, and --out kept ---------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["-o", "--output", "--out"])
def test_train_writes_where_o_says(monkeypatch, capsys, flag):
    from petl_nas.deploy import export, runs

    seen = []
    monkeypatch.setattr(export, "read_record", lambda path: path)
    monkeypatch.setattr(
        runs,
        "train_record",
        lambda rec, out, **kw: (
            seen.append(out)
            or {
                "runs": [0],
                "metrics": {"accuracy": 0.5},
                "metric": "accuracy",
                "mean": 0.5,
                "std": 0.0,
                "test_rows": 10,
                "test_rows_of": 10,
            }
        ),
    )
    assert main(["train", "--config", "best.yaml", flag, "runs/best"]) == 0
    assert seen == ["runs/best"] and capsys.readouterr().out.rstrip().endswith("in runs/best")


def test_train_help_names_o_first_and_out_as_its_former_name():
    said = _help_of(_subparsers()["train"], "-o")
    assert "--out is its former name" in said
    assert _subparsers()["train"].format_help().count("-o OUTPUT, --output OUTPUT, --out OUTPUT") == 1


# ---- --run for a trained run, --model still read -----------------------------------------------------


@pytest.fixture
def no_model(monkeypatch):
    """`predict` without a trained run: each answer is the row's last word; ``loaded``: runs asked for."""
    from petl_nas.deploy import runs as deploy

    loaded, info = [], {"task": "demo_sentiment", "labels": ["neg", "pos"]}
    monkeypatch.setattr(
        deploy,
        "load",
        lambda backbone, directory: (
            loaded.append(directory) or types.SimpleNamespace(petl=types.SimpleNamespace(info=info))
        ),
    )
    monkeypatch.setattr(deploy, "predict", lambda model, rows: [{"label": row[-1].split()[-1]} for row in rows])
    return types.SimpleNamespace(loaded=loaded, info=info)


def _answers(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_predict_takes_run_and_says_model_is_renamed(no_model, capsys):
    assert main(["predict", "--run", "r", "--text", "a good film"]) == 0
    out, err = capsys.readouterr()
    assert _answers(out) == [{"text": "a good film", "label": "film"}] and err == ""
    assert main(["predict", "--model", "r", "--text", "a good film"]) == 0
    out, err = capsys.readouterr()
    assert _answers(out) == [{"text": "a good film", "label": "film"}]
    assert err == "petl-nas: warning: --model is renamed --run here (--model still works, for now)\n"
    assert no_model.loaded == ["r", "r"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--run", "r", "--model", "r"], "give --run DIR only (--model is its former name)"),
        ([], "give --run DIR: a directory written by petl-nas train"),
    ],
)
@pytest.mark.parametrize("command", [["predict", "--text", "x"], ["convert", "-o", "out"]], ids=lambda c: c[0])
def test_a_run_is_named_once(no_model, capsys, command, args, words):
    assert main([*command, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"petl-nas: error: {words}") and err.count("\n") == 1


@pytest.mark.parametrize("flag", ["--run", "--model"])
def test_convert_reads_the_run_either_flag_names(monkeypatch, capsys, flag):
    from petl_nas.deploy import convert

    def stop(run, *args, **kwargs):
        raise ConfigError(f"converting {run}")

    monkeypatch.setattr(convert, "convert", stop)
    assert main(["convert", flag, "runs/best/seed_0", "-o", "out"]) == 2
    assert capsys.readouterr().err.endswith("petl-nas: error: converting runs/best/seed_0\n")


# ---- predict: --text, standard input, label names ----------------------------------------------------


def _stdin(monkeypatch, data: bytes, tty: bool = False):
    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    stream.isatty = lambda: tty
    monkeypatch.setattr(sys, "stdin", stream)


def test_predict_labels_each_text_flag_in_order(no_model, capsys):
    assert main(["predict", "--run", "r", "--text", "so good", "--text", "", "--text", "so bad"]) == 0
    assert _answers(capsys.readouterr().out) == [
        {"text": "so good", "label": "good"},
        {"text": "so bad", "label": "bad"},
    ]


@pytest.mark.parametrize("args", [[], ["--input", "-"]], ids=["piped", "dash"])
def test_predict_reads_standard_input(no_model, capsys, monkeypatch, args):
    _stdin(monkeypatch, "\ufeffso good\n\nso bad 😀\n".encode())
    assert main(["predict", "--run", "r", *args]) == 0
    assert _answers(capsys.readouterr().out) == [
        {"text": "so good", "label": "good"},
        {"text": "so bad 😀", "label": "😀"},
    ]


@pytest.mark.parametrize(
    "stdin, args, words",
    [
        (b"", [], "give --input FILE, --text TEXT, or texts on standard input (one per line)"),  # a terminal
        (b"\n\n", ["--input", "-"], "no texts to label: standard input is empty"),
        (b"caf\xe9\n", ["--input", "-"], "standard input: not UTF-8 text (byte 0xe9 at offset 3)"),
        (
            b"ok\n" + b"x" * 50 + b"\n",
            ["--max-text-bytes", "40"],
            "standard input, line 2: 50 bytes, over --max-text-bytes 40",
        ),
        (
            b"",
            ["--text", "ok", "--text", "y" * 50, "--max-text-bytes", "40"],
            "--text 2: 50 bytes, over --max-text-bytes",
        ),
        (b"", ["--text", "ok", "--input", "in.txt"], "give --input FILE or --text TEXT, not both"),
    ],
    ids=["terminal", "empty", "not-utf8", "line-too-long", "text-too-long", "both"],
)
def test_bad_texts_are_one_line_before_the_model_loads(no_model, capsys, monkeypatch, stdin, args, words):
    _stdin(monkeypatch, stdin, tty=not args)
    assert main(["predict", "--run", "r", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"petl-nas: error: {words}") and err.count("\n") == 1, err
    assert not no_model.loaded


def test_a_pair_task_takes_its_texts_tab_separated(no_model, capsys):
    no_model.info.update(task="rte", labels=["entailment", "not_entailment"])
    assert main(["predict", "--run", "r", "--text", "it rains\tthe ground is wet"]) == 0
    assert _answers(capsys.readouterr().out) == [{"text": ["it rains", "the ground is wet"], "label": "wet"}]
    assert main(["predict", "--run", "r", "--text", "it rains"]) == 2
    assert capsys.readouterr().err.startswith(
        "petl-nas: error: --text 1: the model reads 2 texts a row (sentence1, sentence2), tab-separated; found 1"
    )


@pytest.mark.parametrize(
    "task, names",
    [
        ("sst2", ["negative", "positive"]),
        ("cola", ["unacceptable", "acceptable"]),
        ("mrpc", ["not_equivalent", "equivalent"]),
        ("qqp", ["not_duplicate", "duplicate"]),
        ("qnli", ["entailment", "not_entailment"]),
        ("rte", ["entailment", "not_entailment"]),
        ("mnli", ["entailment", "neutral", "contradiction"]),
    ],
)
def test_glue_tasks_have_their_label_names(task, names):
    from petl_nas.tasks import get_task
    from petl_nas.tasks.glue import label_names

    assert label_names(task, get_task(task).labels) == names
    assert label_names({"train": "a.csv"}, ["0", "1"]) == ["0", "1"]  # a task on files: as it wrote them
    assert label_names("sst2", ["1", "0"]) == ["1", "0"]  # not GLUE's order: not renamed


class _Scores:
    """A tokenizer stub: each text's one id is its length."""

    def __call__(self, texts, truncation, padding, max_length, return_tensors):
        import torch
        from transformers import BatchEncoding

        return BatchEncoding({"input_ids": torch.tensor([[float(len(t))] for t in texts])})


class _Classifier:
    """A model stub: short texts are class 0, long ones class 1 (``petl.info`` a recorded run's)."""

    def __init__(self, info):
        import torch

        self.petl, self.petl_tokenizer, self.weight = types.SimpleNamespace(info=info), _Scores(), torch.zeros(1)

    def parameters(self):
        return iter([self.weight])

    def __call__(self, input_ids):
        import torch

        long = (input_ids[:, 0] > 5).float()
        return types.SimpleNamespace(logits=torch.stack([1 - long, long], dim=1) * 4)


def test_predict_says_sst2s_label_names_and_keeps_the_id():
    from petl_nas.deploy.runs import predict

    out = predict(
        _Classifier({"task": "sst2", "labels": ["0", "1"], "kind": "classification"}), [("bad",), ("a fine film",)]
    )
    assert [(p["label"], p["label_id"]) for p in out] == [("negative", 0), ("positive", 1)]
    assert list(out[0]["probabilities"]) == ["negative", "positive"]
    out = predict(
        _Classifier({"task": {"train": "a.csv"}, "labels": ["no", "yes"], "kind": "classification"}), [("a fine film",)]
    )
    assert (out[0]["label"], out[0]["label_id"]) == ("yes", 1)


def test_quickstart_help_says_its_experiments_defaults():
    """The quickstart's help cannot import its experiment (that loads torch for every command): this
    test holds the two together."""
    from petl_nas.app.quickstart import default_experiment

    exp, parser = default_experiment(), _subparsers()["quickstart"]
    for flag, value in (
        ("--trials", exp.trials),
        ("--k", exp.fidelity.k),
        ("--epochs", exp.fidelity.epochs),
        ("--final-seeds", exp.final.seeds),
    ):
        assert f"(default {value:g}" in _help_of(parser, flag), flag
    assert f"(default {exp.name}," in _help_of(parser, "--name")
    assert "(default: local Ray)" in _help_of(parser, "--executor") and exp.executor == "ray"
