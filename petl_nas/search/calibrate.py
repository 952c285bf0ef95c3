"""`fidelity: auto`: measure how long a trial must train before its score ranks configurations.

Short trials measure "has it started learning" rather than quality: on SST-2 with MiniLM's
untrained pooler every method sat at the majority class after 3 epochs, and the order of
configurations changed again between 5 and 10 epochs. Before the search, a few presets that fit
the budget are trained at the final recipe's length (the reference) and then at growing lengths
(1, 2, 4, ... epochs), scored on search-dev like any trial. The chosen length is the shortest at
which every one of them is clear of the trivial baseline (beyond noise), which already tells apart,
the same way round, every pair of them the final length tells apart beyond noise (`ranks_as`), and
at which none of them still scores beyond noise below where it ends (`settled`); if no shorter
length does, the trials run at the final length. A length is tried only while it can repay what
calibration will have cost by then (`pays`): near the final length, trials save too little.

The last rule is what was learned from the v4 studies: a length at which a preset is still
climbing ranks learning rates by how fast they learn, not by where they end. On SST-2 the previous
rule (rank as at the *next* length) chose 2 epochs, where LoRA at its paper rate scored 70.8 and
fast-learning trials at 3x its rate 81; at 10 epochs the search's pick and LoRA tied. On STS-B the
4-epoch pick ended 1.2 points behind the preset. The rule before that ("the same order as the next
length") chose 1 epoch on SST-2 from an order decided by 0.1 points that then became 11 points.
What was tried, what it cost and what was chosen is stored on the study (``fidelity_calibration``)
and printed, with a line per run and, while a run trains, one at least every 30 s
(`progress.Stage`); a resumed study reuses it. Every run is kept whole (`known_results`): a preset
whose trial is a calibration run (same configuration, rate, seed and length: the length chosen)
is recorded from it instead of being trained a second time. ASHA's first rung is never earlier than the first length
at which calibration saw every preset learn.
"""

from __future__ import annotations

import dataclasses
import time

from ..core.budget import count_parameters
from ..core.presets import preset
from ..study.header import StudyHeader
from ..study.results import TrialResult
from ..study.storage import as_stored
from ..tasks.significance import clearly_better, did_not_learn
from . import claims
from .progress import Stage
from .specs import trial_recipe, trial_spec
from .study import CALIBRATION_ATTR, preset_in_space
from .worker import free_memory, run_trial

# Presets that calibrate a trial's length, in order of preference: the common anchors of three
# functional forms (low-rank, bottleneck, Kronecker) and the smallest, BitFit.
CALIBRATION_PRESETS = ("lora", "parallel_adapter", "compacter_pp", "pfeiffer", "bitfit")
ATTR = CALIBRATION_ATTR


def ladder(final_epochs: float) -> list[float]:
    """1, 2, 4, ... epochs, capped at (and ending with) the final recipe's length."""
    out, e = [], 1.0
    while e < final_epochs:
        out.append(e)
        e *= 2
    return out + [float(final_epochs)]


def calibration_presets(exp, model_config, budget: int | None, n: int = 3) -> list[str]:
    """Up to ``n`` presets that fit the budget: the experiment's own list first, then the anchors."""
    named = list(exp.presets) if isinstance(exp.presets, (list, tuple)) else []
    chosen = []
    for name in named + [p for p in CALIBRATION_PRESETS if p not in named]:
        try:
            count = count_parameters(model_config, preset(name, model_config)).deployable
        except Exception:  # noqa: BLE001 - not for this backbone
            continue
        if budget is None or count <= budget:
            chosen.append(name)
        if len(chosen) == n:
            break
    return chosen


def ranks_as(short: dict, long: dict) -> bool:
    """Does the shorter length already show the ranking the longer one shows? Every pair of presets
    that the longer length tells apart beyond noise must be told apart, the same way round, at the
    shorter one. (Pairs within noise at the longer length ask nothing; an order decided by a
    difference within noise is a coin flip, not a ranking.)"""
    a, b = short["scores"], long["scores"]
    for x in b:
        for y in b:
            if clearly_better(b[x]["score"], b[x]["se"], b[y]["score"], b[y]["se"]) and not clearly_better(
                a[x]["score"], a[x]["se"], a[y]["score"], a[y]["se"]
            ):
                return False
    return True


