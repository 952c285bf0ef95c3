"""Each family's learning rate, measured once before the search, so trials differ by structure.

What decided a trial's score was its learning rate: in a random search on SST-2 every trial at
lr <= 5.4e-4 scored 0.59-0.75 and every one at lr >= 9.8e-4 scored 0.79-0.82, whatever its modules,
and a mixed configuration trained its adapters and its LoRA at one compromise rate although their
good rates lie up to 10x apart. With ``rates: auto`` (new studies), before the trials:

- every family of modules the space can draw or a per-budget baseline trains (`FAMILY_PROBES`) is
  trained on one of its presets that fits the budget (else on its largest per-budget baseline,
  `baseline_probes`, else a preset with its sizes halved, or its layers cut, until it fits,
  `shrunk`, else its shape on the top layers that fit), with the trial recipe, scored on
  search-dev like a trial;
- each climbs from its paper rate times the factor measured so far on the families before it
  (the first: its paper rate), brought into the space's ``lr`` range where the space's author
  said good rates lie, in steps of `STEP`: up while the score rises, else down, at most
  `MAX_STEPS` runs; then the runs left take each family whose best is still at an edge of the
  rates it tried one step further that way while it rises (`extend`); the best score's rate is
  the family's;
- calibration takes at most ``rates.share`` of the runs the study will train (`planned_runs`:
  its trials, presets, sweep, baselines, a supernet's proposals, confirmation and final runs); a
  family it cannot afford keeps its paper rate times the factor measured on the others (the trial
  recipe moves every rate alike), and says so. A family a per-budget baseline trains is measured
  whatever the share, `MIN_RUNS` runs at least: every baseline trains at a measured rate, and the
  baseline's trial is its family's best run. LayerNorms train at the rate of the module they
  come with.

Every trial then trains each family at its rate (`at_rates`: the configuration's first family sets
the recipe's rate, the others are `PetlConfig.lr_mults` of it; the head follows the first family,
times the space's ``head_lr_mult``), and the sampler draws only ``lr_scale`` in [1/spread, spread]
(`SCALE`), one multiplier of them all. Presets and the LoRA rank sweep train at ``lr_scale`` 1:
the rates measured for their own families. The record (``rate_calibration``) is stored on the
study, printed a line per family, shown in the report, and written to ``runs/NAME/rates.json`` for
``rates: {file: ...}`` to reuse on the same backbone. It keeps the scale each module family was
measured at (``scales``: its probe's fixed scale), since a fixed scale on a module whose output
starts at zero is only a rate of its own: such modules then train at their family's scale
(`petl_nas.core.family_rates.at_reference_scales`). Each family's best run is kept whole: the
preset trained at its measured rate is recorded from it, not trained again. Nothing here reads
the test split.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core.config import PetlConfig
from ..core.family_rates import at_rates as apply
from ..core.family_rates import families_of, reference_scale, scale_can_be_a_rate
from ..core.presets import preset, preset_lr
from ..errors import ConfigError, read_text
from ..study.header import StudyHeader
from ..study.rates_text import lines
from ..study.records import RATE_CALIBRATION, RATES_SETTING
from ..study.results import TrialResult
from ..study.space import SearchSpace
from ..study.storage import as_stored
from . import claims
from .progress import Stage
from .rates_file import check_record, keep_file, write_file
from .study import preset_in_space

ATTR = RATE_CALIBRATION  # the study attribute holding the record
SETTING = RATES_SETTING  # the study attribute holding the mode it searches in
SCALE = "lr_scale"  # the study parameter the sampler draws in a calibrated study
STEP = 3.0  # one step of the climb: a factor of 3
MAX_STEPS = 3  # runs per family at most
MIN_RUNS = 2  # runs of a family a per-budget baseline trains, whatever the share: one climb step
NOMINAL_WIDTH = 768  # a hidden size to build a preset at where only its scales are read
# family -> presets that measure it, in order of preference (the first that fits the budget)
FAMILY_PROBES = {
    "lora": ("lora", "lora_ffn"),
    "adapter": ("pfeiffer", "parallel_adapter", "houlsby", "scaled_pa"),
    "compacter": ("compacter_pp", "compacter"),
    "prefix": ("prefix",),
    "mh_adapter": ("mh_pa",),
    "prompt": ("prompt_tuning",),
    "bitfit": ("bitfit",),
    "lokr": ("lokr",),
    "ia3": ("ia3", "ia3_kv"),
    "ln": ("ln_tuning",),
    "vera": ("vera",),
    "fourierft": ("fourierft",),
}


def space_families(space) -> list[str]:
    """The families the space can draw, in `FAMILY_PROBES` order."""

    def values(dim) -> tuple:
        return dim.choices or (dim.value,)

    forms = {f for s in space.slots for f in values(s.forms)}
    if any(values(space.globals["prompt_length"])):
        forms.add("prompt")
    if True in values(space.globals["bitfit"]):
        forms.add("bitfit")
    return [f for f in FAMILY_PROBES if f in forms]


def study_families(space, model_config, budget: int | None, baselines: bool = True) -> list[str]:
    """The families a study trains: those the space can draw, then (with ``baselines``: the study
    queues its per-budget baselines) those of today's small-budget methods that fit the budget
    (`baselines.family_baselines`), each with a probe in `FAMILY_PROBES`."""
    from .baselines import queued_baselines

    out = space_families(space)
    if baselines and model_config is not None:
        for _, config in queued_baselines(model_config, budget, model_config.num_hidden_layers):
            out += [f for f in families_of(config) if f in FAMILY_PROBES and f not in out]
    return out


def baseline_probes(space, model_config, budget: int | None) -> dict[str, tuple[str, PetlConfig]]:
    """family -> (name, configuration as the study trains it) of the largest per-budget baseline of
    that family alone (`baselines.queued_baselines`; LoRA without DoRA's magnitude): the run that
    measures the family where its preset is over the budget, so that its best run is the
    baseline's trial, recorded from it, not trained again. Each of these families is measured
    (`MIN_RUNS`), whatever calibration's share."""
    from ..core.budget import count_parameters
    from .baselines import queued_baselines

    largest = {}
    for name, config in queued_baselines(model_config, budget, model_config.num_hidden_layers):
        found = families_of(config)
        if len(found) != 1 or found[0] not in FAMILY_PROBES or any(getattr(m, "dora", False) for m in config.modules):
            continue
        n = count_parameters(model_config, config).deployable
        if found[0] not in largest or n > largest[found[0]][0]:
            largest[found[0]] = (n, name, space.with_head(config))
    return {family: (name, config) for family, (_, name, config) in largest.items()}


def probe(
    family: str, space, model_config, budget: int | None, baseline: tuple[str, PetlConfig] | None = None
) -> tuple[str, PetlConfig] | None:
    """The first preset of ``family`` that fits the budget, as the study trains it (lr_scale 1);
    when none does, the family's per-budget ``baseline`` (`baseline_probes`) where it has one, else
    the first preset the backbone takes with its modules' sizes halved until it fits (`shrunk`): a
    family is measured whenever one of its modules fits at all."""
    from ..core.budget import count_parameters, fitted  # torch: counting builds a meta model

    taken = []
    for name in FAMILY_PROBES[family]:
        config = as_trained(name, space, model_config)
        if config is None:
            continue
        if budget is None or count_parameters(model_config, config).deployable <= budget:
            return name, config
        taken.append((name, config))
    if baseline is not None:
        return f"{baseline[0]}, its baseline at this budget", baseline[1]
    for name, config in taken:
        small = shrunk(config, model_config, budget)
        if small is not None:
            return f"{name}, {cut(small)} to fit", small
    for name, config in taken:  # no size fits on every layer: the per-budget baseline's shape
        small = fitted(model_config, config, budget, model_config.num_hidden_layers)
        if small is not None:
            top = len(small.modules[0].layers or ())
            return f"{name}, sizes {'/'.join(str(m.size) for m in small.modules)} on the top {top} layers to fit", small
    return None


def as_trained(name: str, space, model_config) -> PetlConfig | None:
    """Preset ``name`` as the study trains it (lr_scale 1); None if the backbone refuses it."""
    from ..core.budget import count_parameters

    try:
        config, _ = preset_in_space(space, name, model_config, model_config.num_hidden_layers, lr=1.0)
        count_parameters(model_config, config)
    except ConfigError:  # a form this backbone refuses
        return None
    return config


def shrunk(config: PetlConfig, model_config, budget: int) -> PetlConfig | None:
    """``config`` with every module's size halved until it fits ``budget``, each kept a multiple of
    its form's size step (Compacter's n), and a module without a size (IA3's vectors, LN-tuning's
    norms) one layer fewer each time, its bottom one; None if even the smallest sizes and one layer
    do not fit (or it has no module to shrink)."""
    import dataclasses

    from ..core.budget import count_parameters
    from ..core.forms import form_named

    def step(m) -> int:
        return form_named(m.form).size_step(dataclasses.asdict(m))

    def smaller(m):
        if form_named(m.form).sized:
            return dataclasses.replace(m, size=max(step(m), m.size // 2 // step(m) * step(m)))
        layers = m.layers if m.layers is not None else tuple(range(model_config.num_hidden_layers))
        return dataclasses.replace(m, layers=layers[1:] or layers)

    while count_parameters(model_config, config).deployable > budget:
        less = dataclasses.replace(config, modules=tuple(smaller(m) for m in config.modules))
        if less == config:
            return None
        config = less
    return config


def cut(config: PetlConfig) -> str:
    """What `shrunk` left of a probe: its modules' sizes (``sizes 12``), or the layers of those without
    one (``layers 4-5``)."""
    from ..core.forms import form_named

    sizes = [str(m.size) for m in config.modules if form_named(m.form).sized]
    layers = sorted(
        {
            f"{m.layers[0]}-{m.layers[-1]}" if len(m.layers) > 1 else str(m.layers[0])
            for m in config.modules
            if not form_named(m.form).sized and m.layers is not None
        }
    )
    return ", ".join(
        ([f"sizes {'/'.join(sizes)}"] if sizes else []) + ([f"layers {'/'.join(layers)}"] if layers else [])
    )


def within(rate: float, lr) -> float:
    """``rate`` brought into the space's ``lr`` dimension (a range or a fixed value)."""
    if lr.kind == "fixed":
        return float(lr.value)
    return min(max(rate, float(lr.low)), float(lr.high)) if lr.kind == "float" else rate


def allowance(runs: int, share: float) -> int:
    """Calibration runs a study that plans ``runs`` trained runs affords: its share of them, and
    never fewer than 2 (one climb step of one family)."""
    return max(2, math.floor(share * runs))


def planned_runs(exp, to_train: int, proposals: int = 0) -> int:
    """The runs a study will train besides calibration, at least: ``to_train`` trials (the
    sampler's, presets, the sweep, baselines), ``proposals`` a supernet will add, the
    confirmation's extra seeds of its candidates and of the best baseline, and the final seeds of
    the pick and the best baseline. Calibration's share is of these: a one-shot study asks for no
    trials of the sampler's and still trains dozens of runs."""
    f = exp.final
    if f.seeds == 0:  # no final re-evaluation: no confirmation either
        return to_train + proposals
    confirming = (f.confirm + 1) * f.confirm_seeds if f.confirm else 0
    finals = f.seeds * (2 if f.baselines else 1)
    return to_train + proposals + confirming + finals


def climb(measure, start: float, runs: int) -> list[tuple[float, float]]:
    """(rate, score) of each run: ``start``, then up by `STEP` while the score rises, else down from
    ``start``; at most ``runs`` runs."""
    tried = [(start, measure(start))]
    for direction in (STEP, 1 / STEP):
        rate = start
        while len(tried) < runs:
            rate *= direction
            tried.append((rate, measure(rate)))
            if tried[-1][1] <= max(s for r, s in tried[:-1]):
                break
        if len(tried) >= runs or max(tried, key=lambda t: t[1])[0] > start:
            break  # it rose going up: no reason to go down
    return tried


def extend(measure, tried: list[tuple[float, float]], runs: int) -> list[tuple[float, float]]:
    """``tried`` climbed on past its edge: while the best rate is the highest (lowest) tried, one
    more step up (down) while the score rises, at most ``runs`` runs."""
    tried = list(tried)
    while runs > 0 and len(tried) > 1:
        best = max(tried, key=lambda t: t[1])
        rates_tried = [r for r, _ in tried]
        if best[0] not in (max(rates_tried), min(rates_tried)):
            break  # a peak inside the rates tried
        rate = best[0] * (STEP if best[0] == max(rates_tried) else 1 / STEP)
        tried.append((rate, measure(rate)))
        runs -= 1
        if tried[-1][1] <= best[1]:
            break
    return tried


@dataclass
class Climb:
    """One family's climb: how to measure a rate (``measure``; ``runs`` keeps each rate's spec and
    result), the preset it is measured on, its paper rate and the (rate, score) pairs tried."""

    measure: Callable[[float], float]
    runs: dict
    probe: str
    prior: float
    tried: list


def calibrate(exp, space, model_config, budget: int | None, printer, known=(), planned: int | None = None) -> dict:
    """Measure each family's rate (see the module docstring); returns the record stored on the study.
    Every family climbs first; the runs left then take the families whose best is at an edge of
    the rates they tried further that way (`extend`). A run whose spec is in ``known`` ((spec as
    stored, TrialResult) pairs: the trial length's calibration runs) is taken from it, not trained.
    ``planned``: the runs the study will train (`planned_runs`; None: ``trials``), of which
    calibration takes at most ``rates.share``."""
    from .specs import trial_recipe  # torch: only where runs are trained
    from .worker import free_memory

    start = time.perf_counter()
    planned = exp.trials if planned is None else planned
    left = allowance(planned, exp.rates.share)
    lr_range = SearchSpace.load(exp.space).globals["lr"]
    order, skipped, climbs = study_families(space, model_config, budget, exp.final.baselines), {}, {}
    floor = baseline_probes(space, model_config, budget) if exp.final.baselines else {}
    stage = Stage(printer, left + MIN_RUNS * len(floor), at_most=True)
    scales = {}
    for family in order:
        found = probe(family, space, model_config, budget, floor.get(family))
        prior = within(preset_lr(FAMILY_PROBES[family][0]), lr_range)
        ref = reference_scale(found[1], family) if found else preset_scale(family, FAMILY_PROBES[family][0])
        if ref is not None and scale_can_be_a_rate(family):
            scales[family] = ref
        runs = max(MIN_RUNS, min(MAX_STEPS, left)) if family in floor else min(MAX_STEPS, left)
        if found is None or runs < MIN_RUNS:
            skipped[family] = {
                "prior": prior,
                "why": "no preset of it fits the budget"
                if found is None
                else "not measured: calibration's share of the study's runs is spent",
            }
            continue
        measure, trained = _measurer(exp, family, *found, printer, stage, known)
        first = within(prior * factor_so_far(climbs), lr_range)  # the recipe moves every rate alike
        climbs[family] = Climb(measure, trained, found[0], prior, climb(measure, first, runs))
        left -= len(climbs[family].tried)
    measured, results, records = {}, {}, {}
    for family, c in climbs.items():
        more = extend(c.measure, c.tried, left)
        left -= len(more) - len(c.tried)
        rate = max(more, key=lambda t: t[1])[0]
        measured[family] = rate
        spec, r = c.runs[rate]
        results[family] = as_stored(
            {"spec": spec.to_dict(), "result": {k: v for k, v in r.to_dict().items() if k != "history"}}
        )
        records[family] = {
            "prior": c.prior,
            "probe": c.probe,
            "rate": rate,
            "tried": [[t, s] for t, s in more],
            "edge": len(more) > 1 and rate in (max(t for t, _ in more), min(t for t, _ in more)),
        }
    free_memory()
    factor = (
        math.exp(statistics.fmean(math.log(measured[f] / records[f]["prior"]) for f in measured)) if measured else 1.0
    )
    families = {f: records.get(f) or {**skipped[f], "rate": skipped[f]["prior"] * factor} for f in order}
    return {
        "rates": {f: families[f]["rate"] for f in order},
        "scales": scales,
        "families": families,
        "factor": factor,
        "runs": sum(len(v.get("tried", ())) for v in families.values()),
        "allowed": allowance(planned, exp.rates.share),
        "baselines": sorted(floor),  # measured whatever the share: a per-budget baseline trains them
        "trials": exp.trials,
        "planned": planned,
        "results": results,
        "epochs": trial_recipe(exp).epochs,
        "k": exp.fidelity.k,
        "backbone": json.dumps(exp.backbone),
        "task": str(exp.task),
        "cost_s": round(time.perf_counter() - start, 1),
    }


def factor_so_far(climbs: dict[str, Climb]) -> float:
    """The geometric mean of best rate / paper rate over the families climbed so far (1 before
    any): where the next family's climb starts, from its own paper rate."""
    ratios = [max(c.tried, key=lambda t: t[1])[0] / c.prior for c in climbs.values()]
    return math.exp(statistics.fmean(math.log(r) for r in ratios)) if ratios else 1.0


def _measurer(exp, family: str, name: str, config: PetlConfig, printer, stage: Stage, known=()):
    """(measure, runs): ``measure(rate)`` trains ``config`` with ``family`` at ``rate`` as a trial
    of the study would be (a run of ``stage``), or takes the result of the same spec from
    ``known``, prints the run, and returns its search score (-inf when it diverged); ``runs`` keeps
    each rate's (spec, result)."""
    from .specs import trial_recipe, trial_spec
    from .worker import run_trial

    recipe, runs = trial_recipe(exp), {}

    def measure(rate: float) -> float:
        trained, lr = apply({family: rate}, config, 1.0)
        spec = trial_spec(exp, trained, recipe.with_overrides(lr=lr))
        stored = as_stored(spec.to_dict())
        r = next((result for s, result in known if {**s, "number": stored["number"]} == stored), None)
        if r is None:
            with stage.run(f"rates: {family} ({name}) at {rate:.1e}"):
                r = run_trial(spec)
        score = r.score if r.score is not None and math.isfinite(r.score) else -math.inf
        runs[rate] = (spec, r)
        shown = (
            f"{score:.4f}" + (f" ± {r.score_se:.4f}" if r.score_se is not None else "")
            if score > -math.inf
            else "diverged"
        )
        done = "the trial length's calibration run of this spec, not trained again" if r.reused else stage.left()
        printer(f"  rates: {family} ({name}) at {rate:.1e}: {shown} ({done})")
        return score

    return measure, runs


def known_results(record: dict | None) -> list[tuple[dict, TrialResult]]:
    """(trial spec, result) of each family's best run: the preset trained at its family's rate is
    recorded from it, not trained again (``reused: calibration``)."""
    return [
        (r["spec"], TrialResult.from_dict({**r["result"], "reused": "calibration"}))
        for r in (record or {}).get("results", {}).values()
    ]


def read_file(path: str, exp) -> tuple[dict, list[str]]:
    """A ``rates.json`` to reuse, and what to say of it; one line when it cannot be (another backbone,
    not such a file, a rate or scale out of its range: `rates_file.check_record`)."""
    try:
        record = json.loads(read_text(Path(path)))
    except (OSError, ValueError) as e:
        raise ConfigError(f"rates.file {path!r}: cannot be read as a rates file ({str(e).splitlines()[0]})") from None
    check_record(record, path)  # finite, positive, within range: said naming file and key
    if record.get("backbone") != json.dumps(exp.backbone):
        raise ConfigError(
            f"rates.file {path!r}: measured on backbone {record.get('backbone')}, not "
            f"{json.dumps(exp.backbone)}; rates do not carry across backbones (calibrate again)"
        )
    if "scales" not in record:  # a file from before scales were recorded
        record["scales"] = probe_scales(record)
    notes = []
    if record.get("task") != str(exp.task):
        notes.append(f"rates: {path} was measured on task {record.get('task')}, reused for {exp.task}")
    return {**record, "source": str(path)}, notes


def probe_scales(record: dict) -> dict[str, float]:
    """The reference scales of a record that did not keep them: for each family of modules, the
    scale of the preset it was measured on (else of its first probe preset), sizes aside."""
    out = {}
    for family, f in record.get("families", {}).items():
        if family in FAMILY_PROBES:
            ref = preset_scale(family, str(f.get("probe") or FAMILY_PROBES[family][0]).split(",")[0])
            if ref is not None and scale_can_be_a_rate(family):
                out[family] = ref
    return out


def preset_scale(family: str, name: str) -> float | None:
    """`reference_scale` of ``family`` on preset ``name`` (sizes aside); None when it has none or this
    version no longer has the preset."""
    try:
        return reference_scale(preset(name, hidden_size=NOMINAL_WIDTH), family)
    except ConfigError:
        return None


def mode(study, exp) -> dict:
    """What the study searches with: ``{"calibrated": bool, "spread": s}``. A new study takes the
    experiment's; a study that holds trials keeps what it recorded (before rates existed: off)."""
    stored = StudyHeader.of(study).rates_mode
    if stored is None:
        fresh = not study.get_trials(deepcopy=False)
        stored = {"calibrated": exp.rates.on and fresh, "spread": exp.rates.spread}
        study.set_user_attr(SETTING, stored)
    return stored


def resolve(
    study, exp, space, model_config, budget: int | None, printer, known=(), planned: int | None = None, lock=None
) -> dict | None:
    """The study's rates: recorded, read from ``rates.file`` or measured now by one worker of the
    study (`claims.once` under ``lock``, the study's `ClaimLock`), stored, and written to
    ``rates.json`` from the study's record; ``planned``: see `calibrate`. None for a study that
    draws one rate per trial."""
    if not mode(study, exp)["calibrated"]:
        return None
    record = StudyHeader.of(study).rate_calibration
    path = exp.run_dir / exp.rates.FILE
    if record is None and exp.rates.file:
        record, notes = read_file(exp.rates.file, exp)
        for note in notes:
            printer(note)
        if StudyHeader.of(study).rate_calibration is None:  # another worker may have stored first: its stands
            study.set_user_attr(ATTR, record)
        record = StudyHeader.of(study).rate_calibration
    elif record is None:

        def measure() -> dict:
            printer(
                f"rates auto: measuring the rate of each family "
                f"({', '.join(study_families(space, model_config, budget, exp.final.baselines))}) on "
                f"search-dev, at most {allowance(exp.trials if planned is None else planned, exp.rates.share)} "
                f"runs ..."
            )
            return calibrate(exp, space, model_config, budget, printer, known, planned)

        record, _ = claims.once(
            study,
            lock,
            ATTR,
            measure,
            printer,
            "rates auto",
            exp.heartbeat_interval,
            exp.grace_period,
            keep=lambda stored: write_file(stored, path),
        )
    if not record.get("source"):  # measured here: the file is the study's record
        said = keep_file(record, path)
        if said:
            printer(said)
    for line in lines(record):
        printer(line)
    return record


__all__ = [
    "apply",
    "calibrate",
    "climb",
    "families_of",
    "space_families",
    "study_families",
    "known_results",
    "lines",
    "mode",
    "resolve",
    "read_file",
    "write_file",
    "allowance",
    "planned_runs",
    "ATTR",
    "SCALE",
    "SETTING",
    "FAMILY_PROBES",
]
