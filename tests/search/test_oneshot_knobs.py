"""The supernet's knobs searched across a handful of runs (`petl_nas.search.oneshot.knobs`): a proposal
scored with the supernet's own weights has exactly its components open; the gates' temperature
and the penalty's step do what they say; the search runs ``oneshot.runs`` supernets from the fixed
knobs, proposes from the best by inherited hypervolume, records every run, survives a diverging
run and a kill, and resumes without training a supernet again."""

import copy
import dataclasses
import importlib.util
import re

import pytest
import torch
from conftest import batch, tiny_model
from test_oneshot import HEAD, _exp, _perturb, _supernet

from petl_nas import ConfigError
from petl_nas.search.oneshot import HardConcrete, ladder
from petl_nas.search.oneshot.derive import configuration, select
from petl_nas.search.oneshot.gates import CLOSED
from petl_nas.search.oneshot.inherit import only

KNOBS_FAST = dict(rungs=3, lr=3e-3, gate_lr=0.05, epochs=3)


def test_a_selection_scored_with_the_supernets_weights_has_exactly_its_units_open():
    net, _ = _supernet(budget=20_000)
    _perturb(net)
    g = torch.Generator().manual_seed(0)
    for u in net.units:
        u.gate.set_log_alpha(torch.randn(u.gate.log_alpha.shape, generator=g) * 3)
    before = [u.gate.raw.detach().clone() for u in net.units]
    x = batch()
    net.model.eval()
    for budget in ladder(500, 20_000, 4):
        sel = select(net, budget)
        _, n = configuration(net, net.model.config, sel, HEAD)
        assert n == sel.total <= budget
        with only(net, sel), torch.no_grad():
            net.model(**x)  # the forward draws the (eval) gates
            for i, u in enumerate(net.units):
                want = torch.zeros_like(u.gate.z())
                if u.gate_of is None:
                    want[sel.kept.get(i, [])] = 1
                elif u.gate_of in sel.gated:
                    want[:] = 1
                assert torch.equal(u.gate.z(), want)
            # the expected count of exactly these open units is the selection's exact count, but
            # for Compacter's rule, which the expectation counts once per candidate and a derived
            # configuration once per distinct kept size
            sizes = {}
            for i, js in sel.kept.items():
                if net.units[i].group_cost and js:
                    sizes.setdefault(net.units[i].candidate, (net.units[i].group_cost, set()))[1].add(len(js))
            rules = sum(cost * (len(s) - 1) for cost, s in sizes.values())
            assert float(net.expected_count()) == pytest.approx(sel.total - rules, rel=1e-4, abs=0.5)
        for u, raw in zip(net.units, before):
            assert torch.equal(u.gate.raw, raw)  # every gate back bit for bit
    empty = dataclasses.replace(select(net, 0), kept={}, gated=set(), total=0)
    base = tiny_model()
    from petl_nas import apply_petl

    ref = apply_petl(copy.deepcopy(base), HEAD).eval()
    with only(net, empty), torch.no_grad():
        assert torch.equal(net.model(**x).logits, ref(**x).logits)  # nothing open: the backbone


def test_temperature_sharpens_the_draws_and_keeps_each_gates_chance_of_opening():
    gate = HardConcrete(4000, init_open=0.6)
    gate.train()
    p = gate.p_open().detach().clone()
    exact = {}
    for t in (1.0, 0.2):
        gate.retune(temperature=t)
        assert torch.allclose(gate.p_open(), p, atol=1e-6)
        gate.sample()
        z = gate.z()
        exact[t] = float(((z == 0) | (z == 1)).float().mean())
        assert float((z > 0).float().mean()) == pytest.approx(float(p[0]), abs=0.03)  # P(z > 0) as computed
    assert exact[0.2] > exact[1.0] + 0.2  # colder: nearer a coin flip of 0 and 1
    gate.retune(speed=10.0)
    assert torch.allclose(gate.p_open(), p, atol=1e-6) and gate.speed == 10.0
    gate.close()
    assert float(gate.log_alpha.detach().max()) == CLOSED


def test_the_penalty_step_sets_how_fast_the_multiplier_rises():
    net, _ = _supernet()
    target = float(net.expected_count().detach()) / 10
    net.penalty(target, step_size=0.01)
    slow = net.multiplier
    net.multiplier = 0.0
    net.penalty(target, step_size=0.04)
    assert slow > 0 and net.multiplier == pytest.approx(4 * slow)