def settled(short: dict, long: dict) -> bool:
    """Has every preset stopped climbing by the shorter length? None may score beyond noise higher
    at the longer one: a length at which some still climb measures how fast they learn."""
    a, b = short["scores"], long["scores"]
    return not any(clearly_better(b[n]["score"], b[n]["se"], a[n]["score"], a[n]["se"]) for n in b)


def pays(cost: float, trials: int, final_epochs: float, epochs: float) -> bool:
    """Is a length worth calibrating? Only while what calibration will have cost with it (in
    preset-epochs, final-length runs included) is less than what ``trials`` trials at that length
    would save against the final length. Near the final length it cannot be."""
    return cost < trials * (final_epochs - epochs)


def calibrate(exp, baseline: dict | None, model_config, budget: int | None, printer) -> dict:
    """Train the calibration presets at the final length, then at growing lengths until one ranks
    and scores as the final length does; returns the record stored on the study."""
    from ..study.space import SearchSpace

    start = time.perf_counter()
    space = SearchSpace.load(exp.space)
    names = calibration_presets(exp, model_config, budget)
    *shorter, longest = ladder(exp.final.epochs)
    if not names:  # nothing to rank: the final length, and why
        printer(
            f"  calibration: no preset fits the budget{f' of {budget:,}' if budget is not None else ''}, so "
            f"nothing can show a shorter length ranks as the final one"
        )
        return {**_record([], [], longest, None, shorter, None, start), "no_presets": True}

    def measure(epochs: float) -> dict:
        return _at_length(exp, space, names, model_config, baseline, printer, epochs, longest)

    final = measure(longest)
    steps, chosen, skipped = [final], None, []
    spent = len(names) * longest  # preset-epochs trained so far
    if not final["all_learned"]:
        printer(
            "  calibration stops: not every preset learned at the final length, so no shorter length "
            "can rank them as it does"
        )
        skipped, shorter = shorter, []  # nothing shorter is tried
    for epochs in shorter:
        if not pays(spent + len(names) * epochs, exp.trials, longest, epochs):
            skipped = [e for e in shorter if e >= epochs]
            printer(
                f"  calibration stops before {epochs:g} epochs: with {exp.trials} trials it could save at "
                f"most {exp.trials * (longest - epochs):g} trial-epochs, less than calibrating it costs"
            )
            break
        spent += len(names) * epochs
        step = measure(epochs)
        steps.append(step)
        if step["all_learned"] and ranks_as(step, final) and settled(step, final):
            chosen = epochs
            break
    steps.sort(key=lambda s: s["epochs"])
    return _record(names, steps, longest, chosen, skipped, final["all_learned"], start)


def _record(names, steps: list[dict], longest: float, chosen, skipped, final_learned, start: float) -> dict:
    """The calibration record stored on the study: the presets, every length's step, the length
    chosen (``chosen``; None: the final one, ``longest``), the lengths skipped."""
    learned = [s["epochs"] for s in steps if s["all_learned"]]
    return {
        "presets": names,
        "steps": steps,
        "epochs": chosen or longest,
        "stable": chosen is not None,
        "rule": "final",
        "skipped": skipped,
        "final_learned": final_learned,
        "first_learned_epochs": learned[0] if learned else None,
        "cost_s": round(time.perf_counter() - start, 1),
    }


def _at_length(exp, space, names: list[str], model_config, baseline, printer, epochs: float, longest: float) -> dict:
    """Train each of ``names`` (as seeded) at ``epochs`` and score it once at the end: one step of
    the calibration record (scores, their order, whether all learned, each run kept whole)."""
    recipe = trial_recipe(exp).with_overrides(epochs=epochs, evals_per_epoch=0)  # one evaluation, at the end
    scores, results, stage = {}, {}, Stage(printer, len(names))
    for name in names:
        config, lr = preset_in_space(space, name, model_config, model_config.num_hidden_layers)  # as seeded
        spec = trial_spec(exp, config, recipe.with_overrides(lr=lr))
        with stage.run(f"calibration: {name} at {epochs:g} epochs"):
            r = run_trial(spec)
        scores[name] = {
            "score": r.score,
            "se": r.score_se,
            "learned": not did_not_learn(r.score, r.score_se, baseline),
        }
        result = {k: v for k, v in r.to_dict().items() if k != "history"}
        results[name] = as_stored({"spec": spec.to_dict(), "result": result})
        if len(names) > 1:
            printer(f"  calibration: {name} at {epochs:g} epochs: {r.score:.4f} ({stage.left()})")
    step = {
        "epochs": epochs,
        "scores": scores,
        "order": sorted(names, key=lambda n: -scores[n]["score"]),
        "all_learned": all(s["learned"] for s in scores.values()),
        "results": results,
    }
    printer(
        f"  calibration at {epochs:g} epochs{' (the final length)' if epochs == longest else ''}: "
        + ", ".join(f"{n} {s['score']:.4f}{'' if s['learned'] else ' (did not learn)'}" for n, s in scores.items())
    )
    return step


