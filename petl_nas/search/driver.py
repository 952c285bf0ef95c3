"""A search from start to finish: validate everything, open the study, seed presets, run trials,
re-evaluate the Pareto front on the held-out test split, and print the front.

Everything that can be wrong with the input (backbone, data, space, budget, storage) is checked
before the study is touched. Running the same experiment again resumes its study: ``trials`` is the
number of trained trials the study should hold, so a second run trains only what is missing, and
several runs of it at once (processes or machines on one storage) fill the study together. A run
ends when the study is full and no other worker's trial is still running; a trial whose worker died
is failed once its heartbeat lapses and trained again (see storage.py and docs/cluster.md).

Example:
    >>> summary = run_search(Experiment.load("experiments/examples/smoke.yaml"))   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import errno
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from optuna.exceptions import StorageInternalError
from optuna.trial import TrialState

from .. import __version__
from ..console import SaidOnce, fit, one_line, say, table
from ..core.describe import short_name
from ..fileio import atomic_write
from ..study.experiment import Experiment, large_budget_warning
from ..study.fronts import source_of, sweep_line
from ..study.header import StudyHeader
from ..study.pick import confirmed_scores, verdict
from ..study.records import SEARCH_DEV_LABELS, StoredTrial, mark_finished, record_session, stored_trials
from ..study.storage import (
    ClaimLock,
    Heartbeat,
    close_storage,
    fail_interrupted,
    fail_stale,
    redact,
    running_without_heartbeat,
    sqlite_path,
)
from ..tasks import data_lines
from ..tasks.files import file_fingerprints
from ..tasks.metrics import LM_METRICS, TEXT_METRICS, points_per_unit
from ..tasks.shift import input_shift, shift_line
from ..tasks.significance import (
    clearly_better,
    encode_rows,
    has_error_bar,
    mean_std,
    paired_difference,
    trivial_baseline,
)
from ..training.costs import UNITS
from ..training.loop import n_evaluations
from . import calibrate, rates, study_note
from . import progress as progress_lines
from .baselines import seed_sweep, sweep_trials
from .executors import EXECUTORS, Recorder
from .finals import reevaluate_front
from .inputs import check_inputs
from .interrupts import before_writing, interruptible, raise_if_stopped
from .oneshot.propose import check_resumable, propose, read_proposals
from .packing import GpuPacking
from .specs import trial_recipe, trial_spec
from .study import (
    INTERRUPTED,
    TrialSource,
    claimed,
    failure_counts,
    front,
    is_trained,
    make_sampler,
    open_study,
    seed_presets,
    seeded_sampler,
    state_counts,
)
from .warm_start import seed_warm_start


@dataclass
class SearchSummary:
    study_name: str
    storage: str
    metric: str
    budget: int | None
    counts: dict
    front: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    presets: list[dict] = field(default_factory=list)
    failures: dict = field(default_factory=dict)  # failed (and NaN-pruned) trials by kind
    baseline: dict | None = None  # the trivial baseline on search-dev
    did_not_learn: int = 0  # complete trials within noise of it
    reference: str | None = None  # the preset the paired comparisons are against
    sweep: str | None = None  # the searched front against the LoRA rank sweep
    shift: dict | None = None  # search-dev's inputs against the test split's (shift.py)
    calibrated_epochs: float | None = None  # the trial length `fidelity: auto` chose, when it did
    confirmed: list[dict] = field(default_factory=list)  # trials final.confirm re-scored, off the front
    verdict: str | None = None  # what confirmation concluded against the best baseline
    said: set = field(default_factory=set, repr=False, compare=False)  # lines this run printed already

    def _row(self, r: dict) -> dict[str, str]:
        test = mean_std(r["test_mean"], r["test_std"], r.get("test_n")) if r.get("test_mean") is not None else "-"
        search = f"{r['score']:.4f}" + (f" ± {r['se']:.4f}" if r.get("se") is not None else "")
        paired, pts = r.get("paired"), points_per_unit(self.metric)
        vs = (
            (
                f"{pts * paired['mean']:+.2f}"
                + (f" ± {pts * paired['std']:.2f}" if paired["std"] is not None else " (1 seed)")
            )
            if paired
            else "-"
        )
        relation = ", ".join(r["dominates"] + [f"~{n}" for n in r.get("matches", [])]) or "-"
        notes = []
        if r.get("confirmed"):
            notes.append(
                f"confirmed {statistics.fmean(r['confirmed']):.4f} ({len(r['confirmed'])} seeds)"
                + ("" if r.get("on_front", True) else ", off the front")
            )
        notes += ["did not learn"] * bool(r.get("did_not_learn"))
        notes += ["head only (no PETL module)"] * (r["deployable"] == 0)
        notes += [
            f"{name} {value:.1f} {UNITS[name]}" for name, value in (r.get("costs") or {}).items() if value is not None
        ]
        return {
            "trial": str(r["number"]),
            "source": r["preset"],
            "search (±se)": search,
            "test (±std)": test,
            "paired Δ pts": vs,
            "deployable": f"{r['deployable']:,}",
            "%": f"{r['pct']:.3f}",
            "dominates": relation,
            "notes": ", ".join(notes),
        }

    def _rows(self, rows: list[dict]) -> list[str]:
        """The rows as a table; the test and paired columns only where a row has one."""
        cells = [self._row(r) for r in rows]
        heads = (
            [
                h
                for h in cells[0]
                if h not in ("test (±std)", "paired Δ pts", "notes") or any(c[h] not in ("-", "") for c in cells)
            ]
            if cells
            else []
        )
        return table(
            heads,
            [[c[h] for h in heads] for c in cells],
            indent="",
            right=[i for i, h in enumerate(heads) if h not in ("source", "dominates", "notes")],
        )

    def table(self) -> str:
        """The front, the presets off it and the confirmed trials off it as one table, then what
        the search concluded; a line this run already printed (``said``) is not said again."""
        against = ["deployable parameters", *dict.fromkeys(c for r in self.front for c in (r.get("costs") or {}))]
        against = " and ".join([", ".join(against[:-1]), against[-1]] if len(against) > 1 else against)
        lines = [
            f"Pareto front of study {self.study_name!r} ({self.metric} vs {against}"
            + (f", budget {self.budget:,}" if self.budget is not None else "")
            + ")"
        ]
        on_front = {r["number"] for r in self.front}
        off = [r for r in self.presets if r["number"] not in on_front]
        rows = self._rows(self.front + off + self.confirmed)
        lines += rows[: 1 + len(self.front)]
        if off:
            lines.append("presets measured in this study, off the front:")
            lines += rows[1 + len(self.front) : 1 + len(self.front) + len(off)]
        if self.confirmed:
            lines.append("confirmed by final.confirm, off the front (export's candidates too, by their mean):")
            lines += rows[1 + len(self.front) + len(off) :]
        if self.verdict:
            lines.append(self.verdict)
        shown = self.front + self.presets + self.confirmed
        measured = any(r.get("se") is not None for r in shown)
        lines.append(
            (
                "dominates: fewer or equal parameters and a search score higher by more than two standard "
                "errors; ~name: within noise of it with fewer parameters"
                if measured
                else "dominates: fewer or equal parameters and a higher search score (this metric has no standard "
                "error here: differences are not tested against noise); ~name: the same score with fewer "
                "parameters"
            )
            + (
                f"; paired Δ: per-seed test difference to {self.reference} (same seeds)"
                if self.reference and any(r.get("paired") for r in shown)
                else ""
            )
        )
        if self.baseline is not None:
            on_test = self.baseline.get("test_score")
            lines.append(
                f"trivial baseline: {self.baseline['what']} scores {self.baseline['score']:.4f} on search-dev"
                + (f" and {on_test:.4f} on the test split (beside the test column)" if on_test is not None else "")
            )
        if self.sweep:
            lines.append(self.sweep)
        if self.shift and self.shift["shifted"]:
            lines.append(shift_line(self.shift))
        c = self.counts
        stopped = f", {c['interrupted']} interrupted" if c.get("interrupted") else ""  # Ctrl-C: not failures
        lines.append(
            f"trials: {c['complete']} complete, {c['pruned']} pruned, {c['failed']} failed{stopped}, "
            f"{c['rejected']} over budget (never trained); this run took {self.wall_s:.0f}s"
        )
        if self.failures:
            lines.append("failures by kind: " + ", ".join(f"{k} {n}" for k, n in self.failures.items()))
        if self.did_not_learn and self.did_not_learn * 2 >= max(1, c["complete"]):
            longer = (
                "fidelity epochs, or fidelity: auto"
                if self.calibrated_epochs is None
                else f"fidelity: auto chose {self.calibrated_epochs:g} epochs; give fidelity epochs above that"
            )
            head = (
                ""
                if self.metric in TEXT_METRICS + LM_METRICS
                # a generation task reads no pooled head
                else ", or check the head (pooling: mean for sentence-transformers checkpoints)"
            )
            near = "within noise of" if measured else "no better than"  # a metric without an error bar
            lines.append(
                f"{self.did_not_learn} of {c['complete']} complete trials did not learn ({near} "
                f"the baseline): train longer ({longer}), raise the learning rate range{head}"
            )
        return "\n".join(fit(line) for line in lines if line.strip() not in self.said)


class Progress:
    """A line per trial this worker finishes: its configuration in a few words (`short_name`), its
    score and size, states so far, the front's size and an ETA from the time per trial trained.

    ``[i/N]`` counts the study's trials trained since this worker started, by every worker (N: what
    was left to train then), so workers sharing a study count to the same end, and the ETA is the
    study's."""

    def __init__(self, study, total: int, printer, clock=time.time):
        self.study, self.total, self.print, self.clock = study, total, printer, clock
        self.start, self.done, self.reused = clock(), 0, 0
        self.before = {t.number for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING}

    def __call__(self, p, state: str, info: dict) -> None:
        finished = sum(
            1
            for t in self.study.get_trials(deepcopy=False)  # over budget or invalid: no line
            if is_trained(t) and t.number not in self.before
        )
        self.done = max(self.done + 1, finished)
        self.total = max(self.total, self.done)  # a lost trial trained again comes on top of the count
        self.reused += bool(info.get("reused"))
        elapsed = self.clock() - self.start  # per trial trained: a reused run took no time
        eta = elapsed / max(1, self.done - self.reused) * (self.total - self.done)
        c = state_counts(self.study)
        what = f"{info['score']:.4f}" if state == "complete" else f"{state}: {info.get('reason', '')}"
        if state == "complete" and info.get("score_se") is not None:
            what += f" ± {info['score_se']:.4f}"
        if info.get("did_not_learn"):
            what += (
                " did not learn (within noise of the baseline)"
                if info.get("score_se") is not None
                else " did not learn (no better than the baseline)"
            )  # a metric without an error bar
        if info.get("reused"):
            what += f" (reused: {info['reused']})"
        tag = f"{p.preset}: " if p.preset else "one-shot: " if StoredTrial.of(p.trial).oneshot else ""
        states = f" | done {c['complete']}" + "".join(
            f" {k} {c[k]}" for k in ("running", "pruned", "failed", "rejected") if c[k]
        )
        tail = f"  {what}  {p.deployable:,} params{states} | front {len(front(self.study))} | ETA {_minutes(eta)}"
        self.print(one_line(f"[{self.done}/{self.total}] trial {p.number} {tag}", short_name(p.config), tail))


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def _absolute_paths(exp: Experiment) -> Experiment:
    """Local paths made absolute: Ray runs each trial in its own working directory."""

    def fix(p):
        return str(Path(p).resolve()) if isinstance(p, str) and Path(p).exists() else p

    task = exp.task
    if isinstance(task, dict):
        task = {k: fix(v) if k in ("train", "dev", "test") else v for k, v in task.items()}
    data_dir = str(Path(exp.data_dir).resolve()) if exp.data_dir else None
    return dataclasses.replace(exp, task=task, data_dir=data_dir, backbone=fix(exp.backbone))