def _knob_exp(tmp_path, **oneshot):
    from petl_nas.study.experiment import Fidelity, OneShot

    return _exp(
        tmp_path,
        strategy="oneshot",
        trials=3,
        oneshot=OneShot(**{**KNOBS_FAST, **oneshot}),
        fidelity=Fidelity(length_buckets=0, k=320, epochs=1, batch_size=16, max_length=24, search_dev=64),
    )


@pytest.mark.slow
def test_the_knob_search_proposes_from_its_best_run_and_records_every_run(tmp_path, monkeypatch):
    import optuna

    from petl_nas.search.driver import run_search
    from petl_nas.study.fronts import hypervolume

    monkeypatch.chdir(tmp_path)
    exp = _knob_exp(tmp_path, runs=3, search={"lr": [3e-3, 3e-2], "temperature": [0.3, 1.0]})
    lines = []
    run_search(exp, printer=lines.append)
    study = optuna.load_study(study_name="o", storage=exp.storage_url)
    record = study.user_attrs["oneshot"]
    search = record["knob_search"]
    knob_study = optuna.load_study(study_name="o:oneshot-knobs", storage=exp.storage_url)
    trials = knob_study.trials
    assert search["study"] == "o:oneshot-knobs" and len(trials) == len(search["runs"]) == 3
    assert trials[0].params == {"lr": 3e-3, "temperature": 2 / 3}  # the first run: the fixed knobs
    assert all(3e-3 <= t.params["lr"] <= 3e-2 and 0.3 <= t.params["temperature"] <= 1.0 for t in trials)
    assert len({t.params["lr"] for t in trials}) == 3
    baseline = study.user_attrs["baseline"]["score"]
    for t, run in zip(trials, search["runs"]):
        assert run["knobs"]["gate_lr"] == 0.05 and run["knobs"]["lr"] == t.params["lr"]  # the rest fixed
        hv = hypervolume([(s, d) for d, s in run["proposals"]], (baseline, study.user_attrs["budget"]))
        assert t.value == pytest.approx(hv, abs=1e-9) and run["hypervolume"] == pytest.approx(hv, abs=1e-6)
    best = max(search["runs"], key=lambda r: (r["hypervolume"], -r["number"]))
    assert search["chosen"] == best["number"] and best["hypervolume"] > 0  # this tiny task learns at some lr
    assert record["run"] == f"oneshot-0-knobs-{best['number']}" and record["lr"] == best["knobs"]["lr"]
    proposals = sorted(
        (t for t in study.trials if t.user_attrs.get("oneshot") == record["run"]), key=lambda t: t.number
    )
    ladder = [t for t in proposals if not t.user_attrs.get("oneshot_anchor")]  # the anchored ones: not scored so
    assert [t.user_attrs["deployable"] for t in ladder] == [d for d, _ in best["proposals"]]
    assert all(t.user_attrs["recipe"]["lr"] == best["knobs"]["lr"] for t in proposals)
    assert record["cost_s"] >= sum(r["cost_s"] for r in search["runs"])
    assert sum(line.startswith("one-shot knobs: run") for line in lines) == 3
    assert any("the best of 3 runs" in line for line in lines)
    from petl_nas.study.records import load_study  # export's and report's way in: named, not a crash

    with pytest.raises(
        ConfigError,
        match=r"study 'o:oneshot-knobs' holds the supernet runs of 'o''s knob search, "
        r"not its trials; use --study o",
    ):
        load_study(exp.storage_url, "o:oneshot-knobs")
    if importlib.util.find_spec("matplotlib") is not None:  # the report names every run and the chosen one
        from petl_nas.dashboards.report import write_report

        # the study of supernet runs beside it does not make the study's name necessary
        page = write_report(exp.storage_url, None, tmp_path / "report")[-1].read_text()
        row = re.search(r"<th>one-shot supernet</th><td>(.*?)</td>", page).group(1)
        assert f"run {best['number']} (chosen)" in row and row.count("inherited hypervolume") == 3
    from petl_nas.study.records import load_study

    assert load_study(exp.storage_url).study_name == "o"
    n, k = len(study.trials), len(trials)
    run_search(exp, printer=lambda *a: None)  # resumed: no supernet trained again
    assert len(optuna.load_study(study_name="o", storage=exp.storage_url).trials) == n
    assert len(optuna.load_study(study_name="o:oneshot-knobs", storage=exp.storage_url).trials) == k


