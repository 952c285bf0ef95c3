"""One-shot proposals in a study: train the supernet once, enqueue what it suggests per budget.

`propose` runs before the sampler's trials (``strategy: oneshot`` or ``both``): one supernet run
(`run.run_supernet`: a Ray Tune trial with the Ray executor, in-process with the local one) builds
the supernet from the study's space, trains it with the trial recipe toward the budget
(`train.train_supernet`; in a study with measured rates each family at its rate, as trials: its
``lr_multiples``, and each zero-start candidate at its family's scale: ``scales``) and derives a
configuration for each budget of a ladder from the smallest one-unit count to the budget
(`derive`); `propose` enqueues each distinct one as a proposal with
its configuration given whole (it is generally not a point of the space: sizes differ per layer)
and its learning rate (the supernet's, or the sampler's: ``oneshot.proposal_lr``), marked
``oneshot: <run>`` and ``oneshot_budget`` (and ``oneshot_anchor``: the baseline a proposal builds
on, with ``oneshot.anchors``). They are then trained from scratch with the trial recipe
and scored like every trial, so the front mixes one-shot, sampler and preset points measured the
same way.

A supernet that did not learn (search-dev within noise of the trivial baseline) or diverged is
trained once more with every rate times ``oneshot.retry_lr`` (a third: a supernet sums every
candidate of a sublayer, so one module's measured rate can be too fast for it), and the record
keeps the first run's outcome (``retried``); its proposals are the second run's.

The run is recorded on the study (user attribute ``oneshot``: its settings, cost, score, expected
count, what it proposed, where it ran and how many attempts it took). Its start is recorded too
(``oneshot_started``: when, on which host and process, and a beat its worker renews every
``heartbeat_interval``). Another worker of the study that finds the run beating waits for its
proposals instead of training a second supernet; a study killed while the supernet trains (its
process gone, or its beat older than ``grace_period``) says so when it resumes, and
trains the supernet again, going on from the training state it saved after its last whole epoch
(``<run dir>/oneshot/<run>.pt``; the record says from which epoch); one killed later resumes with
the proposals queued. The state file is removed once the record is stored.

With ``oneshot.budgets`` the supernet also derives each of those smaller budgets' own ladder and
`propose` writes every budget's proposals to ``runs/NAME/oneshot.json`` (`FILE`); a study with
``oneshot.file`` enqueues the ones for its budget from such a file, after checking it was made on
the same backbone, task, data and space, and trains no supernet (its record says ``from``).

With ``oneshot.runs`` > 1 the supernet's knobs are searched first (`knobs.py`: an Optuna study of
supernet runs beside this one); the best run by its proposals' inherited scores proposes, the
record names it and keeps every run (``knob_search``), and its cost is that of all the runs.
Several workers join one knob search, each training the runs no other worker has claimed. The
worker that starts a study's first attempt removes, before it records that start, the runs a
deleted or replaced study of the same name left.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time
from pathlib import Path

from ...errors import ConfigError
from ...fileio import atomic_write
from ...study.experiment import OneShot, parse_budget
from ...study.header import StudyHeader
from ...study.records import LR_FROM_SAMPLER, ONESHOT
from ...study.records import ONESHOT_ANCHOR as ANCHOR
from ...study.storage import as_stored
from ...tasks.significance import did_not_learn
from ..claims import training_elsewhere
from ..progress import Stage, repeating
from . import knobs
from .run import SupernetSpec, forget_state, run_on_ray, run_supernet
from .standing import describe, standing_path

ATTR = ONESHOT  # the study attribute of its supernet run, and the tag of each trial it proposed
STARTED = "oneshot_started"
FIRST_RUN = "oneshot_first_run"  # a supernet run that did not learn, stored before it is trained again
FILE = OneShot.FILE  # in the run folder of a study with ``oneshot.budgets``: what ``oneshot.file`` reads


def propose(study, exp, budget: int, lock, printer=None) -> list[str]:
    """Train the supernet and enqueue its proposals unless the study already has them; lines to print.
    Training runs outside ``lock`` (the study's `ClaimLock`: held for minutes it would block the
    other workers); the enqueueing inside it, so two workers never both enqueue. ``printer`` gets
    a line per supernet run of a knob search as it ends."""
    settings = as_stored(dataclasses.asdict(exp.oneshot))
    if StudyHeader.of(study).oneshot is not None:
        _check_same_settings(study, settings)
        return []
    if exp.oneshot.file:
        return _from_file(study, exp, budget, lock, settings)
    lines = []
    say = printer if printer is not None else lines.append
    o = exp.oneshot
    waited = False
    while True:
        with lock():  # one worker of several is the first to start it
            if StudyHeader.of(study).oneshot is not None:  # the one it waited for stored its proposals
                return []
            earlier = StudyHeader.of(study).oneshot_started
            elsewhere = training_elsewhere(earlier, exp.grace_period)
            if o.runs > 1 or not elsewhere:  # a knob search's runs are claimed apart: workers join it
                joining = o.runs > 1 and elsewhere
                attempt = earlier["attempt"] + (0 if joining else 1) if earlier else 1
                if earlier is None and o.runs > 1:
                    knobs.forget_runs(study)  # before any other worker can add runs
                mine = {
                    "at": datetime.datetime.now().isoformat(timespec="seconds"),
                    "attempt": attempt,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "beat": time.time(),
                }
                study.set_user_attr(STARTED, mine)
                break
        if not waited:
            say(
                f"one-shot: another worker ({earlier['host']}, process {earlier['pid']}) is training the supernet "
                f"since {earlier['at']}; waiting for its proposals"
            )
            waited = True
        time.sleep(min(5.0, exp.heartbeat_interval))
    if joining:
        say(
            f"one-shot: joining the knob search another worker ({earlier['host']}, process {earlier['pid']}) "
            f"started at {earlier['at']}: each supernet run is trained by one worker"
        )
    elif earlier and earlier.get("diverged"):
        say(
            f"one-shot: the supernet run started {earlier['at']} diverged ({earlier['diverged']}); "
            f"training it again (attempt {attempt})"
        )
    elif earlier:
        say(
            f"one-shot: the supernet run started {earlier['at']} left no result (its worker stopped); "
            f"training it again from its last saved epoch, if any (attempt {attempt})"
        )
    with _beating(study, mine, exp.heartbeat_interval):  # (a knob search's runs also beat as its own trials)
        return lines + _train_and_enqueue(study, exp, budget, lock, say, settings, attempt)


def over_budget_note(expected_count: float, budget: int) -> str:
    """What to say when the supernet's gates ended well over the budget ("" when they did not)."""
    if expected_count <= 1.1 * budget:
        return ""
    return (
        f"; its gates ended over the budget of {budget:,} (the proposals are cut to each budget exactly, "
        f"from gates that had not decided: more oneshot.epochs or a larger oneshot.penalty_step let them)"
    )