def run_search(exp: Experiment, force_new_study: bool = False, printer=None) -> SearchSummary:
    start = time.time()
    printer = SaidOnce(printer or say)  # each line once; on the console, live and within the width
    exp = _absolute_paths(exp)
    # ---- validate the inputs before touching the study --------------------------------------
    with before_writing():  # a stop here has written nothing: the CLI says so
        checked = check_inputs(exp)
    task, splits, model_config, space = checked.task, checked.splits, checked.model_config, checked.space
    budget, backbone_params = checked.budget, checked.backbone_params

    # ---- the study ------------------------------------------------------------------------------
    baseline = trivial_baseline(task, splits)
    attrs = {
        "space": space.source,
        "space_name": space.name,
        "space_hash": space.hash,
        "baseline": baseline,
        "input_shift": input_shift(splits.search_dev, splits.test),
        "space_version": space.version,
        "backbone": json.dumps(exp.backbone),
        "task": task.name,
        "task_spec": exp.task,
        "task_files": file_fingerprints(exp.task),
        "metric": task.main_metric,
        "budget": budget,
        "backbone_params": backbone_params,
        "fidelity": exp.fidelity.__dict__,
        "final": exp.final.__dict__,
        "data_dir": exp.data_dir,
        "data_seed": exp.data_seed,
        "petl_nas_version": __version__,
        "sampler": exp.sampler,
    }
    if task.kind in ("classification", "regression"):  # for confirmation's bootstrap over rows
        attrs[SEARCH_DEV_LABELS] = encode_rows(np.asarray(splits.search_dev.labels, dtype=np.float64))
    if exp.strategy != "sampler" and exp.oneshot.file:
        read_proposals(
            exp.oneshot.file, StudyHeader.from_attrs(attrs), budget
        )  # a file that cannot serve: said before a study exists
    study = open_study(
        exp.storage_url,
        exp.study_name,
        make_sampler(exp.sampler, exp.seed, exp.startup_trials),
        task.main_metric,
        attrs,
        force_new=force_new_study,
        heartbeat_interval=exp.heartbeat_interval,
        grace_period=exp.grace_period,
        retries=exp.stale_retries,
        objectives=exp.objectives,
    )
    recorded = StudyHeader.of(study).fidelity  # auto: as the study records it
    exp = dataclasses.replace(
        exp,
        fidelity=dataclasses.replace(
            exp.fidelity, length_buckets=recorded["length_buckets"], precision=recorded.get("precision", "auto")
        ),
    )
    try:
        mark_finished(study, False)
        summary = _search(SearchRun(study, exp, task, splits, space, model_config, budget, backbone_params, printer))
        mark_finished(study, True)
    finally:
        try:
            _record_run(study, start, printer)  # stopped or not: the study's wall time adds up over resumes
        finally:
            close_storage(study)
    summary.wall_s, summary.said = time.time() - start, printer.said
    return summary