@pytest.mark.slow
def test_the_worker_that_starts_a_study_keeps_the_runs_another_worker_claimed(tmp_path, monkeypatch):
    """Two workers start one knob search at once. The one that records the study's first start may
    reach the knob study after the other has created it and claimed its first run. That run stays
    (the other worker trains it; were it gone, both would train that run and one would crash when it
    reports). Only a study of the same name deleted or replaced before loses its runs (the
    ``--force-new-study`` case in `test_oneshot_runs_on_the_command_line`)."""
    import optuna
    from optuna.trial import TrialState

    from petl_nas.search.driver import run_search
    from petl_nas.search.oneshot import knobs
    from petl_nas.study.experiment import OneShot

    monkeypatch.chdir(tmp_path)
    exp = dataclasses.replace(
        _knob_exp(tmp_path, runs=2, search={"lr": [3e-3, 3e-2]}), heartbeat_interval=1, grace_period=2
    )  # the other worker's silent run: lost after 2 s
    real = knobs.search

    def another_worker_claims_the_first_run(*args, **kwargs):
        ks = knobs.knob_study(exp.storage_url, "o", exp.seed)
        ks.enqueue_trial({k: v for k, v in exp.oneshot.knobs().items() if k in exp.oneshot.knob_ranges()})
        ks.ask(knobs.distributions(exp.oneshot.knob_ranges(), OneShot.KNOBS)).set_user_attr("by", "another worker")
        return real(*args, **kwargs)

    monkeypatch.setattr(knobs, "search", another_worker_claims_the_first_run)
    run_search(exp, printer=lambda *a: None)
    trials = optuna.load_study(study_name="o:oneshot-knobs", storage=exp.storage_url).trials
    assert trials[0].user_attrs.get("by") == "another worker"
    # that worker never reported: its run was taken as lost and trained here, after this worker's own
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]


@pytest.mark.slow
def test_a_diverging_run_is_recorded_as_failed_and_the_search_goes_on(tmp_path, monkeypatch):
    import optuna
    from conftest import TINY_BACKBONE as TINY
    from optuna.trial import TrialState

    from petl_nas import ConfigError
    from petl_nas.search.driver import run_search
    from petl_nas.search.oneshot import knobs
    from petl_nas.search.oneshot.run import SupernetSpec, run_supernet
    from petl_nas.study.experiment import OneShot

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path}/k.db"
    ks = knobs.knob_study(url, "o", 0)
    ks.enqueue_trial({"lr": 1e7})  # diverges at its first step
    ks.enqueue_trial({"lr": 3e-3})
    spec = SupernetSpec(
        backbone=TINY,
        task="demo_keyword",
        data_dir=None,
        k=320,
        data_seed=111,
        search_dev=64,
        space="small",
        budget=1862,
        rungs=3,
        lr=3e-3,
        gate_lr=0.05,
        epochs=1,
        init_open=0.9,
        batch_size=16,
        max_length=24,
        length_buckets=4,
        seed=0,
    )
    lines = []
    number, result, runs = knobs.search(
        url,
        "o",
        OneShot(**KNOBS_FAST, runs=2, search={"lr": [1e-3, 1e8]}),
        spec,
        lambda s: run_supernet(s, device="cpu"),
        str(tmp_path),
        (0.5, 1862.0),
        0,
        lines.append,
    )
    trials = optuna.load_study(study_name="o:oneshot-knobs", storage=url).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert "nan" in trials[0].user_attrs["error"] and any("run 0 failed" in line for line in lines)
    assert number == 1 and [r["number"] for r in runs] == [1] and result["proposed"]
    bad = _knob_exp(tmp_path, runs=2, lr=1e7, search={"lr": [1e6, 1e8]})
    with pytest.raises(ConfigError, match="every supernet run of the knob search diverged"):
        run_search(bad, printer=lambda *a: None)