def _beating(study, started: dict, interval: float):
    """While the block runs, a thread renews the run's beat every ``interval`` seconds, so that other
    workers wait for it instead of training a second supernet."""

    def beat():
        try:
            current = StudyHeader.of(study).oneshot_started
            if current and current.get("pid") == started["pid"] and current.get("host") == started["host"]:
                study.set_user_attr(STARTED, {**current, "beat": time.time()})
        except Exception:  # noqa: BLE001 - a database hiccup: the next beat retries
            pass

    return repeating(interval, beat, "petl-nas-supernet-beat")


def _train_and_enqueue(study, exp, budget: int, lock, say, settings: dict, attempt: int) -> list[str]:
    """Train the supernet (or search its knobs) and enqueue its proposals; lines to print."""
    start = time.perf_counter()
    o = exp.oneshot
    measured = measured_rates(study)
    spec = supernet_spec(
        exp, budget, measured, measured_scales(study) if measured else None, also=_counts(study, o.budgets or ())
    )
    epochs, multiples, scales = spec.epochs, spec.lr_multiples, spec.scales
    state_dir = os.path.dirname(spec.checkpoint)

    stage = Stage(say, o.runs)  # a line at least every 30 s while a supernet trains

    def run_one(s: SupernetSpec) -> dict:
        path, since = standing_path(s.checkpoint), time.time()  # its epochs, as the training writes them
        with stage.run(
            f"one-shot: training the supernet at budget {budget:,} ({epochs:g} epochs)", lambda: describe(path, since)
        ):
            if exp.executor == "ray":  # a Ray Tune trial: the driver may have no GPU
                return run_on_ray(s, str(exp.run_dir), exp.ray_address)
            return run_supernet(s)

    knob_runs = None
    if o.runs > 1:
        baseline = StudyHeader.of(study).baseline
        reference = (baseline["score"] if baseline else 0.0, float(budget))
        number, result, knob_runs = knobs.search(
            exp.storage_url,
            study.study_name,
            o,
            spec,
            run_one,
            state_dir,
            reference,
            exp.seed,
            say,
            lock=lock,
            heartbeat_interval=exp.heartbeat_interval,
            grace_period=exp.grace_period,
        )
        run = f"oneshot-{exp.seed}-knobs-{number}"
        chosen = next(r["knobs"] for r in knob_runs if r["number"] == number)
    else:
        run = f"oneshot-{exp.seed}"
        spec, result = _run_retrying(study, spec, o.retry_lr, run_one, lock, say)
        multiples, chosen = spec.lr_multiples, o.knobs()  # (the proposals' rate stays oneshot.lr)
    proposed = result["proposed"]
    shared = {str(budget): proposed, **result.get("proposed_for", {})}
    record = _record(exp, result, run, chosen, multiples, scales, epochs, budget)
    record.update(cost_s=round(time.perf_counter() - start, 1), attempts=attempt, resumed_from=result["resumed_from"])
    record["settings"] = settings
    if "retried" in result:
        record["retried"] = result["retried"]
    if knob_runs is not None:
        record["knob_search"] = {"study": study.study_name + knobs.SUFFIX, "chosen": number, "runs": knob_runs}
    if o.budgets:
        record["serves"] = {"file": str(exp.run_dir / FILE), "budgets": sorted(int(b) for b in shared)}
    write = (lambda: _write_file(study, exp, run, chosen["lr"], shared)) if o.budgets else None
    if not _enqueue(study, exp, proposed, record, chosen["lr"], lock, write):
        return []  # another worker got there first
    forget_state(spec)
    return [_trained_line(record, o, chosen, knob_runs, number if knob_runs else None)] + not_learned_lines(
        record, StudyHeader.of(study).baseline
    )