def _record_run(study, start: float, printer) -> None:
    """Record this run's seconds on the study, never in place of its outcome: where the storage
    cannot take them (a full disk, a lost database), a warning line says so and the search's own
    result or error stands."""
    try:
        record_session(study, start)
    except Exception as e:  # noqa: BLE001 - any storage error
        printer(f"warning: this run's wall time was not recorded on the study ({str(e).splitlines()[0]})")


def _proposals(study) -> int:
    """The supernet's proposals the study holds (trained or waiting)."""
    return sum(1 for t in stored_trials(study) if t.oneshot)


def _supernet_line(exp: Experiment, budget: int) -> str:
    """What the search does next, said before the minutes it takes."""
    o = exp.oneshot
    if o.file:
        return (
            f"one-shot: reading the proposals for {budget:,} deployable parameters from {o.file} "
            "(no supernet trained here)"
        )
    epochs = o.epochs if o.epochs is not None else exp.fidelity.epochs
    runs = f"{o.runs} supernet runs (a search over their knobs)" if o.runs > 1 else "a supernet"
    epochs = epochs if isinstance(epochs, str) else f"{epochs:g}"
    also = f" (and proposing for {', '.join(map(str, o.budgets))} too)" if o.budgets else ""
    return (
        f"one-shot: training {runs} over space {exp.space!r} toward {budget:,} deployable parameters{also}, "
        f"{epochs} epochs each on the trials' data (a line every {progress_lines.EVERY_S:.0f} s with the epochs "
        f"done and the time left; each epoch is saved, so a stopped run goes on from there)"
    )


