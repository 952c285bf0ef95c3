"""The search: a study in SQLite with presets first, budgets never exceeded, ASHA stops recorded as
PRUNED, resume without loss, over-budget proposals never trained, and clear errors up front."""

import dataclasses
import re

import optuna
import pytest
from conftest import NO_RATES, SHARED_GLUE, TINY_BACKBONE
from optuna.trial import TrialState

from petl_nas import ConfigError
from petl_nas.search.driver import run_search
from petl_nas.study.experiment import Experiment, Fidelity, FinalEval, parse_budget
from petl_nas.study.results import TrialResult


def experiment(tmp_path, **kw) -> Experiment:
    """A search the tiny model learns something in (demo_keyword, ~100 steps a trial): a front of
    trials that did not learn would be empty, and these tests are about the front's shape. (The
    presets here do not learn in 5 epochs; with seed 3 the sampler's first draws do.)"""
    base = Experiment(
        rates=NO_RATES,
        name="t",
        backbone=TINY_BACKBONE,
        task="demo_keyword",
        budget="5%",
        space="small",
        trials=6,
        seed=3,
        presets=["pfeiffer", "bitfit", "lora"],
        executor="local",
        storage=f"sqlite:///{tmp_path}/study.db",
        fidelity=Fidelity(
            length_buckets=0, k=320, epochs=5, batch_size=16, max_length=24, evals_per_epoch=2, search_dev=128
        ),
        final=FinalEval(seeds=0, baselines=False),
    )
    return dataclasses.replace(base, **kw)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs/ goes here


def write_experiment(tmp_path, exp: Experiment, epochs: int = 1, **fields) -> None:
    """``exp`` as ``tmp_path/e.yaml`` for `petl-nas search --experiment e.yaml`: its own fields and
    ``fields``, a short fidelity of ``epochs``, no final re-evaluation."""
    import yaml

    kept = (
        "name",
        "backbone",
        "task",
        "budget",
        "space",
        "trials",
        "presets",
        "executor",
        "storage",
        "seed",
        "grace_period",
    )
    spec = {
        **{k: v for k, v in dataclasses.asdict(exp).items() if k in kept},
        **fields,
        "fidelity": {"k": 64, "epochs": epochs, "batch_size": 16, "max_length": 16, "search_dev": 32},
        "final": {"seeds": 0, "baselines": False},
    }
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(spec))


def load(exp):
    return optuna.load_study(study_name=exp.study_name, storage=exp.storage_url)


def trained(study):
    return [t for t in study.trials if t.state != TrialState.WAITING and not t.user_attrs.get("rejected")]


def check_study_shape(study, budget, need_front: bool = True):
    """Presets first, budgets kept, pruned trials off the front; ``need_front``: some trial learned
    (a short ASHA run may stop every learner early and keep only trials that did not learn)."""
    trials = trained(study)
    flags = [bool(t.user_attrs.get("preset")) for t in trials]
    assert flags[0] and flags == sorted(flags, reverse=True)  # presets first
    for t in study.trials:
        assert t.user_attrs.get("preset") != "lora"  # r=8 is over every budget here
        if t.user_attrs.get("preset"):
            assert t.user_attrs["deployable"] <= budget
        if t.state == TrialState.COMPLETE:
            assert t.values[1] == t.user_attrs["deployable"] <= budget
            assert t.user_attrs["petl_config"] and "lr" in t.user_attrs["recipe"]
        if t.state == TrialState.PRUNED and not t.user_attrs.get("rejected"):
            assert "stopped early" in t.user_attrs["pruned_reason"] or "non-finite" in t.user_attrs["pruned_reason"]
            assert t.values is None  # never a point on the front
    assert all(t.state == TrialState.COMPLETE and not t.user_attrs["did_not_learn"] for t in study.best_trials)
    assert study.best_trials or not need_front
    assert study.user_attrs["space_name"] == "small" and study.user_attrs["budget"] == budget


@pytest.mark.slow
def test_local_search_never_trains_over_budget(tmp_path, monkeypatch):
    from petl_nas.search import executors

    calls = []
    real = executors.run_trial
    monkeypatch.setattr(executors, "run_trial", lambda spec, **kw: calls.append(spec.number) or real(spec, **kw))
    exp = experiment(tmp_path, budget="1.5%")
    summary = run_search(exp, printer=lambda *a: None)
    study = load(exp)
    check_study_shape(study, summary.budget)
    rejected = [t for t in study.trials if t.user_attrs.get("rejected") == "over_budget"]
    assert rejected, "a 1.5% budget on the small space should reject some proposals"
    for t in rejected:
        assert t.state == TrialState.PRUNED and t.user_attrs["deployable"] > summary.budget
        assert t.constraints["budget"] > 0  # the sampler learns from it
    assert sorted(calls) == sorted(t.number for t in trained(study))  # one trainer call per trained trial
    assert len(calls) == exp.trials


def test_a_proposal_of_exactly_the_budget_is_trained_not_rejected():
    """A budget admits configurations up to and including its count (the TrialSource's check)."""
    from conftest import tiny_config

    from petl_nas import ModuleSpec, PetlConfig, count_parameters
    from petl_nas.search.study import TrialSource
    from petl_nas.study.space import SearchSpace

    model_config = tiny_config("bert")
    config = PetlConfig(modules=(ModuleSpec(form="lora", size=2),))
    n = count_parameters(model_config, config).deployable
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.enqueue_trial({}, user_attrs={"petl_config": config.to_dict(), "recipe": {"lr": 1e-3}})
    source = TrialSource(study, SearchSpace.load("small"), model_config, budget=n, n_layers=3)
    proposal = source.next()
    assert (proposal.trial.number, proposal.deployable, source.rejected) == (0, n, 0)
    assert study.trials[0].state == TrialState.RUNNING and "rejected" not in study.trials[0].user_attrs


def test_a_preset_of_exactly_the_budget_fits():
    from conftest import tiny_config

    from petl_nas import count_parameters, preset
    from petl_nas.search.study import presets_within
    from petl_nas.study.space import SearchSpace

    model_config = tiny_config("bert")
    space = SearchSpace.load("small")
    n = count_parameters(model_config, space.with_head(preset("lora", model_config))).deployable
    fitting, over, _ = presets_within(["lora"], space, model_config, n)
    assert [name for name, _ in fitting] == ["lora"] and over == []
    assert presets_within(["lora"], space, model_config, n - 1)[1] == [("lora", n)]


@pytest.mark.slow
def test_ray_search_then_resume(tmp_path):
    ray = pytest.importorskip("ray")
    exp = experiment(tmp_path, executor="ray", scheduler="asha", trials=6)
    try:
        first = run_search(exp, printer=lambda *a: None)
        study = load(exp)
        check_study_shape(study, first.budget, need_front=False)  # ASHA stops most after one evaluation
        before = {t.number: (t.state, t.values, t.params) for t in trained(study)}
        assert len(before) == 6
        assert (tmp_path / "runs" / "t" / "ray").is_dir()
        run_search(dataclasses.replace(exp, trials=9), printer=lambda *a: None)  # resume, 3 more
        study = load(exp)
        after = {t.number: (t.state, t.values, t.params) for t in trained(study)}
        assert len(after) == 9
        assert all(after[n] == v for n, v in before.items())  # nothing lost or redone
        assert [t.user_attrs.get("preset") for t in study.trials].count("pfeiffer") == 1
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_asha_never_stops_a_trial_at_its_last_evaluation(tmp_path):
    """With 8 evaluations ASHA's rungs fall at 1, 2, 4 and 8: a trial stopped at its 8th had trained
    to the end and was lost (PRUNED, off the front). The last evaluation now comes with the closing
    report, which a stop cannot lose; every trial's intermediate scores end where it ended."""
    ray = pytest.importorskip("ray")
    exp = experiment(
        tmp_path,
        executor="ray",
        scheduler="asha",
        trials=8,
        fidelity=dataclasses.replace(experiment(tmp_path).fidelity, epochs=4),
    )
    try:
        run_search(exp, printer=lambda *a: None)
    finally:
        ray.shutdown()
    study = load(exp)
    stopped = [t for t in trained(study) if t.state == TrialState.PRUNED]
    complete = [t for t in trained(study) if t.state == TrialState.COMPLETE]
    assert stopped and complete  # ASHA stopped some here, and some trained to the end
    for t in stopped:
        evaluations = int(re.search(r"after (\d+) evaluations", t.user_attrs["pruned_reason"]).group(1))
        assert evaluations < 8, t.user_attrs["pruned_reason"]
        assert len(t.user_attrs["intermediate_scores"]) == evaluations
        assert t.user_attrs["intermediate_scores"][-1] == t.user_attrs["last_score"]
    for t in complete:
        assert len(t.user_attrs["intermediate_scores"]) == 8
        assert t.user_attrs["intermediate_scores"][-1] == t.user_attrs["last_score"]