def _record(exp, result: dict, run: str, chosen: dict, multiples, scales, epochs, budget: int) -> dict:
    """What the study keeps of the supernet run that proposed: its candidates, knobs, rates,
    outcome, proposals and where it ran."""
    o = exp.oneshot
    return {
        "run": run,
        "candidates": result["candidates"],
        "bitfit": result["bitfit"],
        "layernorms": result.get("layernorms", False),
        "prompt_length": result.get("prompt_length", 0),
        "lr": chosen["lr"],
        "gate_lr": chosen["gate_lr"],
        "family_rates": {f: chosen["lr"] * m for f, m in multiples.items()} if multiples else None,
        "family_scales": scales,
        "penalty_step": chosen["penalty_step"],
        "temperature": chosen["temperature"],
        "warmup": o.warmup,
        "init_open": chosen["init_open"],
        "proposal_lr": o.proposal_lr,
        "epochs": epochs,
        "target": budget,
        "score": result["score"],
        "score_se": result.get("score_se"),
        "expected_count": round(result["expected_count"]),
        "multiplier": result["multiplier"],
        "supernet_params": result["supernet_params"],
        "proposed": result["proposed"],
        "where": {
            "executor": exp.executor,
            "device": result["device"],
            "host": result["host"],
            **({"resources": result["resources"]} if "resources" in result else {}),
        },
    }