FEW_SEARCH_DEV_ROWS = 30  # below this one score's standard error is 9 points or more (accuracy near 0.5)


@dataclass
class SearchRun:
    """One worker's search of one study: what its stages read (the inputs, checked) and what the
    stages before found (the rates mode, the queue, the runs left, the calibrations)."""

    study: object
    exp: Experiment
    task: object
    splits: object
    space: object
    model_config: object
    budget: int | None
    backbone_params: int
    printer: object
    lock: ClaimLock | None = None
    scale: float | None = None  # 1.0 where families train at measured rates: presets, the sweep
    seeded: list = field(default_factory=list)  # presets queued by this run
    queued: int = 0  # presets and warm starts the study holds
    target: int = 0  # trials the study should hold
    remaining: int = 0  # of them, still to train
    calibration: dict | None = None  # the trial length's
    measured: dict | None = None  # the families' rates

    @property
    def n_layers(self) -> int:
        return self.model_config.num_hidden_layers


def _search(run: SearchRun) -> SearchSummary:
    """The stages of a search, in order: queue, announce, before the trials, trials, finals."""
    if run.exp.strategy != "sampler":
        check_resumable(run.study, run.exp)  # before presets or warm starts are queued
    run.lock = ClaimLock(run.study, run.exp.study_name)
    notes = _queue(run)
    _announce(run, notes)
    _before_trials(run)
    _trials(run)
    return _finals(run)