@pytest.mark.slow
def test_a_run_failed_as_lost_while_it_trained_is_dropped_and_trained_again(tmp_path):
    """A run whose heartbeat lapsed (a database out of reach, a starved machine) is failed by another
    worker and queued again. When the run then ends here, its result is dropped with a line, not a
    crash, and the queued copy trains from the state the run saved."""
    import optuna
    from conftest import TINY_BACKBONE as TINY
    from optuna.trial import TrialState

    from petl_nas.search.oneshot import knobs
    from petl_nas.search.oneshot.run import SupernetSpec, run_supernet
    from petl_nas.study.experiment import OneShot
    from petl_nas.study.storage import close_storage, fail_now, open_storage

    url = f"sqlite:///{tmp_path}/k.db"
    spec = SupernetSpec(
        backbone=TINY,
        task="demo_keyword",
        data_dir=None,
        k=320,
        data_seed=111,
        search_dev=64,
        space="small",
        budget=1862,
        rungs=3,
        lr=3e-3,
        gate_lr=0.05,
        epochs=1,
        init_open=0.9,
        batch_size=16,
        max_length=24,
        length_buckets=4,
        seed=0,
    )

    def lost_the_first_time(s):
        result = run_supernet(s, device="cpu")
        if not lines:  # as another worker's `fail_stale` would
            storage = open_storage(url, 1, 2, retries=2)
            ks = optuna.load_study(study_name="o:oneshot-knobs", storage=storage)
            fail_now(ks, [t._trial_id for t in ks.trials if t.state == TrialState.RUNNING], {"fail_kind": "lost"})
            close_storage(storage)
        return result

    lines = []
    number, result, runs = knobs.search(
        url,
        "o",
        OneShot(**KNOBS_FAST, runs=2, search={"lr": [1e-3, 1e-2]}),
        spec,
        lost_the_first_time,
        str(tmp_path),
        (0.5, 1862.0),
        0,
        lines.append,
        heartbeat_interval=1,
        grace_period=2,
    )
    trials = optuna.load_study(study_name="o:oneshot-knobs", storage=url).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert "run 0 was failed as lost while it trained" in lines[0] and "run 0 left no result" in lines[1]
    assert trials[1].params == trials[0].params and runs[0]["number"] == 1 and runs[0]["resumed_from"]