def _trained_line(record: dict, o, chosen: dict, knob_runs, number) -> str:
    """The line that says what the supernet was, how it trained and what it proposed."""
    epochs, scales, proposed = record["epochs"], record["family_scales"], record["proposed"]
    resumed = record["resumed_from"]
    went_on = f" (went on from epoch {resumed['epoch']})" if resumed else ""
    if "retried" in record:
        went_on += (
            f", trained again at every rate x {record['retried']['factor']:.3g} after its first run "
            f"{_outcome(record['retried'])}"
        )
    if knob_runs is not None:
        went_on += (
            f", the best of {len(knob_runs)} runs by inherited hypervolume (run {number}: "
            + ", ".join(f"{k} {chosen[k]:.3g}" for k in o.knob_ranges())
            + ")"
        )
    over = over_budget_note(record["expected_count"], record["target"])
    at = (
        (" with each family at its measured rate" + (" and scale" if scales else ""))
        if record["family_rates"]
        else f" at lr {chosen['lr']:.3g}"
    )
    return (
        f"one-shot: a supernet of {record['supernet_params']:,} parameters trained {epochs:g} epochs{at}{went_on} "
        f"in {record['cost_s']:.0f}s on {record['where']['device']} (search-dev {record['score']:.4f}, expected "
        f"size {record['expected_count']:,}); {len(proposed)} proposals enqueued: "
        + ", ".join(_named(p) for p in proposed)
        + over
    )


def _run_retrying(study, spec: SupernetSpec, factor: float, run_one, lock, say) -> tuple[SupernetSpec, dict]:
    """(the spec that proposes, its result): ``spec``'s run, or where it did not learn (within noise
    of the trivial baseline) or diverged and ``factor`` is set, a second run with every rate times
    ``factor`` (`slower`), its result carrying the first's under ``retried``. The first run's result
    is stored before the second starts (`FIRST_RUN`), so a study stopped during the second goes on
    with it and does not train the first again."""
    first = StudyHeader.of(study).oneshot_first_run
    if first is None:
        if not factor:
            return spec, _run_or_refuse(study, spec, run_one, lock)
        try:
            result = run_one(spec)
        except Exception as e:  # noqa: BLE001 - a loss gone non-finite: a rate too fast
            if not knobs.diverged(e):
                raise
            result = {"score": None, "diverged": _first_line(e), "expected_count": None, "resumed_from": None}
        if result["score"] is not None and not did_not_learn(
            result["score"], result.get("score_se"), StudyHeader.of(study).baseline
        ):
            return spec, result
        first = {
            "score": result["score"],
            "score_se": result.get("score_se"),
            "factor": factor,
            "expected_count": result["expected_count"] and round(result["expected_count"]),
            "resumed_from": result["resumed_from"],
            **({"diverged": result["diverged"]} if "diverged" in result else {}),
        }
        with lock():
            study.set_user_attr(FIRST_RUN, first)
        forget_state(spec)
        say(
            f"one-shot: the supernet {_outcome(first)}; training it again with every rate x {factor:.3g} "
            f"(oneshot.retry_lr)"
        )
    else:
        say(
            f"one-shot: the supernet's first run {_outcome(first)}; going on with its second, every rate "
            f"x {first['factor']:.3g} (oneshot.retry_lr)"
        )
    spec = slower(spec, first["factor"])
    return spec, {**_run_or_refuse(study, spec, run_one, lock), "retried": first}


def _outcome(first: dict) -> str:
    """Why a supernet was trained again: ``diverged (...)`` or ``did not learn (search-dev ...)``."""
    if first.get("diverged"):
        return f"diverged ({first['diverged']})"
    return f"did not learn (search-dev {first['score']:.4f})"