def _queue(run: SearchRun) -> list[str]:
    """Seed the presets, warm starts and baselines the study lacks and count the trials to train
    (`SearchRun.target`, `remaining`); returns what to say of what was and was not queued."""
    study, exp, budget = run.study, run.exp, run.budget
    with run.lock():  # two workers never enqueue the same preset twice
        setting = rates.mode(study, exp)  # measured rates per family, or one drawn per trial
        run.scale = 1.0 if setting["calibrated"] else None  # presets, warm starts and the sweep: the rates
        if run.scale is not None:
            run.space = run.space.with_rate_scale(setting["spread"])
        over_budget: list[str] = []
        refused: list[str] = []
        run.seeded = seed_presets(
            study, run.space, exp.presets, run.model_config, budget, run.n_layers, over_budget, refused, scale=run.scale
        )
        warm_lines = (
            seed_warm_start(
                study, exp.warm_start, run.space, run.model_config, budget, run.n_layers, exp.storage_url, run.scale
            )
            if exp.warm_start
            else []
        )
        n_sweep, sweep_lines = (
            seed_sweep(
                study,
                run.space,
                run.model_config,
                budget,
                run.n_layers,
                calibrated=run.scale is not None,
                presets=exp.presets,
            )
            if exp.final.baselines
            else (len(sweep_trials(study)), [])
        )
        fail_stale(study)
        run.queued = sum(
            1
            for t in stored_trials(study)  # they count toward trials, and all train
            if (t.preset or t.warm_start) and t.state != TrialState.FAIL
        )
        run.target = _target(run, n_sweep)
        run.remaining = max(0, run.target - claimed(study))
    notes = []
    if over_budget:
        notes.append(f"presets over the budget of {budget:,}, not trained: {', '.join(over_budget)}")
    if refused:
        notes.append(f"presets this backbone cannot take, not trained: {'; '.join(refused)}")
    return notes + warm_lines + sweep_lines


def _target(run: SearchRun, n_sweep: int) -> int:
    """The trials the study should hold: those asked for, the sweep on top, every preset and warm
    start queued, a supernet's proposals (``both``); a one-shot study or the presets sampler: what
    it holds and has waiting."""
    study, exp = run.study, run.exp
    target = exp.trials + n_sweep + max(0, run.queued - exp.trials)
    if exp.strategy == "both":
        target += _proposals(study)  # a supernet's, when one ran: on top of trials
    if exp.sampler == "presets" or exp.strategy == "oneshot":
        target = claimed(study) + sum(1 for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING)
    waiting = sum(1 for t in stored_trials(study, (TrialState.WAITING,)) if t.preset or t.warm_start)
    return max(target, claimed(study) + waiting)  # queued on a study already at its count: they train too


def _announce(run: SearchRun, notes: list[str]) -> None:
    """Say what the study holds and will train, the budget, the data and the trivial baseline."""
    study, exp, printer, budget = run.study, run.exp, run.printer, run.budget
    trained = sum(is_trained(t) for t in study.get_trials(deepcopy=False))
    later = (
        ""
        if exp.strategy == "sampler" or StudyHeader.of(study).oneshot is not None
        else f" besides the proposals read from {exp.oneshot.file}"
        if exp.oneshot.file
        else " besides the supernet's proposals (it trains first)"
    )
    printer(
        f"study {exp.study_name!r}: {trained} trained so far; {run.remaining} to train{later}; presets queued: "
        f"{', '.join(run.seeded) or 'none new'}"
    )
    printer(f"  storage: {redact(exp.storage_url)}")
    if run.queued >= exp.trials and exp.sampler != "presets" and exp.strategy != "oneshot":
        printer(
            f"trials: {exp.trials}, no more than the {run.queued} presets and warm starts queued: the sampler "
            f"proposes nothing (raise trials to search)"
        )
    for line in notes:
        printer(line)
    head = (
        "the task head is counted beside it"
        if not run.task.generative
        else "the language-model head is pretrained and frozen"
    )
    printer(
        f"budget: {budget:,} deployable parameters ({100 * budget / run.backbone_params:.3f}% of "
        f"{run.backbone_params:,}; {head})"
        if budget is not None
        else "budget: none"
    )
    if large := large_budget_warning(exp.budget, budget, run.backbone_params):
        printer(f"warning: {large}")
    for line in data_lines(run.splits, exp.fidelity.k):
        printer(line)
    _announce_data(run)