@pytest.mark.slow
def test_final_reevaluation_marks_the_front(tmp_path):
    exp = experiment(tmp_path, trials=4, final=FinalEval(seeds=2, epochs=1, max_front=2, baselines=False))
    summary = run_search(exp, printer=lambda *a: None)
    study = load(exp)
    marked = [k for k in study.user_attrs if k.startswith("final:")]
    front_numbers = {r["number"] for r in summary.front}
    assert marked and len([k for k in marked if int(k.split(":")[1]) in front_numbers]) <= 2  # max_front
    assert len(marked) <= 3  # and the best preset
    entry = study.user_attrs[marked[0]]
    assert entry["split"] == "test" and len(entry["scores"]) == 2
    assert any(r["test_mean"] is not None for r in summary.front)
    assert "±" in summary.table()


def test_infeasible_budget_fails_up_front(tmp_path):
    exp = experiment(tmp_path, space="mam", budget="10")
    with pytest.raises(
        ConfigError, match=r"budget 10 is below the smallest configuration of space 'mam' \([\d,]+ deployable"
    ):
        run_search(exp, printer=lambda *a: None)
    assert not (tmp_path / "study.db").exists()


def test_cli_errors_are_one_line_and_write_nothing(tmp_path, capsys):
    from petl_nas.app.cli import main

    url = f"sqlite:///{tmp_path}/cli.db"
    for args, words in [
        (["--task", "sst3"], "did you mean 'sst2'"),
        (["--budget", "0.5 %"], "budget: '0.5 %' is not a count"),
        (["--space", "nope"], "space 'nope': no such file"),
    ]:
        rc = main(
            [
                "search",
                "--storage",
                url,
                "--task",
                "demo_sentiment",
                "--space",
                "small",
                "--executor",
                "local",
                "--trials",
                "1",
            ]
            + args
        )
        err = capsys.readouterr().err
        assert rc == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "cli.db").exists()


@pytest.mark.slow
def test_a_study_with_another_space_is_refused(tmp_path):
    exp = experiment(tmp_path, trials=1)
    run_search(exp, printer=lambda *a: None)
    with pytest.raises(ConfigError, match="made with another space"):
        run_search(dataclasses.replace(exp, space="mam", budget="20%"), printer=lambda *a: None)