def _run_or_refuse(study, spec: SupernetSpec, run_one, lock) -> dict:
    """``run_one(spec)``; a run whose loss went non-finite is recorded and refused in one line."""
    try:
        return run_one(spec)
    except Exception as e:  # noqa: BLE001 - a loss gone non-finite is the user's to fix
        if not knobs.diverged(e):
            raise
        why = _first_line(e)
        with lock():
            study.set_user_attr(STARTED, {**StudyHeader.of(study).oneshot_started, "diverged": why})
        raise ConfigError(
            f"oneshot: the supernet diverged ({why}): lower oneshot.lr or oneshot.gate_lr, "
            f"then run the same command again"
        ) from None


def slower(spec: SupernetSpec, factor: float) -> SupernetSpec:
    """``spec`` with every rate times ``factor`` (each family's measured rate where it has them, else
    ``lr``; the gates keep theirs), its training state in a file of its own."""
    rates = (
        {"lr_multiples": {f: m * factor for f, m in spec.lr_multiples.items()}}
        if spec.lr_multiples
        else {"lr": spec.lr * factor}
    )
    return dataclasses.replace(spec, **rates, checkpoint=_retry_path(spec.checkpoint))


def _retry_path(path: str | None) -> str | None:
    return None if path is None else path.removesuffix(".pt") + ".retry.pt"


def supernet_spec(exp, budget: int, rates: dict | None = None, scales: dict | None = None, also=()) -> SupernetSpec:
    """The supernet ``exp`` trains at ``budget`` (deployable parameters): its one-shot settings, data
    and recipe, each family at ``rates`` (None: every family at ``oneshot.lr``) and each zero-start
    candidate at its family's scale in ``scales``, also deriving for the counts in ``also``."""
    o = exp.oneshot
    state_dir = os.path.abspath(os.path.join(exp.run_dir, "oneshot"))
    return SupernetSpec(
        backbone=exp.backbone,
        task=exp.task,
        data_dir=exp.data_dir,
        k=exp.fidelity.k,
        data_seed=exp.data_seed,
        search_dev=exp.fidelity.search_dev,
        space=exp.space,
        budget=budget,
        rungs=o.rungs,
        lr=o.lr,
        gate_lr=o.gate_lr,
        epochs=o.epochs if o.epochs is not None else exp.fidelity.epochs,
        init_open=o.init_open,
        batch_size=exp.fidelity.batch_size,
        max_length=exp.fidelity.max_length,
        length_buckets=exp.fidelity.length_buckets,
        seed=exp.seed,
        checkpoint=os.path.join(state_dir, f"oneshot-{exp.seed}.pt"),
        precision=exp.fidelity.precision,
        penalty_step=o.penalty_step,
        temperature=o.temperature,
        also=tuple(also),
        anchors=o.anchors,
        scales=scales,
        warmup=o.warmup,
        lr_multiples={f: rate / o.lr for f, rate in rates.items()} if rates else None,
    )


def measured_rates(study) -> dict | None:
    """The rate of each family a study whose trials train at measured rates recorded (`rates`);
    None for a study that draws one rate per trial. The supernet trains each family at it too."""
    if not trains_at_measured_rates(study):
        return None
    return (StudyHeader.of(study).rate_calibration or {}).get("rates") or None


def measured_scales(study) -> dict | None:
    """The scale each family's rate was measured at, as the study recorded it (None: a study that
    recorded rates without them keeps its modules' own scales, as its trials do). The supernet
    trains every candidate whose scale is only a rate at it, so that a LoRA candidate (s = 1) is
    not ranked at half the rate its trials get (LoRA's rate is measured at s = 2)."""
    return (StudyHeader.of(study).rate_calibration or {}).get("scales") or None