def _announce_data(run: SearchRun) -> None:
    """The trivial baseline, too few search-dev rows, and inputs unlike the test split's."""
    header, printer, splits = StudyHeader.of(run.study), run.printer, run.splits
    baseline = header.baseline
    if baseline is not None:
        near = "within noise of" if has_error_bar(run.task) else "no better than"
        printer(
            f"trivial baseline on search-dev: {baseline['what']}, {baseline['metric']} "
            f"{baseline['score']:.4f}; did not learn: {near} it"
        )
    if len(splits.search_dev) < FEW_SEARCH_DEV_ROWS:
        printer(
            f"warning: search-dev has only {len(splits.search_dev)} rows, too few to tell trials apart or "
            f"from the trivial baseline: raise fidelity.search_dev (or give the task more training rows)"
        )
    if header.input_shift:
        printer(shift_line(header.input_shift))


def _before_trials(run: SearchRun) -> None:
    """The trial length's calibration, each family's rate, then the supernet's proposals (queued)."""
    study, printer = run.study, run.printer
    baseline = StudyHeader.of(study).baseline
    run.exp, run.calibration = calibrate.resolve(
        study, run.exp, baseline, run.model_config, run.budget, printer, run.lock
    )
    exp = run.exp
    coming = exp.oneshot.rungs if exp.strategy != "sampler" and StudyHeader.of(study).oneshot is None else 0
    run.measured = rates.resolve(
        study,
        exp,
        run.space,
        run.model_config,
        run.budget,
        printer,  # None: one rate per trial
        known=calibrate.known_results(run.calibration),  # a run already trained: taken
        planned=rates.planned_runs(exp, run.remaining, coming),
        lock=run.lock,
    )
    study_note.write(study)  # the calibration runs, on the dashboard's study page
    if exp.strategy == "sampler":
        return
    before = _proposals(study)  # the supernet's proposals, then the sampler's (both)
    if StudyHeader.of(study).oneshot is None:
        printer(_supernet_line(exp, run.budget))
    for line in propose(study, exp, run.budget, run.lock, printer):
        printer(line)
    if exp.strategy == "oneshot":
        run.target = claimed(study) + sum(1 for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING)
    else:
        run.target += _proposals(study) - before
    in_all = max(0, run.target - claimed(study))
    if in_all != run.remaining:
        printer(f"{in_all} to train in all, the supernet's proposals included")
    run.remaining = in_all


def _trials(run: SearchRun) -> None:
    """Train the study's trials until it holds its target, with the executor the experiment names;
    a stop fails this worker's running trials so that they are retried first."""
    study, exp, printer = run.study, run.exp, run.printer
    recipe = trial_recipe(exp)
    heartbeat = Heartbeat(study, exp.heartbeat_interval)
    source = _trial_source(run, heartbeat)
    recorder = Recorder(
        source,
        _trial_writer(run, Progress(study, run.remaining, printer)),
        baseline=StudyHeader.of(study).baseline,
        objectives=exp.objectives,
        known=calibrate.known_results(run.calibration) + rates.known_results(run.measured),
    )
    execute = _executor(run, source, recipe, recorder)

    def stopped(masked: str | None) -> None:  # Ctrl-C: this worker's running trials are retried first
        fail_interrupted(
            study,
            lambda: {*heartbeat.live, *running_without_heartbeat(study)},
            run.lock,  # asked for,
            {"fail_kind": INTERRUPTED},
            exp.grace_period,
            masked,
        )  # not beating: ours

    try:
        interruptible(
            lambda: fill(study, source, execute, printer, poll_s=exp.heartbeat_interval, grace_s=exp.grace_period),
            stopped,
        )
    except (StorageInternalError, OSError) as e:
        if isinstance(e, OSError) and e.errno != errno.ENOSPC:
            raise
        stopped(None)  # if the storage still takes it: retried first, at once
        raise _cannot_write(exp.storage_url, e) from None
    finally:
        heartbeat.stop()