@pytest.mark.slow
def test_a_study_resumed_with_other_scoring_settings_is_refused_and_kept(tmp_path):
    """Another budget would hide trained front members from `export`; another K or length would
    mix trials scored two ways. Both are refused before anything is written; --force-new-study
    replaces the study."""
    exp = experiment(tmp_path, trials=1)
    run_search(exp, printer=lambda *a: None)
    stored = load(exp)
    budget, trials = stored.user_attrs["budget"], len(stored.trials)
    for changed, words in [
        (dict(budget="1%"), "budget"),
        (dict(fidelity=dataclasses.replace(exp.fidelity, k=exp.fidelity.k // 2)), "fidelity.k"),
    ]:
        with pytest.raises(ConfigError, match=f"made with other settings: {words}"):
            run_search(dataclasses.replace(exp, trials=2, **changed), printer=lambda *a: None)
    kept = load(exp)
    assert kept.user_attrs["budget"] == budget and len(kept.trials) == trials
    run_search(dataclasses.replace(exp, budget="1%"), force_new_study=True, printer=lambda *a: None)
    assert load(exp).user_attrs["budget"] != budget


@pytest.mark.slow
def test_a_file_task_study_resumed_with_another_metric_or_files_is_refused(tmp_path):
    """Its task name (files:train) stays the same: the mapping's metric, files and decoding decide
    how its trials were scored, and a resume with others would rank them together. A file is known
    by its contents: the same rows at another path (the data folder moved) resume, and the study
    then reads them there; other rows at the same path are refused."""
    words = "good great fine dull bad awful plot film".split()

    def rows(n, shift=0):
        return "text,label\n" + "".join(
            f"{words[(i + shift) % 8]} {words[(3 * i) % 8]},{'ab'[i % 2]}\n" for i in range(n)
        )

    for name, text in (("train.csv", rows(80)), ("dev.csv", rows(20)), ("other.csv", rows(20, 1))):
        (tmp_path / name).write_text(text)
    task = {"train": str(tmp_path / "train.csv"), "dev": str(tmp_path / "dev.csv"), "text_columns": ["text"]}
    exp = experiment(
        tmp_path,
        trials=1,
        presets=[],
        task=task,
        fidelity=Fidelity(length_buckets=0, k=40, epochs=1, batch_size=16, max_length=16, search_dev=16),
    )
    run_search(exp, printer=lambda *a: None)
    for changed, words_ in [
        ({"main_metric": "f1"}, "task.main_metric None (now f1)"),
        ({"dev": str(tmp_path / "other.csv")}, f"task.dev {tmp_path / 'dev.csv'} (now "),
    ]:
        with pytest.raises(ConfigError, match=re.escape(f"made with other settings: {words_}")):
            run_search(dataclasses.replace(exp, trials=2, task={**task, **changed}), printer=lambda *a: None)
    (tmp_path / "moved").mkdir()
    for name in ("train.csv", "dev.csv"):
        (tmp_path / name).rename(tmp_path / "moved" / name)
    moved = {**task, "train": str(tmp_path / "moved" / "train.csv"), "dev": str(tmp_path / "moved" / "dev.csv")}
    run_search(dataclasses.replace(exp, trials=2, task=moved), printer=lambda *a: None)  # the same rows resume
    assert sum(t.state == TrialState.COMPLETE for t in load(exp).trials) == 2
    assert load(exp).user_attrs["task_spec"]["dev"] == moved["dev"]  # read there from now on
    swapped = rows(20).replace(",a\n", ",c\n").replace(",b\n", ",a\n").replace(",c\n", ",b\n")
    (tmp_path / "moved" / "dev.csv").write_text(swapped)  # its labels swapped: the same size
    with pytest.raises(ConfigError, match=re.escape(f"task.dev {moved['dev']} (its contents changed since)")):
        run_search(dataclasses.replace(exp, trials=3, task=moved), printer=lambda *a: None)
    assert sum(t.state == TrialState.COMPLETE for t in load(exp).trials) == 2


@pytest.mark.slow
def test_the_final_runs_report_the_customary_metric_beside_the_one_trials_rank_by(tmp_path):
    """A task reported by F1 ranks by accuracy (F1 does not separate a learner from "always
    positive"); its final re-evaluation stores and prints F1 beside accuracy, over the same seeds."""
    words = "good great fine dull bad awful plot film".split()
    for name, n in (("train.csv", 80), ("dev.csv", 24)):
        (tmp_path / name).write_text(
            "text,label\n" + "".join(f"{words[i % 8]} {words[(3 * i) % 8]},{'ab'[i % 2]}\n" for i in range(n))
        )
    task = {
        "train": str(tmp_path / "train.csv"),
        "dev": str(tmp_path / "dev.csv"),
        "text_columns": ["text"],
        "main_metric": "f1",
    }
    exp = experiment(
        tmp_path,
        trials=1,
        presets=["bitfit"],
        task=task,
        fidelity=Fidelity(length_buckets=0, k=40, epochs=1, batch_size=16, max_length=16, search_dev=16),
        final=FinalEval(seeds=2, epochs=1, max_front=1, presets="best", baselines=False),
    )
    said = []
    run_search(exp, printer=said.append)
    finals = {k: v for k, v in load(exp).user_attrs.items() if k.startswith("final:")}
    assert finals and all(len(f["customary"]["f1"]) == len(f["scores"]) == 2 for f in finals.values())
    number, f = next(iter(finals.items()))
    line = next(x for x in said if x.startswith(f"re-evaluated trial {number.split(':')[1]}"))
    assert f"test accuracy {f['mean']:.4f}" in line
    assert f"(f1 {sum(f['customary']['f1']) / 2:.4f}, as papers report it)" in line


@pytest.mark.parametrize(
    "text, expected",
    [("0.5%", 5000), ("120000", 120000), ("1.2e5", 120000), ("2%", 20000), ("1000000", 1_000_000), ("100%", 1_000_000)],
)
def test_budget_parsing(text, expected):
    assert parse_budget(text, 1_000_000) == expected


@pytest.mark.parametrize("text", ["0.5 %", "5e", "-1", "1.5", "abc", "200%", "1000001", "1e12"])
def test_bad_budgets(text):
    with pytest.raises(ConfigError, match="budget"):
        parse_budget(text, 1_000_000)


def test_a_study_that_did_not_record_its_backbone_takes_counts_only():
    assert parse_budget("1e12", None) == 10**12
    with pytest.raises(ConfigError, match="is a percentage, and this study did not record its backbone's size"):
        parse_budget("0.5%", None)


def test_a_stop_while_an_outcome_is_written_leaves_the_trial_to_the_interrupt_handler(tmp_path, monkeypatch):
    """SIGTERM or Ctrl-C inside a trial's closing write: the trial is still this worker's (beating),
    so the interrupt handler fails it as interrupted; released, it stayed RUNNING (seen in CI)."""
    from petl_nas.core.tiny import tiny_backbone
    from petl_nas.search.executors import Recorder
    from petl_nas.search.study import TrialSource
    from petl_nas.study.space import SearchSpace
    from petl_nas.study.storage import Heartbeat, open_storage

    storage = open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=60, grace_period=120)
    study = optuna.create_study(storage=storage, directions=["maximize", "minimize"])
    heartbeat = Heartbeat(storage, 60)
    source = TrialSource(
        study,
        SearchSpace.load("small"),
        tiny_backbone(vocab_size=50).config,
        budget=None,
        n_layers=2,
        heartbeat=heartbeat,
    )
    p = source.next()

    def stopped_in_the_write(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(study, "tell", stopped_in_the_write)
    try:
        with pytest.raises(KeyboardInterrupt):
            Recorder(source).complete(p, TrialResult(score=0.5, train_s=1.0))
        assert p.trial._trial_id in heartbeat.live
        monkeypatch.undo()
        Recorder(source).complete(p, TrialResult(score=0.5))  # written whole: released
        assert p.trial._trial_id not in heartbeat.live
    finally:
        heartbeat.stop()


@pytest.mark.parametrize("given", ["study", "storage"])
def test_closing_a_study_or_its_storage_leaves_the_sqlite_file_alone(tmp_path, given):
    """What a suite or a search does when it has read a study: its connections close, so SQLite in
    WAL mode folds its -wal and -shm files back into the one study file."""
    from petl_nas.study.storage import close_storage, open_storage

    storage = open_storage(f"sqlite:///{tmp_path}/s.db")
    study = optuna.create_study(storage=storage, study_name="s")
    study.set_user_attr("x", 1)
    assert (tmp_path / "s.db-wal").exists()
    close_storage(study if given == "study" else storage)
    assert not (tmp_path / "s.db-wal").exists() and not (tmp_path / "s.db-shm").exists()
    assert optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").user_attrs == {"x": 1}


# ---- the Ray searcher's state machine, without a cluster ------------------------------------
def test_study_searcher_records_every_outcome(tmp_path):
    pytest.importorskip("ray")
    from petl_nas.core.tiny import tiny_backbone
    from petl_nas.search.executors import Recorder, _make_searcher
    from petl_nas.search.study import TrialSource
    from petl_nas.search.worker import TrialSpec
    from petl_nas.study.space import SearchSpace

    study = optuna.create_study(directions=["maximize", "minimize"])
    model = tiny_backbone(vocab_size=50)
    source = TrialSource(study, SearchSpace.load("small"), model.config, budget=None, n_layers=2)
    done = []
    searcher = _make_searcher(
        source,
        6,
        lambda p: TrialSpec(backbone=TINY_BACKBONE, task="demo_sentiment", config={}, recipe={}, number=p.number),
        Recorder(source, lambda p, s, i: done.append(s)),
    )
    for i in range(5):
        assert searcher.suggest(f"r{i}")["spec"]["number"] == i
    # As Ray calls it: a result its scheduler stops the trial at goes to on_trial_complete only.
    searcher.on_trial_result("r0", {"score": 0.6, "training_iteration": 1, "final": False})
    searcher.on_trial_complete("r0", {"score": 0.5, "training_iteration": 2, "final": False})
    searcher.on_trial_result("r1", {"score": 0.6, "training_iteration": 1, "final": False})
    searcher.on_trial_result("r1", {"score": 0.7, "last_score": 0.65, "training_iteration": 2, "final": True})
    searcher.on_trial_complete(
        "r1", {"score": 0.7, "last_score": 0.65, "training_iteration": 2, "final": True, "metrics": {"accuracy": 0.7}}
    )
    searcher.on_trial_complete(
        "r2",
        {
            "score": -2.0,
            "final": False,
            "failed": "ValueError: bad data",
            "traceback": "Traceback ...\nValueError: bad data",
        },
    )
    searcher.on_trial_complete("r3", {"score": -2.0, "final": False, "failed": "non-finite loss", "nan": True})
    searcher.on_trial_result("r4", {"score": 0.4, "training_iteration": 1, "final": False})  # recorded once,
    searcher.on_trial_complete("r4", {"score": 0.4, "training_iteration": 1, "final": False})  # though seen twice
    states = [t.state for t in study.trials]
    assert states == [TrialState.PRUNED, TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED, TrialState.PRUNED]
    assert study.trials[4].user_attrs["intermediate_scores"] == [0.4]
    assert study.trials[0].user_attrs["intermediate_scores"] == [0.6, 0.5]  # the stop's own evaluation too
    assert study.trials[1].user_attrs["intermediate_scores"] == [0.6, 0.65]  # the closing report's last one
    assert study.trials[2].user_attrs["fail_reason"] == "ValueError: bad data"
    assert (
        study.trials[2].user_attrs["fail_traceback"] == "Traceback ...\nValueError: bad data"
    )  # where, for the dashboard
    assert done == ["pruned", "complete", "failed", "pruned", "pruned"]
    searcher.suggest("r5")
    assert searcher.suggest("r6") == searcher.FINISHED


def test_a_trial_that_closes_while_a_dropped_ctrl_c_is_pending_is_still_written(tmp_path):
    """A stop Python dropped is raised again at the next intermediate score; the closing of a trial
    (its last score and its result) is written whole first, not cut between the two."""
    import signal

    pytest.importorskip("ray")
    from petl_nas.core.tiny import tiny_backbone
    from petl_nas.search.executors import Recorder, _make_searcher
    from petl_nas.search.interrupts import raise_if_stopped, stops_on_signals
    from petl_nas.search.study import TrialSource
    from petl_nas.search.worker import TrialSpec
    from petl_nas.study.space import SearchSpace

    study = optuna.create_study(directions=["maximize", "minimize"])
    source = TrialSource(study, SearchSpace.load("small"), tiny_backbone(vocab_size=50).config, budget=None, n_layers=2)
    searcher = _make_searcher(
        source,
        1,
        lambda p: TrialSpec(backbone=TINY_BACKBONE, task="demo_sentiment", config={}, recipe={}, number=p.number),
        Recorder(source),
    )
    searcher.suggest("r0")
    with stops_on_signals():
        with pytest.raises(KeyboardInterrupt):
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # pressed; suppose Python dropped it
        try:
            searcher.on_trial_complete(
                "r0",
                {"score": 0.7, "last_score": 0.7, "training_iteration": 1, "final": True, "metrics": {"accuracy": 0.7}},
            )
        except KeyboardInterrupt:
            pytest.fail("the pending stop cut the trial's closing short")
        assert study.trials[0].state == TrialState.COMPLETE
        assert study.trials[0].user_attrs["intermediate_scores"] == [0.7]
        with pytest.raises(KeyboardInterrupt):
            raise_if_stopped()  # and the stop is still there


@pytest.mark.slow
def test_search_on_a_local_csv_task_through_ray(tmp_path):
    """Relative paths too: Ray runs each trial in its own working directory."""
    ray = pytest.importorskip("ray")
    import csv
    import random

    rng = random.Random(0)
    words = {"1": ["great", "fine", "superb"], "0": ["bad", "dull", "awful"]}
    for split, n in (("train", 120), ("dev", 40)):
        with open(tmp_path / f"{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for _ in range(n):
                y = rng.choice("01")
                w.writerow([" ".join(rng.choice(words[y]) for _ in range(3)) + " movie", y])
    task = {
        "train": "train.csv",
        "dev": "dev.csv",
        "text_columns": ["text"],  # relative to tmp_path
        "label_column": "label",
        "name": "my_csv",
    }
    exp = experiment(
        tmp_path,
        task=task,
        trials=2,
        presets="none",
        executor="ray",
        fidelity=Fidelity(length_buckets=0, k=None, epochs=6, batch_size=16, max_length=16, search_dev=30),
    )
    try:
        summary = run_search(exp, printer=lambda *a: None)
    finally:
        ray.shutdown()
    study = load(exp)
    assert study.user_attrs["task"] == "my_csv" and len(trained(study)) == 2
    assert summary.front


SHARED_GLUE = SHARED_GLUE


@pytest.mark.slow
def test_a_search_runs_on_byte_order_marked_copies_of_the_shared_glue_folder(tmp_path):
    """Every task folder of ../shared/data/glue, copied whole with a UTF-8 byte-order mark put in
    front of each file (as GLUE's download script writes MRPC): each task with a training file is
    searched and scores a trial; a folder without one is refused in one line naming the file."""
    if not SHARED_GLUE.is_dir():
        pytest.skip(f"no GLUE data at {SHARED_GLUE}")
    marked = tmp_path / "glue"
    for folder in sorted(p for p in SHARED_GLUE.iterdir() if p.is_dir()):
        (marked / folder.name).mkdir(parents=True)
        for f in folder.glob("*.tsv"):
            (marked / folder.name / f.name).write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
    assert (marked / "SST-2" / "train.tsv").read_bytes()[:3] == b"\xef\xbb\xbf"
    folders = {"CoLA": "cola", "SST-2": "sst2", "STS-B": "stsb", "QNLI": "qnli"}
    searched = []
    for folder, name in sorted(folders.items()):
        if not (marked / folder).is_dir():
            continue
        exp = experiment(
            tmp_path,
            name=name,
            task=name,
            data_dir=str(marked),
            trials=1,
            presets=["bitfit"],
            storage=f"sqlite:///{tmp_path}/{name}.db",
            fidelity=Fidelity(length_buckets=0, k=64, epochs=1, batch_size=16, max_length=24, search_dev=32),
        )
        if not (marked / folder / "train.tsv").exists():
            with pytest.raises(ConfigError, match="train.tsv"):
                run_search(exp, printer=lambda *a: None)
            continue
        run_search(exp, printer=lambda *a: None)
        (trial,) = trained(load(exp))
        assert trial.state == TrialState.COMPLETE and trial.values[0] == trial.values[0]  # a finite score
        searched.append(name)
    assert {"cola", "sst2", "stsb"} <= set(searched)


def test_file_task_errors_name_the_problem(tmp_path):
    from petl_nas.tasks import resolve_task

    with pytest.raises(
        ConfigError,
        match=r"needs train, dev and text_columns \(a generation task names its kind "
        r"instead: kind: seq2seq or causal_lm\)$",
    ):
        resolve_task({"train": "a.csv"})
    many = tmp_path / "many.csv"  # targets read as labels: thousands of classes
    many.write_text("text,label\n" + "".join(f"t{i},target {i}\n" for i in range(30)))
    (tmp_path / "other.csv").write_text("text,label\nx,another target\n")
    task = resolve_task({"train": str(many), "dev": str(tmp_path / "other.csv"), "text_columns": ["text"]})
    from petl_nas.tasks import load_splits

    with pytest.raises(
        ConfigError,
        match=r"label 'another target' is not one of .*'s labels \(target 0, target 1, "
        r".*, \.\.\. \(30 in all\)\)$",
    ):
        load_splits(task)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_task({"train": str(tmp_path / "nope.csv"), "dev": str(tmp_path / "nope.csv"), "text_columns": ["t"]})


@pytest.mark.slow
def test_the_presets_sampler_trains_only_the_seeded_presets(tmp_path):
    """``sampler: presets`` trains the queued presets and proposes nothing of its own."""
    exp = experiment(tmp_path, sampler="presets", trials=3, budget="20%")
    run_search(exp, printer=lambda *a: None)
    done = trained(load(exp))
    assert done and all(t.user_attrs.get("preset") for t in done)  # a grid of the seeded presets, nothing else


def searched_study(monkeypatch, exp):
    """Run the search and return the study object it drove (its sampler is not stored in the database)."""
    from petl_nas.search import driver as search_module

    opened = []
    real = search_module.open_study
    monkeypatch.setattr(search_module, "open_study", lambda *a, **kw: opened.append(real(*a, **kw)) or opened[-1])
    run_search(exp, printer=lambda *a: None)
    (study,) = opened
    return study


def replayed_params(trials, sampler_for, space="small", n_layers=2, flat=False):
    """The parameters the samplers ``sampler_for(n)`` propose (n: the trials the study holds at each
    draw), in a fresh in-memory study, for the same sequence of trials on the same space, told the
    same outcomes."""
    from petl_nas.study.space import SearchSpace

    space = SearchSpace.load(space)
    replay = optuna.create_study(directions=["maximize", "minimize"])
    out = []
    for t in trials:
        replay.sampler = sampler_for(len(replay.trials))
        trial = replay.ask()
        try:
            space.sample(trial, n_layers, flat=flat)
        except ConfigError:
            pass  # an invalid draw: the search recorded it as FAIL
        out.append(trial.params)
        if t.state == TrialState.COMPLETE:
            replay.tell(trial, t.values)
        else:
            replay.tell(trial, state=t.state)
    return out


@pytest.mark.parametrize(
    "sampler, cls",
    [
        ("nsga2", optuna.samplers.NSGAIISampler),
        ("random", optuna.samplers.RandomSampler),
        ("gp", optuna.samplers.GPSampler),
    ],
)
@pytest.mark.slow
def test_proposals_come_from_the_named_sampler_with_the_experiment_seed(tmp_path, monkeypatch, sampler, cls):
    """``sampler: nsga2|random|gp`` makes the study use that sampler, seeded with the experiment's
    seed plus the number of trials the study holds at each draw: every proposal (over-budget ones
    included) is exactly what samplers of that class so seeded propose for the same trials (and not
    what those from another seed propose, so the comparison can fail), and no proposal repeats."""
    exp = experiment(tmp_path, sampler=sampler, trials=3, budget="20%", presets="none", seed=7)
    study = searched_study(monkeypatch, exp)
    assert type(study.sampler) is cls
    trials = sorted(load(exp).trials, key=lambda t: t.number)
    assert len(trained(load(exp))) == 3
    params = [t.params for t in trials]
    assert len({repr(sorted(p.items())) for p in params}) == len(params)  # no proposal repeats
    flat = sampler == "gp"  # the flattened space: every dimension in every trial
    assert params == replayed_params(trials, lambda n: cls(seed=7 + n), flat=flat)
    assert params != replayed_params(trials, lambda n: cls(seed=8 + n), flat=flat)
    if flat:
        assert all({"attn.rank", "attn.length", "ffn.bottleneck"} <= set(p) for p in params)


@pytest.mark.slow
def test_search_trials_are_scored_on_search_dev_and_only_the_final_reevaluation_on_test(tmp_path, monkeypatch):
    """The search selects on search_dev and never sees the test split: every TrialSpec it hands
    the executor's trainer says ``eval_split == "search_dev"``; only the final re-evaluation of the
    front (re-trained with each seed) says "test"."""
    from petl_nas.search import executors, finals

    searched, final = [], []

    def spy(seen, real):
        return lambda spec, **kw: seen.append(spec) or real(spec, **kw)

    monkeypatch.setattr(executors, "run_trial", spy(searched, executors.run_trial))
    monkeypatch.setattr(finals, "run_trial", spy(final, finals.run_trial))
    # One preset and one sampled trial; the preset is re-evaluated (final presets: best) even when
    # the front is empty, so the final re-evaluation always trains something.
    exp = experiment(
        tmp_path, trials=2, presets=["bitfit"], final=FinalEval(seeds=2, epochs=1, max_front=1, baselines=False)
    )
    said = []
    run_search(exp, printer=said.append)
    study = load(exp)
    n = sum(1 for k in study.user_attrs if k.startswith("final:"))
    # The final stage says what it will train and with how many threads (chosen: `threads`), then
    # counts its runs (configurations x seeds) down.
    assert any(
        line.startswith(f"final: {n} configuration(s) x 2 seed(s) on the test split, in this process with ")
        and "CPU thread(s) (" in line
        for line in said
    )
    assert [line.split("; ")[-1] for line in said if line.startswith("re-evaluated trial")][
        -1
    ] == f"{2 * n} of {2 * n} runs"
    assert sorted(s.number for s in searched) == sorted(t.number for t in trained(study))
    assert [s.eval_split for s in searched] == ["search_dev"] * 2
    marked = sorted(int(k.split(":")[1]) for k in study.user_attrs if k.startswith("final:"))
    assert marked and sorted(s.number for s in final) == sorted(marked * 2)  # each one, once per seed
    assert [s.eval_split for s in final] == ["test"] * len(final)


@pytest.mark.slow
def test_a_trial_starts_from_its_seed_alone_whatever_ran_before():
    import torch

    from petl_nas import ModuleSpec, PetlConfig
    from petl_nas.search.worker import TrialSpec, run_trial

    config = PetlConfig(modules=(ModuleSpec(form="adapter", position="ffn", size=4, init="bert"),)).to_dict()
    spec = TrialSpec(
        backbone=TINY_BACKBONE,
        task="demo_sentiment",
        config=config,
        k=64,
        recipe={"lr": 3e-3, "epochs": 1, "batch_size": 16, "max_length": 16, "seed": 3},
    )
    first = run_trial(spec)
    torch.rand(1000)  # another trial's draws in the same worker
    again = run_trial(spec)
    assert again.history == first.history and again.score == first.score
    other = run_trial(dataclasses.replace(spec, recipe={**spec.recipe, "seed": 4}))
    assert other.history != first.history


def test_a_trial_scores_its_last_evaluation_unless_asked_for_its_best():
    from petl_nas import ModuleSpec, PetlConfig
    from petl_nas.search.worker import TrialSpec, run_trial

    config = PetlConfig(modules=(ModuleSpec(form="lora", size=4, scale=2.0),)).to_dict()
    spec = TrialSpec(
        backbone=TINY_BACKBONE,
        task="demo_sentiment",
        config=config,
        k=64,
        search_dev=64,
        recipe={"lr": 3e-2, "epochs": 4, "batch_size": 16, "max_length": 16, "seed": 2},
    )
    last, best = run_trial(spec), run_trial(dataclasses.replace(spec, score="best"))
    scores = [h["accuracy"] for h in last.history]
    assert len(scores) == 4 and last.history == best.history
    assert max(scores) != scores[-1]  # this seed's run peaks before its end
    assert last.score == last.last_score == scores[-1]
    assert best.score == best.best_score == max(scores)
    with pytest.raises(ConfigError, match="fidelity: score: expected one of"):
        Fidelity(length_buckets=0, score="mean")


@pytest.mark.slow
def test_the_final_reevaluation_reports_last_epochs_not_the_best_on_test(tmp_path, monkeypatch):
    from petl_nas.search import finals

    runs = []
    real = finals.run_trial
    monkeypatch.setattr(finals, "run_trial", lambda spec, **kw: runs.append(real(spec, **kw)) or runs[-1])
    exp = experiment(
        tmp_path, trials=2, presets="none", final=FinalEval(seeds=2, epochs=2, max_front=1, baselines=False)
    )
    run_search(exp, printer=lambda *a: None)
    entry = next(v for k, v in load(exp).user_attrs.items() if k.startswith("final:"))
    finals = [r for r in runs if r.epochs == 2]
    assert entry["scores"] == [r.last_score for r in finals] and len(finals) == 2


def _proposals(sampler, n: int) -> list[tuple[float, float]]:
    """The first ``n`` points ``sampler`` proposes on a smooth two-dimensional objective."""
    study = optuna.create_study(sampler=sampler)
    points = []
    for _ in range(n):
        trial = study.ask()
        x, y = trial.suggest_float("x", 0, 1), trial.suggest_float("y", 0, 1)
        study.tell(trial, (x - 0.3) ** 2 + (y - 0.7) ** 2)
        points.append((x, y))
    return points


@pytest.mark.parametrize("name, startup", [("tpe", 3), ("gp", 4)])
def test_startup_trials_reach_the_model_based_samplers(name, startup):
    """With ``startup_trials`` N, TPE and GP propose exactly a seeded RandomSampler's first N points,
    then their model's (which differ from the random ones)."""
    from petl_nas.search.study import make_sampler

    model_based = _proposals(make_sampler(name, 5, startup), startup + 2)
    random = _proposals(optuna.samplers.RandomSampler(seed=5), startup + 2)
    assert model_based[:startup] == random[:startup]
    still_random = [m for m, r in zip(model_based[startup:], random[startup:]) if m == r]
    assert not still_random, f"{name} still proposes the random sampler's points after {startup}: {still_random}"


def test_startup_trials_default_and_bounds():
    assert Experiment().startup_trials == 10
    with pytest.raises(ConfigError, match="startup_trials: expected"):
        Experiment(startup_trials=0)


def test_a_trial_killed_between_its_attribute_writes_is_drawn_again_from_its_parameters():
    """A driver killed after writing a trial's configuration but before its learning rate leaves a
    retry with ``petl_config`` and no ``recipe``: it is drawn from its parameters, not refused."""
    from petl_nas.core.presets import preset, preset_lr
    from petl_nas.search.study import TrialSource
    from petl_nas.study.space import SearchSpace
    from petl_nas.tasks import resolve_task
    from petl_nas.training.loading import model_config_for

    model_config = model_config_for(TINY_BACKBONE, resolve_task("demo_keyword"))
    space = SearchSpace.load("small")
    params, _ = space.nearest_point(space.with_head(preset("lora", model_config)), preset_lr("lora"), 2)
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.enqueue_trial(params, user_attrs={"petl_config": {"modules": []}})  # half-written
    p = TrialSource(study, space, model_config, None, 2).next()
    assert p.config.modules and p.lr == pytest.approx(params["lr"])


@pytest.mark.parametrize("sampler", ["tpe", "random"])
@pytest.mark.slow
def test_a_resumed_study_draws_new_proposals(tmp_path, sampler):
    """Running the experiment again with more trials goes on drawing: no sampled trial repeats
    another's parameters (one sampler seeded once per process drew its first proposals again in
    every process, so a resumed study, or a second worker, trained copies)."""
    exp = experiment(
        tmp_path,
        sampler=sampler,
        trials=3,
        budget="20%",
        presets="none",
        seed=3,
        fidelity=Fidelity(length_buckets=0, k=64, epochs=1, batch_size=16, max_length=16, search_dev=32),
    )
    run_search(exp, printer=lambda *a: None)
    run_search(dataclasses.replace(exp, trials=6), printer=lambda *a: None)
    sampled = [repr(sorted(t.params.items())) for t in load(exp).trials if t.params]
    assert len(sampled) >= 6
    assert len(set(sampled)) == len(sampled), sampled


@pytest.mark.slow
def test_ctrl_c_fails_the_running_trial_for_a_retry_and_the_resume_trains_it(tmp_path, monkeypatch, capsys):
    """Ctrl-C during a trial: one line and exit 130; the running trial is failed as interrupted at
    once (not left RUNNING for the grace period) and queued again; running the command again trains
    that retry and the study ends with exactly the trials asked for."""
    from petl_nas.app.cli import main
    from petl_nas.search import executors
    from petl_nas.search.study import INTERRUPTED, is_trained
    from petl_nas.study.records import sessions

    exp = experiment(
        tmp_path,
        trials=3,
        presets="none",
        budget="20%",
        fidelity=Fidelity(length_buckets=0, k=64, epochs=1, batch_size=16, max_length=16, search_dev=32),
    )
    write_experiment(tmp_path, exp)
    real, calls = executors.run_trial, []

    def interrupted_second(trial_spec, **kw):
        calls.append(trial_spec.number)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(trial_spec, **kw)

    monkeypatch.setattr(executors, "run_trial", interrupted_second)
    assert main(["search", "--experiment", "e.yaml"]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        "petl-nas: interrupted; the study is kept: run the same command again to go on"
    )
    study = load(exp)
    (stopped,) = [t for t in study.trials if t.state == TrialState.FAIL]
    assert stopped.user_attrs["fail_kind"] == INTERRUPTED and stopped.number == calls[1]
    (retry,) = [t for t in study.trials if t.state == TrialState.WAITING]
    assert retry.params == stopped.params
    assert not any(t.state == TrialState.RUNNING for t in study.trials)
    (stopped_run,) = sessions(study.user_attrs)  # the stopped run's wall time is kept
    assert stopped_run["wall_s"] > 0
    monkeypatch.setattr(executors, "run_trial", real)
    assert main(["search", "--experiment", "e.yaml"]) == 0
    assert "trials: 3 complete, 0 pruned, 0 failed, 1 interrupted, " in capsys.readouterr().out
    study = load(exp)
    assert sessions(study.user_attrs)[0] == stopped_run and len(sessions(study.user_attrs)) == 2
    assert len([t for t in study.trials if is_trained(t)]) == 3
    assert study.trials[retry.number].state == TrialState.COMPLETE


def test_ctrl_c_before_the_study_exists_says_nothing_was_written(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the search reads its data (or imports torch) once said "the study is kept" of a
    study never made; and an error raised while that stop unwinds is the stop too."""
    from petl_nas.app.cli import main
    from petl_nas.search import inputs as search  # where the search reads its data

    write_experiment(tmp_path, experiment(tmp_path))
    for stop in (KeyboardInterrupt(), None):

        def reading(*args, stop=stop, **kw):
            if stop is not None:
                raise stop
            try:
                raise KeyboardInterrupt
            finally:
                raise OSError("[Errno 2] No such file or directory")  # cut short on its way out

        monkeypatch.setattr(search, "load_splits", reading)
        assert main(["search", "--experiment", "e.yaml"]) == 130
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == "petl-nas: interrupted before the study was made: nothing was written"
        if stop is None:  # the error is said, in one warning
            assert err[-2] == "petl-nas: warning: stopping raised OSError: [Errno 2] No such file or directory"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["e.yaml"]


def test_a_second_ctrl_c_while_the_first_is_cleaned_up_still_marks_the_trial(tmp_path, monkeypatch, capsys):
    """Ctrl-C twice: the second landed while the running trials were being marked, cut that short
    and left the trial RUNNING (a resume then waited out its heartbeat and counted it failed). Now
    it is said, the marking ends, and the search stops as the first Ctrl-C asked."""
    import os
    import signal

    from petl_nas.app.cli import main
    from petl_nas.search import driver as search
    from petl_nas.search import executors
    from petl_nas.search.study import INTERRUPTED

    exp = experiment(tmp_path, trials=3, presets="none", budget="20%")
    write_experiment(tmp_path, exp)
    real_trial, real_marking, calls = executors.run_trial, search.fail_interrupted, []

    def interrupted_second(trial_spec, **kw):
        calls.append(trial_spec.number)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_trial(trial_spec, **kw)

    def pressed_again(*args, **kw):
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs at once, here, in the main thread
        return real_marking(*args, **kw)

    monkeypatch.setattr(executors, "run_trial", interrupted_second)
    monkeypatch.setattr(search, "fail_interrupted", pressed_again)
    assert main(["search", "--experiment", "e.yaml"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2:] == [
        "petl-nas: still stopping: the running trials are being marked as interrupted",
        "petl-nas: interrupted; the study is kept: run the same command again to go on",
    ]
    trials = load(exp).trials
    assert not any(t.state == TrialState.RUNNING for t in trials)
    (stopped,) = [t for t in trials if t.state == TrialState.FAIL]
    assert stopped.user_attrs["fail_kind"] == INTERRUPTED and stopped.number == calls[1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # as before the search


def test_ctrl_c_that_the_storage_refuses_to_record_still_stops_the_search_in_one_warning_and_one_line(
    tmp_path, monkeypatch, capsys
):
    """Ctrl-C can land inside a storage call, and marking the running trials interrupted can then
    fail too (seen: SQLite's "database is locked" after an interrupt inside a TPE read, through Ray):
    the search still stops with exit 130, one warning saying when a resume retries those trials and
    the usual line, not a traceback."""
    from petl_nas.app.cli import main
    from petl_nas.search import executors
    from petl_nas.search.study import INTERRUPTED
    from petl_nas.study import storage

    exp = experiment(tmp_path, trials=2, presets="none", budget="20%", grace_period=45)
    write_experiment(tmp_path, exp)

    def interrupted(trial_spec, **kw):
        raise KeyboardInterrupt

    real = storage.fail_now

    def refused(study, trial_ids, user_attrs=None):  # marking them interrupted; stale trials pass
        if (user_attrs or {}).get("fail_kind") == INTERRUPTED:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.\n(detail)")
        return real(study, trial_ids, user_attrs)

    monkeypatch.setattr(executors, "run_trial", interrupted)
    monkeypatch.setattr(storage, "fail_now", refused)
    assert main(["search", "--experiment", "e.yaml"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-2:] == [
        "petl-nas: warning: the running trials could not be marked as interrupted (An exception is raised during "
        "the commit.); a resumed search retries them once their heartbeat is 45s old",
        "petl-nas: interrupted; the study is kept: run the same command again to go on",
    ]
    assert len([t for t in load(exp).trials if t.state == TrialState.RUNNING]) == 1  # left for the grace period


def test_an_error_raised_while_ctrl_c_unwinds_still_marks_the_trial_interrupted(tmp_path, monkeypatch, capsys):
    """A clean-up that fails while the interrupt unwinds (a storage call cut short) raises an error
    whose context is the interrupt: the search still marks its running trial interrupted, says what
    was raised in one warning, and exits 130 (it left the trial RUNNING, with no word)."""
    from petl_nas.app.cli import main
    from petl_nas.search import executors
    from petl_nas.search.study import INTERRUPTED

    exp = experiment(tmp_path, trials=2, presets="none", budget="20%")
    write_experiment(tmp_path, exp)

    def cut_short(trial_spec, **kw):
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("clean-up failed\n(detail)")

    monkeypatch.setattr(executors, "run_trial", cut_short)
    assert main(["search", "--experiment", "e.yaml"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-2:] == [
        "petl-nas: warning: stopping raised RuntimeError: clean-up failed",
        "petl-nas: interrupted; the study is kept: run the same command again to go on",
    ]
    trials = load(exp).trials
    assert not any(t.state == TrialState.RUNNING for t in trials)
    assert [t.user_attrs.get("fail_kind") for t in trials if t.state == TrialState.FAIL] == [INTERRUPTED]


def test_ctrl_c_inside_a_storage_call_that_left_the_sqlite_write_lock_in_garbage_still_marks_the_trial(
    tmp_path, monkeypatch, capsys
):
    """An interrupt inside a storage call can leave its SQLite connection, in a write transaction, in
    a reference cycle (measured: 2 of 300 interrupts of a read in a loop; through Ray it ended in
    "database is locked"). The search collects that garbage before marking its running trial
    interrupted, so the mark lands and the retry is queued."""
    import gc

    from petl_nas.app.cli import main
    from petl_nas.search import executors
    from petl_nas.search.study import INTERRUPTED
    from petl_nas.study import storage
    from petl_nas.study.storage import open_storage

    exp = experiment(tmp_path, trials=2, presets="none", budget="20%")
    write_experiment(tmp_path, exp)

    def interrupted_holding_the_lock(trial_spec, **kw):
        conn = open_storage(exp.storage_url).engine.connect()
        conn.begin()  # BEGIN IMMEDIATE: the write lock
        cycle = {"conn": conn}
        cycle["self"] = cycle  # only a collection frees it
        raise KeyboardInterrupt

    monkeypatch.setattr(executors, "run_trial", interrupted_holding_the_lock)
    monkeypatch.setattr(storage, "SQLITE_BUSY_TIMEOUT_S", 5)  # a regression waits 5 s for the lock, not 120
    gc.disable()  # no automatic collection to do the search's work
    try:
        assert main(["search", "--experiment", "e.yaml"]) == 130
    finally:
        gc.enable()
    assert "warning" not in capsys.readouterr().err
    (stopped,) = [t for t in load(exp).trials if t.state == TrialState.FAIL]
    assert stopped.user_attrs["fail_kind"] == INTERRUPTED


@pytest.mark.slow
def test_sigterm_stops_a_ray_search_as_ctrl_c_does(tmp_path):
    """SIGTERM (`timeout`, a batch scheduler) to `petl-nas search` through Ray: exit 143, the one
    line, and the running trial failed as interrupted for a retry. Ray's start-up installs a SIGTERM
    handler of its own that printed a native stack and killed the process, the trial left RUNNING."""
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("ray")
    from petl_nas.search.study import INTERRUPTED

    exp = experiment(tmp_path, executor="ray", trials=40, presets="none", budget="20%")
    write_experiment(tmp_path, exp, epochs=20, ray_address="local", scheduler="fifo")
    run = subprocess.Popen(
        [sys.executable, "-m", "petl_nas.app.cli", "search", "--experiment", "e.yaml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def running_after_one_complete() -> list[int]:
        try:
            trials = load(exp).trials
        except KeyError:  # no study in the file yet
            return []
        done = any(t.state == TrialState.COMPLETE for t in trials)
        return [t.number for t in trials if t.state == TrialState.RUNNING] if done else []

    deadline = time.time() + 300
    while run.poll() is None and time.time() < deadline and not (running := running_after_one_complete()):
        time.sleep(0.5)  # a trial done, others running in Ray workers
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 143, err  # 128 + SIGTERM, as a shell says of a process it killed
    assert (
        err.strip().splitlines()[-1] == "petl-nas: interrupted; the study is kept: run the same command again to go on"
    )
    assert "SIGTERM received" not in err
    trials = load(exp).trials
    assert running and not any(t.state == TrialState.RUNNING for t in trials)
    for number in running:  # each ended meanwhile, or was stopped for a retry
        assert trials[number].state == TrialState.COMPLETE or trials[number].user_attrs["fail_kind"] == INTERRUPTED


def test_the_summary_counts_interrupted_trials_apart_from_failed_ones():
    """A trial stopped by Ctrl-C is trained again on resume: the trials line counts it as interrupted,
    not failed (it said 2 failed here)."""
    from optuna.trial import create_trial

    from petl_nas.search.driver import summarize
    from petl_nas.search.study import INTERRUPTED

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.add_trial(create_trial(values=[0.8, 100.0]))
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"fail_kind": INTERRUPTED}))
    study.add_trial(
        create_trial(
            state=TrialState.FAIL, user_attrs={"fail_kind": "out of memory", "fail_reason": "CUDA out of memory"}
        )
    )
    summary = summarize(study, Experiment(), None, 10_000)
    assert summary.counts["failed"] == 1 and summary.counts["interrupted"] == 1
    lines = summary.table().splitlines()
    assert (
        "trials: 1 complete, 0 pruned, 1 failed, 1 interrupted, 0 over budget (never trained); this run took 0s"
        in lines
    )
    assert f"failures by kind: {INTERRUPTED} 1, out of memory 1" in lines


def test_a_draw_that_trains_nothing_is_invalid_not_a_failed_trial():
    """No module on a generation backbone (its LM head frozen) trains nothing: recorded as an invalid
    configuration, never trained and never counted (it once failed in the optimizer and took a
    trial's place); on a classifier the same draw still trains its head."""
    from petl_nas.search.study import INVALID, TrialSource, failure_kind
    from petl_nas.study.space import SearchSpace
    from petl_nas.tasks import resolve_task
    from petl_nas.training.loading import model_config_for

    space = SearchSpace.load("small")
    empty = {"lr": 1e-2, "attn.form": "none", "ffn.form": "none"}
    bart = {
        "tiny": {
            "model_type": "bart",
            "d_model": 16,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 32,
            "decoder_ffn_dim": 32,
            "vocab_size": 300,
        }
    }
    for backbone, task, trains in ((bart, "demo_copy", False), (TINY_BACKBONE, "demo_keyword", True)):
        study = optuna.create_study(directions=["maximize", "minimize"])
        study.enqueue_trial(empty)
        source = TrialSource(
            study,
            space,
            model_config_for(backbone, resolve_task(task)),
            None,
            1,
            head_trains=not resolve_task(task).generative,
        )
        p = source.next()
        first = study.trials[0]
        if trains:
            assert p.trial.number == first.number and p.config.modules == ()
        else:  # recorded invalid, and the next draw taken instead
            assert failure_kind(first) == INVALID and "nothing to train" in first.user_attrs["fail_reason"]
            assert p.trial.number != first.number and p.trainable > 0


def test_a_search_dev_too_small_to_rank_is_said(tmp_path):
    lines = []
    exp = experiment(
        tmp_path,
        trials=1,
        presets="none",
        budget="20%",
        fidelity=Fidelity(length_buckets=0, k=64, epochs=1, batch_size=16, max_length=16, search_dev=8),
    )
    run_search(exp, printer=lines.append)
    assert any(line.startswith("warning: search-dev has only 8 rows, too few to tell trials apart") for line in lines)
    assert any(line.startswith("data: train 64 rows (K=64 of 2,000), search-dev 8 (carved") for line in lines)
    lines.clear()
    run_search(
        dataclasses.replace(
            exp,
            name="t2",
            fidelity=Fidelity(length_buckets=0, k=64, epochs=1, batch_size=16, max_length=16, search_dev=32),
        ),
        printer=lines.append,
    )
    assert not any(line.startswith("warning: search-dev") for line in lines)


def test_sigterm_stops_a_search_as_ctrl_c_does():
    """Inside `stops_on_signals` SIGTERM and SIGINT raise KeyboardInterrupt (the path that fails and
    re-queues running trials); outside it the previous handlers are back. The command then exits
    128 + the signal: 143 for SIGTERM (a batch scheduler's stop), 130 for Ctrl-C."""
    import os
    import signal

    from petl_nas.search.interrupts import exit_status, interruptible, stops_on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s, status in zip(before, (143, 130)):
        with pytest.raises(KeyboardInterrupt) as stop, stops_on_signals():
            os.kill(os.getpid(), s)
        assert exit_status(stop.value) == status
        try:  # an error raised while the stop unwound carries it
            try:
                raise stop.value
            finally:
                raise OSError("cut short")
        except OSError as e:
            assert exit_status(e) == status
    assert exit_status(KeyboardInterrupt()) == 130  # a Ctrl-C outside a search
    with stops_on_signals():  # Ray Tune re-raises a stop as a plain KeyboardInterrupt

        def as_ray_does():
            try:
                signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
            except KeyboardInterrupt:
                stopped = True  # its controller stops the trials, then raises anew
            if stopped:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt) as stop:
            interruptible(as_ray_does, lambda masked: None)
    assert exit_status(stop.value) == 143
    with pytest.raises(KeyboardInterrupt) as stop, stops_on_signals():
        as_ray_does()  # outside `interruptible` too
    assert exit_status(stop.value) == 143
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped interrupt
@pytest.mark.slow
def test_a_ctrl_c_that_python_drops_in_a_finaliser_still_stops_the_search(tmp_path, monkeypatch, capsys):
    """A signal's KeyboardInterrupt raised inside a finaliser is printed as "Exception ignored" and
    dropped by Python (seen in SQLAlchemy's clean-up), and the search went on to its end. The stop
    is remembered and raised again at the trial's next report: exit 130, the trial interrupted."""
    import signal

    from petl_nas.app.cli import main
    from petl_nas.search import executors
    from petl_nas.search.study import INTERRUPTED

    exp = experiment(tmp_path, trials=3, presets="none", budget="20%")
    write_experiment(tmp_path, exp, epochs=2)
    real, calls = executors.run_trial, []

    class PressedDuringItsFinaliser:
        def __del__(self):
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # as if Ctrl-C landed here

    def dropped_in_the_second(trial_spec, **kw):
        calls.append(trial_spec.number)
        if len(calls) == 2:
            PressedDuringItsFinaliser()  # finalised at once: the interrupt is dropped
        return real(trial_spec, **kw)

    monkeypatch.setattr(executors, "run_trial", dropped_in_the_second)
    assert main(["search", "--experiment", "e.yaml"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "petl-nas: interrupted; the study is kept: run the same command again to go on"
    )
    trials = load(exp).trials
    assert [t.user_attrs.get("fail_kind") for t in trials if t.state == TrialState.FAIL] == [INTERRUPTED]
    assert len(calls) == 2 and len([t for t in trials if t.state == TrialState.COMPLETE]) == 1


def test_export_of_a_preset_over_the_budget_says_so(tmp_path, capsys):
    from petl_nas.app.cli import main

    exp = experiment(
        tmp_path,
        trials=1,
        presets="none",
        fidelity=Fidelity(length_buckets=0, k=64, epochs=1, batch_size=16, max_length=16, search_dev=32),
    )
    run_search(exp, printer=lambda *a: None)  # budget 5%: about 1,860; LoRA takes 2,048
    capsys.readouterr()
    for name, over in (("lora", True), ("bitfit", False)):
        assert (
            main(["export", "--storage", exp.storage_url, "--preset", name, "-o", str(tmp_path / f"{name}.yaml")]) == 0
        )
        out = capsys.readouterr().out
        assert (f"note: preset {name} takes " in out and "over the study's budget of" in out) == over


def test_zero_trials_is_for_the_one_shot_strategy_only():
    with pytest.raises(
        ConfigError, match=r"trials: expected a whole number >= 1, got 0 \(0 only with strategy: oneshot\)"
    ):
        Experiment(trials=0)
    assert Experiment(trials=0, strategy="oneshot").trials == 0


@pytest.mark.slow
def test_presets_beyond_the_trials_asked_for_still_leave_room_for_the_sweep(tmp_path):
    """More presets than ``trials``: every preset and every LoRA sweep point trains (the sweep comes on
    top), the sampler proposes nothing, and the search says so; a resume has nothing left to train."""
    exp = experiment(
        tmp_path,
        trials=1,
        budget="20%",
        final=FinalEval(seeds=0, baselines=True),
        fidelity=Fidelity(length_buckets=0, k=64, epochs=1, batch_size=16, max_length=16, search_dev=32),
    )
    lines = []
    run_search(exp, printer=lines.append)
    study = load(exp)
    sweep = [t for t in study.trials if t.user_attrs.get("baseline")]
    assert len(sweep) >= 2 and all(t.state == TrialState.COMPLETE for t in sweep)
    assert sum(bool(t.user_attrs.get("preset")) for t in study.trials) == 3
    assert not [t for t in study.trials if t.state == TrialState.WAITING]
    assert all(t.user_attrs.get("preset") or t.user_attrs.get("baseline") for t in trained(study))
    assert (
        "trials: 1, no more than the 3 presets and warm starts queued: the sampler proposes nothing (raise "
        "trials to search)"
    ) in lines
    equal = []
    run_search(experiment(tmp_path, name="eq", trials=3, budget="20%"), printer=equal.append)
    assert any(line.startswith("trials: 3, no more than the 3 presets") for line in equal)
    again = []
    run_search(exp, printer=again.append)
    assert len(load(exp).trials) == len(study.trials) and any("; 0 to train;" in line for line in again)


def test_a_search_whose_every_trial_failed_exits_non_zero(tmp_path, monkeypatch, capsys):
    import json

    from petl_nas.app.cli import main
    from petl_nas.search import executors

    def broken(spec, **kw):
        raise RuntimeError("a worker that cannot train")

    monkeypatch.setattr(executors, "run_trial", broken)
    (tmp_path / "e.yaml").write_text(
        json.dumps(
            {
                "name": "t",
                "backbone": TINY_BACKBONE,
                "task": "demo_keyword",
                "budget": "5%",
                "space": "small",
                "trials": 2,
                "presets": ["pfeiffer"],
                "executor": "local",
                "storage": f"sqlite:///{tmp_path}/s.db",
                "fidelity": {"k": 64, "epochs": 1, "search_dev": 32},
                "final": {"seeds": 0, "baselines": False},
            }
        )
    )
    assert main(["search", "--experiment", "e.yaml"]) == 1
    err = capsys.readouterr().err
    assert "petl-nas: error: every trial of the study failed (2); their reasons are above and in " in err


def test_progress_of_workers_sharing_a_study_counts_the_study_trials():
    """Two workers on one study of 4 trials each say how far the study is, [2/4] after the second
    trial whoever trained it, and end at [4/4], not each at [2/4]; a trial finished before a worker
    started, and trials over the budget (never trained), are not counted."""
    from types import SimpleNamespace

    from petl_nas import PetlConfig
    from petl_nas.search.driver import Progress

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.tell(study.ask(), [0.5, 10])  # from an earlier run
    lines = {"a": [], "b": []}
    workers = {w: Progress(study, 4, lines[w].append) for w in lines}
    for i, w in enumerate("abab"):
        over = study.ask()  # over the budget: never trained, no line, not counted
        over.set_user_attr("rejected", True)
        study.tell(over, state=optuna.trial.TrialState.PRUNED)
        trial = study.ask()
        study.tell(trial, [0.5, 10])
        workers[w](
            SimpleNamespace(
                number=trial.number,
                preset=None,
                deployable=10,
                config=PetlConfig(),
                trial=SimpleNamespace(user_attrs={}),
            ),
            "complete",
            {"score": 0.5},
        )
    assert [line.split()[0] for line in lines["a"]] == ["[1/4]", "[3/4]"]
    assert [line.split()[0] for line in lines["b"]] == ["[2/4]", "[4/4]"]


def test_progress_never_counts_past_its_total_nor_below_zero_minutes():
    """A lost trial trained again on resume comes on top of the announced count: [3/3], not [3/2]."""
    from types import SimpleNamespace

    from petl_nas import PetlConfig
    from petl_nas.search.driver import Progress

    lines = []
    progress = Progress(optuna.create_study(directions=["maximize", "minimize"]), 2, lines.append)
    trial = SimpleNamespace(
        number=0, preset=None, deployable=10, config=PetlConfig(), trial=SimpleNamespace(user_attrs={})
    )
    for _ in range(3):
        progress(trial, "complete", {"score": 0.5})
    assert [line.split()[0] for line in lines] == ["[1/2]", "[2/2]", "[3/3]"]
    assert all("ETA -" not in line for line in lines)


def test_a_trial_line_names_its_configuration_and_its_eta_is_time_per_trial_trained():
    """A fake clock: trials of 2 min each; a calibration run reused (no time) is not counted as one
    trained, so the ETA stays 2 min a trial left, and each line names its configuration."""
    from types import SimpleNamespace

    from petl_nas import ModuleSpec, PetlConfig
    from petl_nas.search.driver import Progress

    now, lines = [0.0], []
    progress = Progress(optuna.create_study(directions=["maximize", "minimize"]), 4, lines.append, clock=lambda: now[0])
    lora = PetlConfig(modules=(ModuleSpec(form="lora", size=2, layers=(3, 4, 5)),), prompt_length=4)
    trial = SimpleNamespace(number=5, preset=None, deployable=1234, config=lora, trial=SimpleNamespace(user_attrs={}))
    progress(trial, "complete", {"score": 0.5, "reused": "calibration"})  # at once: read, not trained
    for _ in range(2):
        now[0] += 120.0
        progress(trial, "complete", {"score": 0.5, "score_se": 0.01})
    assert lines[0].startswith("[1/4] trial 5 LoRA r=2 q,v L3-5 + prompt 4  0.5000 (reused: calibration)  1,234 params")
    assert lines[1].startswith("[2/4] trial 5 LoRA r=2 q,v L3-5 + prompt 4  0.5000 ± 0.0100  1,234 params | done ")
    assert [line.rsplit("ETA ", 1)[1] for line in lines[1:]] == ["4.0 min", "2.0 min"]


def test_a_dropped_stop_is_raised_again_once():
    """`raise_if_stopped`: a stop whose KeyboardInterrupt was swallowed (in a finaliser) is raised
    at the next call, and only at that one."""
    import signal

    from petl_nas.search.interrupts import raise_if_stopped, stops_on_signals

    with stops_on_signals():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # dropped, as a weakref callback drops it
        with pytest.raises(KeyboardInterrupt):
            raise_if_stopped()
        try:
            raise_if_stopped()  # said once: nothing left to raise
        except KeyboardInterrupt:
            pytest.fail("the same stop was raised a second time")


def test_an_invalid_configuration_never_counts_toward_the_trials():
    """An invalid draw (recorded by `fail_kind`, or by its reason in a study from before it) takes no
    trial's place: the study goes on drawing until it holds the trials asked for."""
    from optuna.trial import create_trial

    from petl_nas.search.study import INVALID, claimed, is_trained

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.add_trial(
        create_trial(
            state=TrialState.FAIL, user_attrs={"fail_kind": INVALID, "fail_reason": "invalid configuration: x"}
        )
    )
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "invalid configuration: x"}))
    study.add_trial(create_trial(values=[0.8, 100.0]))
    assert [is_trained(t) for t in study.trials] == [False, False, True] and claimed(study) == 1


def test_a_resume_with_another_value_of_any_scoring_fidelity_setting_is_refused():
    """Every fidelity field changes what a trained trial's score means, except those that only
    change how trials execute; a resume with another value of one of them is refused."""
    from petl_nas.search.study import changed_settings

    execution_only = {"evals_per_epoch", "frozen_cache_mb", "compile", "cuda_graphs"}
    for f in dataclasses.fields(Fidelity):
        if f.name not in execution_only:
            assert changed_settings({"fidelity": {f.name: 1}}, {"fidelity": {f.name: 2}}) == [
                f"fidelity.{f.name} 1 (now 2)"
            ], f.name