def trains_at_measured_rates(study) -> bool:
    """Whether the study's trials train each family at its measured rate (`rates: auto`), rather
    than at one rate drawn per trial."""
    return bool((StudyHeader.of(study).rates_mode or {}).get("calibrated"))


def not_learned_lines(record: dict, baseline: dict | None) -> list[str]:
    """One line when the supernet's search-dev score is within noise of the trivial baseline (none
    otherwise): its gates then learned nothing about the task, and the ladder's proposals are
    sizes, not choices."""
    if not did_not_learn(record["score"], record.get("score_se"), baseline):
        return []
    near = "within noise of" if record.get("score_se") is not None else "no better than"
    return [
        f"one-shot: the supernet did not learn (search-dev {record['score']:.4f}, {near} the trivial baseline's "
        f"{baseline['score']:.4f}): its proposals are uninformed; they train as trials beside the presets and "
        f"anchors, which do not depend on it (more oneshot.epochs or a knob search, oneshot.runs > 1, "
        f"may let it learn)"
    ]


def check_resumable(study, exp) -> None:
    """Refuse, before anything is queued, to resume a study whose supernet was trained with other
    ``oneshot`` settings (`propose` would refuse it later, after presets and warm starts were added)."""
    if StudyHeader.of(study).oneshot is not None:
        _check_same_settings(study, as_stored(dataclasses.asdict(exp.oneshot)))


def _check_same_settings(study, settings: dict) -> None:
    """A resumed study whose supernet was trained with other ``oneshot`` settings: refused, since its
    proposals are those of the old settings (a study from before settings were stored is not checked;
    a setting added since it was stored reads as its default)."""
    stored = StudyHeader.of(study).oneshot.get("settings")
    if stored is None:
        return
    stored = {**as_stored(dataclasses.asdict(OneShot())), **stored}  # a key added since: its default
    changed = [f"{k} {stored.get(k)!r} -> {settings.get(k)!r}" for k in settings if stored.get(k) != settings.get(k)]
    if not changed:
        return
    raise ConfigError(
        f"study {study.study_name!r} trained its supernet with other oneshot settings "
        f"({'; '.join(changed)}); its proposals are those of the first: to train another supernet, "
        f"name a new study (--study NAME)"
    )


def _enqueue(study, exp, proposed: list[dict], record: dict, supernet_lr: float, lock, before=None) -> bool:
    """Enqueue each proposal (its configuration given whole, at its rate) and store ``record``,
    under ``lock``, after ``before()`` (the file of ``oneshot.budgets``: only the worker whose
    proposals the study keeps writes it); False when another worker already had (nothing done)."""
    o = exp.oneshot
    with lock():
        if StudyHeader.of(study).oneshot is not None:
            return False
        if before is not None:
            before()
        for p in proposed:
            attrs = {
                "petl_config": p["config"],
                ATTR: record["run"],
                "oneshot_budget": p["budget"],
                **({ANCHOR: p["anchor"]} if p.get("anchor") else {}),
            }
            if o.proposal_lr == "sampler":  # the sampler draws it when the trial starts
                attrs[LR_FROM_SAMPLER] = True
            elif trains_at_measured_rates(study):
                attrs["recipe"] = {"lr_scale": 1.0}  # each family at its measured rate, as presets
            else:
                attrs["recipe"] = {"lr": supernet_lr if o.proposal_lr == "supernet" else float(o.proposal_lr)}
            study.enqueue_trial({}, user_attrs=attrs, skip_if_exists=False)
        study.set_user_attr(
            ATTR, {**record, "proposed": [{k: v for k, v in p.items() if k != "config"} for p in proposed]}
        )
    return True


def _counts(study, budgets) -> list[int]:
    """``oneshot.budgets`` as deployable counts of this study's backbone."""
    return [parse_budget(b, StudyHeader.of(study).backbone_params) for b in budgets]


MATCHING = ("backbone", "task", "task_files", "data_seed", "space_hash")
MATCHING_FIDELITY = ("k", "search_dev", "max_length")