def _trial_source(run: SearchRun, heartbeat: Heartbeat) -> TrialSource:
    """Where the trials come from: queued ones first, then the sampler's draws, each within the
    budget; a refused draw's reason said once."""
    said: set[str] = set()

    def invalid(number: int, reason: str) -> None:  # each reason once: a refused form is drawn often
        if reason not in said:
            said.add(reason)
            run.printer(
                f"trial {number} not trained, invalid configuration: {reason} (draws refused for the "
                f"same reason are counted as failed, not said again)"
            )

    exp, measured = run.exp, run.measured or {}
    return TrialSource(
        run.study,
        run.space,
        run.model_config,
        run.budget,
        run.n_layers,
        flat=exp.sampler == "gp",
        target=run.target,
        lock=run.lock,
        heartbeat=heartbeat,
        sampler_for=seeded_sampler(exp.sampler, exp.seed, exp.startup_trials),
        head_trains=not run.task.generative,
        on_invalid=invalid,
        rates=measured.get("rates") or None,
        scales=measured.get("scales") or None,
    )


def _trial_writer(run: SearchRun, progress: Progress):
    """What is done with a finished trial: its JSON under the run folder, then its console line."""
    trial_dir = run.exp.run_dir / "trials"
    trial_dir.mkdir(parents=True, exist_ok=True)

    def on_done(p, state, info):
        text = json.dumps(
            {
                "number": p.number,
                "state": state,
                "preset": p.preset,
                "config": p.config.to_dict(),
                "lr": p.lr,
                "deployable": p.deployable,
                "trainable": p.trainable,
                **{k: v for k, v in info.items() if k != "history"},
            },
            indent=2,
            default=str,
        )
        atomic_write(trial_dir / f"{p.number}.json", lambda path: Path(path).write_text(text, encoding="utf-8"))
        progress(p, state, info)

    return on_done


def _executor(run: SearchRun, source: TrialSource, recipe, recorder: Recorder):
    """``execute(n)``: train n trials of ``source`` with the experiment's executor (Ray Tune, or one
    after another here); what one call of Ray learned of GPU packing serves the next."""
    exp = run.exp
    # ASHA never judges a trial before calibration saw every preset learn (its first rung, in evaluations).
    learned_at = (run.calibration or {}).get("first_learned_epochs")
    first_rung = max(1, int(learned_at * exp.fidelity.evals_per_epoch)) if learned_at else 1
    learned: GpuPacking | None = None  # gpus_per_trial auto: what one call of Ray learned, for the next

    def make_spec(p):
        return trial_spec(exp, p.config, recipe.with_overrides(lr=p.lr), number=p.number)

    def execute(n: int) -> None:
        nonlocal learned
        if exp.executor != "ray":
            EXECUTORS["local"](source, n, make_spec, recorder)
            return
        learned = EXECUTORS["ray"](
            source,
            n,
            make_spec,
            recorder,
            n_evals=n_evaluations(len(run.splits.train), recipe),
            run_dir=str(exp.run_dir),
            first_rung=first_rung,
            cpus_per_trial=exp.cpus_per_trial,
            gpus_per_trial=exp.gpus_per_trial,
            concurrent=exp.concurrent,
            scheduler=exp.scheduler,
            address=exp.ray_address,
            reserved_mb=exp.fidelity.frozen_cache_mb or 0.0,  # a worker's cache: on its GPU
            packing=learned,
            printer=run.printer,
        )

    return execute


def _finals(run: SearchRun) -> SearchSummary:
    """Re-evaluate the front on the held-out test split (``final.seeds``), then the summary."""
    if run.exp.final.seeds > 0:
        reevaluate_front(run.study, run.exp, run.task, trial_recipe(run.exp), run.printer)
    return summarize(run.study, run.exp, run.budget, run.backbone_params)


def _cannot_write(storage_url: str, e: BaseException) -> OSError:
    """A search that can no longer write (a full disk; Optuna says "e.g. exceeding max length" of
    any failed commit) as one line naming the study's file and what to do."""
    cause = e
    while cause.__cause__ is not None:
        cause = cause.__cause__
    said = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    full = isinstance(e, OSError) or "full" in said or "No space" in said
    where = (
        e.filename if isinstance(e, OSError) and e.filename else str(sqlite_path(storage_url) or redact(storage_url))
    )
    return OSError(
        errno.ENOSPC if full else errno.EIO,
        f"{'the disk is full' if full else 'the study cannot be written'} ({said}); "
        f"{'free some space' if full else 'fix the storage'}, then run the same command again to go on "
        f"(nothing finished is lost)",
        where,
    )