def known_results(record: dict | None) -> list[tuple[dict, TrialResult]]:
    """(trial spec, result) of every calibration run (of a study recorded before 2026-11-29: those
    at the final length): a trial with the same spec (a preset, at the length chosen) is recorded
    from it, not trained again, and marked ``reused: calibration``."""
    steps = (record or {}).get("steps", [])
    return [
        (r["spec"], TrialResult.from_dict({**r["result"], "reused": "calibration"}))
        for s in steps
        for r in s.get("results", {}).values()
    ]


def describe(record: dict) -> str:
    """One line: what calibration chose and why, and what it cost."""
    if record.get("rule") != "final":  # recorded by an older version: compared with the next length
        why = (
            "the presets cleared the baseline and ranked as at the next length"
            if record["stable"]
            else "no length up to the final recipe's gave a stable order of presets clear of the baseline"
        )
    elif record.get("no_presets"):
        why = "no preset fits the budget, so none could calibrate a shorter length"
    elif record["stable"]:
        why = "the presets cleared the baseline, ranked as at the final length and scored within noise of it"
    elif record.get("final_learned") is False:
        why = (
            "not every preset learned even at the final length, so no shorter length can rank them; "
            "more training rows (k), more epochs or other learning rates may be needed"
        )
    elif record.get("skipped"):
        shorter = [s["epochs"] for s in record["steps"]][:-1]  # the lengths tried before the final one
        skipped = ", ".join(f"{e:g}" for e in record["skipped"])
        why = (
            f"no shorter length ranked and scored as the final length did up to {max(shorter):g} epochs; "
            f"{skipped} could not repay calibrating them"
            if shorter
            else f"no shorter length was tried: {skipped} epochs could not repay calibrating them"
        )
    else:
        why = "no shorter length ranked and scored as the final length did"
    return (
        f"fidelity auto: {record['epochs']:g} epochs per trial, the final length ({why})"
        if record.get("no_presets")
        else f"fidelity auto: {record['epochs']:g} epochs per trial ({why}; "
        f"{', '.join(record['presets'])}; calibration took {record['cost_s'] / 60:.1f} min)"
    )


def resolve(study, exp, baseline: dict | None, model_config, budget: int | None, printer, lock=None):
    """The experiment with a numeric trial length: calibrated now by one worker of the study
    (`claims.once` under ``lock``, the study's `ClaimLock`; the others wait for its record), or as
    a resumed study recorded."""
    if exp.fidelity.epochs != "auto":
        return exp, None
    record = StudyHeader.of(study).fidelity_calibration
    if record is None:

        def measure() -> dict:
            names = calibration_presets(exp, model_config, budget)
            if names:
                printer(f"fidelity auto: calibrating the trial length on {', '.join(names)} ...")
            try:
                return calibrate(exp, baseline, model_config, budget, printer)
            finally:
                free_memory()  # the presets trained here: their GPU memory is the trials' again

        record, _ = claims.once(
            study, lock, ATTR, measure, printer, "fidelity auto", exp.heartbeat_interval, exp.grace_period
        )
    printer(describe(record))
    resolved = dataclasses.replace(exp, fidelity=dataclasses.replace(exp.fidelity, epochs=record["epochs"]))
    study.set_user_attr("fidelity", resolved.fidelity.__dict__)
    return resolved, record


__all__ = [
    "calibrate",
    "resolve",
    "known_results",
    "ladder",
    "calibration_presets",
    "describe",
    "settled",
    "ranks_as",
    "pays",
    "CALIBRATION_PRESETS",
]