def _matching(header: StudyHeader) -> dict:
    """What a study's proposals depend on besides its budget (from its header): the backbone, task,
    data and space."""
    return {
        **{k: getattr(header, k) for k in MATCHING},
        **{k: header.fidelity.get(k) for k in MATCHING_FIDELITY},
    }


def read_proposals(path: str, header: StudyHeader, budget: int) -> tuple[dict, list[dict]]:
    """The file ``oneshot.file`` names and its proposals for ``budget``, for a study whose header is
    ``header``; one error line when it cannot serve it (unreadable, made on another backbone,
    task, data or space, or without this budget). Called before the study exists."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"oneshot.file {path!r}: {why}")

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad("no such file (the study whose oneshot.budgets writes it runs first)") from None
    except (OSError, ValueError) as e:
        raise bad(f"cannot be read ({str(e).splitlines()[0]})") from None
    shape = (
        isinstance(data, dict)
        and isinstance(data.get("proposed"), dict)
        and isinstance(data.get("made_for"), dict)
        and isinstance(data.get("run"), str)
        and isinstance(data.get("lr"), (int, float))
        and all(
            isinstance(ps, list)
            and all(isinstance(p, dict) and {"config", "budget", "deployable"} <= set(p) for p in ps)
            for ps in data["proposed"].values()
        )
    )
    if not shape:
        raise bad("not a supernet's proposals (written by a study with oneshot.budgets)")
    here = _matching(header)
    if differ := [
        f"{k} {data['made_for'].get(k)} (here {here[k]})" for k in here if data["made_for"].get(k) != here[k]
    ]:
        raise bad(f"its supernet was trained for another study: {', '.join(differ)}")
    if str(budget) not in data["proposed"]:
        raise bad(
            f"it holds proposals for budgets {', '.join(f'{int(b):,}' for b in data['proposed'])}, not "
            f"{budget:,} (add it to the oneshot.budgets of study {data.get('study')!r})"
        )
    return data, data["proposed"][str(budget)]


def _write_file(study, exp, run: str, supernet_lr: float, proposed: dict) -> None:
    """``runs/NAME/oneshot.json``: the proposals for this budget and ``oneshot.budgets``, for the
    studies of those budgets to read (``oneshot.file``)."""
    text = json.dumps(
        {
            "study": study.study_name,
            "run": run,
            "lr": supernet_lr,
            "made_for": _matching(StudyHeader.of(study)),
            "proposed": proposed,
        },
        indent=1,
    )
    path = exp.run_dir / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _from_file(study, exp, budget: int, lock, settings: dict) -> list[str]:
    """Enqueue the proposals ``oneshot.file`` holds for ``budget``; no supernet is trained."""
    path = exp.oneshot.file
    data, mine = read_proposals(path, StudyHeader.of(study), budget)
    source = data.get("study")
    record = {
        "run": f"{source}/{data['run']}",
        "from": {"file": str(path), "study": source},
        "target": budget,
        "cost_s": 0.0,
        "attempts": 0,
        "settings": settings,
    }
    if not _enqueue(study, exp, mine, record, data["lr"], lock):
        return []
    return [
        f"one-shot: {len(mine)} proposals read from {path} (the supernet of study {source!r}), "
        f"none trained here: " + ", ".join(_named(p) for p in mine)
    ]


def _named(proposal: dict) -> str:
    """A proposal in a line: its count, and the baseline it builds on if any."""
    anchor = f" ({proposal['anchor']} + the supernet's)" if proposal.get("anchor") else ""
    return f"{proposal['deployable']:,}{anchor}"


def _first_line(error: BaseException) -> str:
    """The message of the innermost cause (a Ray trial wraps the worker's error)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return (str(error).splitlines() or [type(error).__name__])[0]


__all__ = ["propose", "supernet_spec", "check_resumable", "read_proposals", "ATTR", "STARTED", "FILE"]