@pytest.mark.slow
def test_a_knob_search_killed_in_a_run_resumes_that_run_from_its_last_epoch(tmp_path, monkeypatch):
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    from petl_nas.search.driver import run_search
    from petl_nas.training import checkpoint

    monkeypatch.chdir(tmp_path)
    exp = dataclasses.replace(
        _knob_exp(tmp_path, runs=2, search={"lr": [3e-3, 3e-2]}), heartbeat_interval=1, grace_period=2
    )  # a dead run is seen after 2 s
    real = checkpoint.save
    saves = []

    def die_in_the_second_run(state, where):
        real(state, where)
        saves.append(where)
        if len(set(saves)) == 2:  # the second run's first epoch is saved
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save", die_in_the_second_run)
    with pytest.raises(KeyboardInterrupt):
        run_search(exp, printer=lambda *a: None)
    ks = optuna.load_study(study_name="o:oneshot-knobs", storage=exp.storage_url)
    # Ctrl-C: the run is failed as interrupted and queued again at once (not left running until its
    # heartbeat lapses, while the resumed search would train another run first)
    assert [t.state for t in ks.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert ks.trials[1].user_attrs["fail_kind"].startswith("interrupted")
    killed = ks.trials[1].params
    monkeypatch.setattr(checkpoint, "save", real)
    lines = []
    run_search(exp, printer=lines.append)
    trials = optuna.load_study(study_name="o:oneshot-knobs", storage=exp.storage_url).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert trials[2].params == killed and RetryHeartbeatStaleTrialCallback.retried_trial_number(trials[2]) == 1
    assert any("run 1 left no result" in line for line in lines)
    record = optuna.load_study(study_name="o", storage=exp.storage_url).user_attrs["oneshot"]
    runs = record["knob_search"]["runs"]
    assert [r["number"] for r in runs] == [0, 2] and runs[1]["resumed_from"]["epoch"] == 1
    assert not list((tmp_path / "runs" / "o" / "oneshot").glob("*.pt"))  # state files removed once recorded


def test_knob_search_settings_are_checked_in_one_line():
    from petl_nas import ConfigError
    from petl_nas.study.experiment import Experiment

    for oneshot, message in [
        ({"search": {"lr": [1e-4, 1e-3]}}, "knob ranges need runs >= 2"),
        ({"runs": 3, "search": {"lrr": [1, 2]}}, "unknown knob 'lrr'"),
        ({"runs": 3, "search": {"lr": ["3e-4", 1]}}, "lr: expected \\[low, high\\]"),
        ({"runs": 3, "search": {"init_open": [0.5, 1.5]}}, "init_open: expected"),
        ({"runs": 0}, "runs: expected a whole number"),
        ({"temperature": 0}, "temperature: expected a number > 0"),
    ]:
        with pytest.raises(ConfigError, match=message):
            Experiment.from_dict({"oneshot": oneshot})
    ranges = Experiment.from_dict({"oneshot": {"runs": 4}}).oneshot.knob_ranges()
    assert set(ranges) == {"lr", "gate_lr", "penalty_step", "temperature"}  # the default search
    assert Experiment.from_dict({"oneshot": {"runs": 1}}).oneshot.knob_ranges() == {}


@pytest.mark.slow
def test_oneshot_runs_on_the_command_line(tmp_path, monkeypatch, capsys):
    """--oneshot-runs reaches the search (the file's other oneshot settings kept); a bad value is
    one line naming the flag."""
    import optuna
    import yaml
    from conftest import TINY_BACKBONE as TINY

    from petl_nas import ConfigError
    from petl_nas.app import cli
    from petl_nas.study.experiment import Experiment

    monkeypatch.chdir(tmp_path)
    (tmp_path / "e.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "o",
                "backbone": TINY,
                "task": "demo_keyword",
                "budget": "5%",
                "space": "small",
                "trials": 1,
                "presets": ["lora"],
                "executor": "local",
                "strategy": "oneshot",
                "storage": f"sqlite:///{tmp_path}/s.db",
                "oneshot": {**KNOBS_FAST, "epochs": 1, "search": None},
                "fidelity": {"k": 320, "epochs": 1, "batch_size": 16, "max_length": 24, "search_dev": 64},
                "final": {"seeds": 0, "baselines": False},
            }
        )
    )
    assert cli.main(["search", "--experiment", "e.yaml", "--oneshot-runs", "2"]) == 0
    record = optuna.load_study(study_name="o", storage=f"sqlite:///{tmp_path}/s.db").user_attrs["oneshot"]
    assert len(record["knob_search"]["runs"]) == 2 and record["epochs"] == 1
    assert capsys.readouterr().out.count("one-shot knobs: run") == 2
    # a study of the same name made anew does not take the old one's supernet runs as its own
    assert (
        cli.main(["search", "--experiment", "e.yaml", "--oneshot-runs", "2", "--space", "unified", "--force-new-study"])
        == 0
    )
    assert capsys.readouterr().out.count("one-shot knobs: run") == 2
    assert len(optuna.load_study(study_name="o:oneshot-knobs", storage=f"sqlite:///{tmp_path}/s.db").trials) == 2
    with pytest.raises(ConfigError, match="--oneshot-runs: oneshot: runs: expected a whole number"):
        Experiment().override(oneshot_runs=0)


def test_knob_settings_a_user_can_get_wrong_are_named():
    from petl_nas import ConfigError
    from petl_nas.study.experiment import OneShot

    for kw, words in [
        ({"lr": "1e-3"}, "oneshot: lr: expected a number > 0, got '1e-3' (YAML reads 1e-3 as text: write 1.0e-3)"),
        ({"lr": float("inf")}, "oneshot: lr: expected a number > 0, got inf"),
        (
            {"lr": 1.0e-2, "runs": 2},
            "oneshot: lr 0.01 is outside the knob search's range [0.0003, "
            "0.003] (its first run trains at the fixed knobs)",
        ),
        ({"runs": 2, "search": {"lr": ["1e-4", 1.0e-2]}}, "(YAML reads 1e-4 as text: write 1.0e-4)"),
    ]:
        with pytest.raises(ConfigError) as e:
            OneShot(**kw)
        assert words in str(e.value), str(e.value)
    OneShot(lr=1.0e-2, runs=2, search={"lr": [1.0e-3, 3.0e-2]})  # inside a range the user widened