def fill(study, source: TrialSource, execute, printer, poll_s: float, grace_s: float) -> None:
    """Train until the study holds ``source.target`` trained trials and none runs anywhere.

    Trials running in other workers count toward the target; if one of them is lost (its worker
    died, its heartbeat lapses), it is failed and re-queued, and this worker trains the difference.
    """
    said = None
    while True:
        with source.lock():
            fail_stale(study)
            have = claimed(study)
            running = sum(1 for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING)
        if have < source.target:
            execute(source.target - have)
            continue
        if not running:
            return
        if said != running:
            printer(
                f"waiting for {running} trial(s) running in other workers (or lost with a stopped "
                f"one: failed and trained again here once its heartbeat is {grace_s:g}s old)"
            )
            said = running
        time.sleep(poll_s)
        raise_if_stopped()


def summarize(study, exp: Experiment, budget, backbone_params: int, wall_s: float = 0.0) -> SearchSummary:
    """The front and the presets with noise-aware relations, and the trials ``final.confirm`` re-scored
    that are off the front (export's candidates too); a confirmed row carries its scores over seeds.
    Paired test differences are to the preset with the best search score among those re-evaluated
    (the test split decides nothing here)."""
    header, trials = StudyHeader.of(study), {t.number: t for t in stored_trials(study)}
    members = [trials[t.number] for t in front(study)]
    on_front = {t.number for t in members}
    presets = [t for t in trials.values() if t.state == TrialState.COMPLETE and t.preset]
    confirmed = confirmed_scores(study)  # final.confirm's: the search score, then one per seed
    evaluated = [p for p in presets if p.final]
    reference = max(evaluated, key=lambda t: t.values[0]) if evaluated else None

    def row(t: StoredTrial) -> dict:
        final, se = t.final or {}, t.score_se
        dominates, matches = [], []
        for p in presets:
            if p.number == t.number or t.values[1] > p.values[1] or t.did_not_learn:
                continue
            if clearly_better(t.values[0], se, p.values[0], p.score_se):
                dominates.append(p.preset)
            elif t.values[1] < p.values[1] and not clearly_better(p.values[0], p.score_se, t.values[0], se):
                matches.append(p.preset)
        paired = None
        if reference is not None and final and t.number != reference.number:
            paired = paired_difference(final["scores"], reference.final["scores"])
        return {
            "number": t.number,
            "preset": source_of(t),
            "score": t.values[0],
            "se": se,
            "deployable": int(t.values[1]),
            "pct": 100 * t.values[1] / backbone_params,
            "test_mean": final.get("mean"),
            "test_std": final.get("std"),
            "test_n": len(final.get("scores", [])),
            "dominates": dominates,
            "matches": matches,
            "paired": paired,
            "did_not_learn": t.did_not_learn,
            "confirmed": confirmed.get(t.number),
            "on_front": t.number in on_front,
            "config": t.petl_config,
            "costs": {o: t.cost(o) for o in exp.objectives[2:]},
        }

    rows = [row(t) for t in members]
    anchors = [row(p) for p in sorted(presets, key=lambda t: t.values[1])]  # to each other too, as on the front
    off = [t for t in trials.values() if t.number in confirmed and t.number not in on_front and not t.preset]
    off_rows = [row(t) for t in sorted(off, key=lambda t: t.values[1])]
    flat = sum(1 for t in trials.values() if t.state == TrialState.COMPLETE and t.did_not_learn)
    return SearchSummary(
        exp.study_name,
        exp.storage_url,
        header.metric or "score",
        budget,
        state_counts(study),
        rows,
        wall_s,
        anchors,
        failure_counts(study),
        baseline=header.baseline,
        did_not_learn=flat,
        reference=reference.preset if reference is not None else None,
        sweep=sweep_line(study),
        shift=header.input_shift,
        calibrated_epochs=(header.fidelity_calibration or {}).get("epochs"),
        confirmed=off_rows,
        verdict=said.line if (said := verdict(study)) is not None else None,
    )


__all__ = ["run_search", "SearchSummary", "summarize", "fill"]
