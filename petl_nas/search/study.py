"""The Optuna study: the source of truth for a search.

Owns the study's creation and attributes, the sampler choice, seeding presets, and the
`TrialSource` that turns the sampler's proposals into trainable trials, and what counts as a
trained trial (the stopping rule) and why a trial failed. A proposal over the budget
is never trained: it is counted on the meta device (milliseconds), recorded as PRUNED with
``rejected = "over_budget"``, ``over_budget = true`` (the column the Optuna dashboard shows beside
its "Pruned" state), its counts and a violated ``budget`` constraint (so TPE and NSGA-II learn to
avoid the region), and the next proposal is drawn. It stays PRUNED, not FAIL: TPE reads pruned
trials (these as infeasible, by that constraint) and skips failed ones, so FAIL would change what
is sampled. Every trained trial carries its
counts, its PetlConfig and its recipe as user attributes; the objectives are (task metric: max,
deployable parameters: min).

Several workers may share a study: `TrialSource` claims each trial under the study's `ClaimLock`
(storage.py), counting trained and running trials first, so the study holds exactly ``target``
trained trials however many workers fill it; each running trial has a heartbeat, and trials whose
worker died are failed (and retried) by whichever worker notices first.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, Trial, TrialState

from ..core.budget import count_parameters, refusal
from ..core.canonical import canonical
from ..core.config import PetlConfig
from ..core.describe import describe_config
from ..core.family_rates import at_rates as apply_rates
from ..core.forms import form_named
from ..core.presets import check_preset_names, preset, preset_lr, preset_names
from ..errors import ConfigError, suggest
from ..study.records import (
    INTERRUPTED,
    INVALID,
    LR_FROM_SAMPLER,
    StoredTrial,
    failure_counts,
    failure_kind,
    state_counts,
)
from ..study.space import SearchSpace
from ..study.storage import LOST, ClaimLock, Heartbeat, close_storage, fail_stale, open_storage, redact
from ..tasks.files import FILE_KEYS
from ..training.costs import directions, metric_names

# `group=True` and `set_metric_names` are marked experimental; we rely on them knowingly.
warnings.filterwarnings("ignore", category=ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.WARNING)
MAX_CONSECUTIVE_REJECTIONS = 500


# Optuna's samplers by name: (seed, startup trials) -> sampler. TPE is multivariate and grouped
# (conditional spaces) and lies about running trials (constant liar) so parallel workers spread out;
# ``presets`` trains the presets alone (its draws are never asked for).
SAMPLERS: dict[str, Callable[[int, int], optuna.samplers.BaseSampler]] = {
    "tpe": lambda seed, startup: optuna.samplers.TPESampler(
        multivariate=True, group=True, constant_liar=True, seed=seed, n_startup_trials=startup
    ),
    "nsga2": lambda seed, startup: optuna.samplers.NSGAIISampler(seed=seed),
    "random": lambda seed, startup: optuna.samplers.RandomSampler(seed=seed),
    "gp": lambda seed, startup: optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup),
    "presets": lambda seed, startup: optuna.samplers.RandomSampler(seed=seed),
}


def make_sampler(name: str, seed: int, n_startup_trials: int = 10) -> optuna.samplers.BaseSampler:
    """The sampler named ``name`` (`SAMPLERS`); one line naming the accepted ones if unknown."""
    if name not in SAMPLERS:
        raise ConfigError(f"sampler: unknown name {name!r}{suggest(name, SAMPLERS)}")
    return SAMPLERS[name](seed, n_startup_trials)


def seeded_sampler(name: str, seed: int, n_startup_trials: int = 10) -> Callable[[int], optuna.samplers.BaseSampler]:
    """``n`` -> the sampler ``name`` seeded with ``seed`` + n: a fresh study draws what it always
    drew, and a draw made when the study holds n trials (whichever process makes it) never repeats
    another's random stream. The samplers keep their state in the study, not the object."""
    return lambda n: make_sampler(name, seed + n, n_startup_trials)


# What a trained trial's score and count mean: a study resumed with another value of any of these
# would mix trials measured two ways (and another budget would hide trained front members).
# The sampler, the strategy, `final:` and how trials execute (compile, CUDA graphs, the frozen
# cache, evaluations per epoch) may change on resume.
SCORE_ATTRS = ("task", "metric", "backbone", "budget", "data_seed")  # metric: MRPC ranked by f1 before
CALIBRATION_ATTR = "fidelity_calibration"  # the study attribute `calibrate` records its choice in
SCORE_FIDELITY = (
    "k",
    "epochs",
    "batch_size",
    "max_length",
    "length_buckets",
    "precision",
    "search_dev",
    "max_steps",
    "eval_rows",
    "score",
)


def changed_settings(stored: dict, attrs: dict) -> list[str]:
    """'name stored (now new)' for each setting of `SCORE_ATTRS` and `SCORE_FIDELITY`, and each key
    of a file task's mapping (its files, metrics, decoding), that a resumed study's ``attrs`` change
    (settings a study made by an older version did not store are skipped; ``epochs: auto`` matches
    the length its calibration chose and stored)."""
    changed = [
        f"{k} {stored[k]} (now {attrs[k]})" for k in SCORE_ATTRS if k in stored and k in attrs and stored[k] != attrs[k]
    ]
    was, now = stored.get("task_spec"), attrs.get("task_spec")  # a file task: its files, metric, decoding
    if isinstance(was, dict) and isinstance(now, dict) and not changed:
        changed += [
            f"task.{k} {was.get(k)} (now {now.get(k)})"
            for k in sorted({*was, *now}, key=str)
            if was.get(k) != now.get(k) and not _same_file(stored, attrs, k)
        ]
        changed += [
            f"task.{k} {now[k]} (its contents changed since)"
            for k in FILE_KEYS
            if was.get(k) == now.get(k) and _contents(stored, k) not in (None, _contents(attrs, k))
        ]
    old, new = stored.get("fidelity") or {}, attrs.get("fidelity") or {}
    return changed + [
        f"fidelity.{k} {old[k]} (now {new[k]})"
        for k in SCORE_FIDELITY
        if k in old and k in new and old[k] != new[k] and not (k == "epochs" and _same_length(stored, old[k], new[k]))
    ]


def _contents(attrs: dict, key: str) -> str | None:
    """The fingerprint a study's ``attrs`` hold of its file task's ``key`` file (None before
    studies stored them)."""
    return (attrs.get("task_files") or {}).get(key)


def _same_file(stored: dict, attrs: dict, key: str) -> bool:
    """A file task's ``key`` file at another path with the same contents (its folder moved)."""
    return key in FILE_KEYS and _contents(stored, key) is not None and _contents(stored, key) == _contents(attrs, key)


def with_fidelity_resolved(attrs: dict, stored: dict | None) -> dict:
    """``attrs`` with the new studies' defaults made concrete: ``fidelity.length_buckets: auto``
    a number and ``fidelity.precision: auto`` a precision: what the study recorded when it exists
    (``stored``; from before these defaults: 0 buckets and precision ``auto``, bf16 on a GPU only),
    else `NEW_STUDY_LENGTH_BUCKETS` and `NEW_STUDY_PRECISION`: a resumed study keeps its trials'
    recipe."""
    from ..study.experiment import NEW_STUDY_LENGTH_BUCKETS, NEW_STUDY_PRECISION

    fidelity = dict(attrs.get("fidelity") or {})
    if fidelity.get("length_buckets") == "auto":
        value = NEW_STUDY_LENGTH_BUCKETS if stored is None else stored.get("length_buckets", 0)
        fidelity["length_buckets"] = 0 if value == "auto" else value
    if fidelity.get("precision") == "auto" and stored is None:
        fidelity["precision"] = NEW_STUDY_PRECISION
    elif fidelity.get("precision") == "auto":
        fidelity["precision"] = stored.get("precision", "auto")
    return {**attrs, "fidelity": fidelity} if fidelity != (attrs.get("fidelity") or {}) else attrs


def _same_length(stored: dict, old, new) -> bool:
    """``epochs: auto`` against a number: the same length when the study calibrated it (then the
    number stored is its choice), or when it has not calibrated yet; a study of a fixed length
    resumed with ``auto`` would calibrate and train its next trials at another length."""
    if new == "auto":
        return old == "auto" or stored.get(CALIBRATION_ATTR) is not None
    return old == "auto"


def open_study(
    storage_url: str,
    name: str,
    sampler,
    metric: str,
    attrs: dict,
    force_new: bool = False,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    retries: int = 0,
    objectives=("score", "params"),
) -> optuna.Study:
    """Create or resume the study; refuse one whose stored space hash, objectives or scoring
    settings (`changed_settings`) differ (nothing is written then), or replace it with
    ``force_new``. The heartbeat settings are those of `open_storage`."""
    storage = open_storage(storage_url, heartbeat_interval, grace_period, retries)
    try:
        with ClaimLock(storage, name)():  # one worker at a time checks, replaces or creates it
            existing = {s.study_name for s in storage.get_all_studies()}
            old = optuna.load_study(study_name=name, storage=storage) if name in existing else None
            requested, recorded = attrs, old.user_attrs if old is not None else {}  # read once
            attrs = with_fidelity_resolved(attrs, recorded.get("fidelity") or {} if old is not None else None)
            replaced = False
            if old is not None:
                stored = recorded.get("space_hash")
                if stored and stored != attrs["space_hash"]:
                    if not force_new:
                        was, now = recorded.get("space_name"), attrs.get("space_name")
                        names = (
                            f"{was!r}, now {now!r}" if was and now and was != now else f"{was or now!r}, edited since"
                        )  # the same name: its file changed
                        raise ConfigError(
                            f"study {name!r} in {redact(storage_url)} was made with another space "
                            f"({names}; hash {stored}, now {attrs['space_hash']}); use a new --study "
                            f"name or --force-new-study to replace it"
                        )
                    replaced = True
                elif changed := changed_settings(recorded, attrs):
                    if not force_new:
                        raise ConfigError(
                            f"study {name!r} in {redact(storage_url)} was made with other settings: "
                            f"{', '.join(changed)}; use a new --study name or --force-new-study "
                            f"to replace it"
                        )
                    replaced = True
                elif (had := recorded.get("objectives", ["score", "params"])) != list(objectives) or len(
                    old.directions
                ) != len(objectives):  # the values stored are of the old ones
                    if not force_new:
                        raise ConfigError(
                            f"study {name!r} in {redact(storage_url)} has objectives [{', '.join(had)}], "
                            f"not [{', '.join(objectives)}]; use a new --study name or "
                            f"--force-new-study to replace it"
                        )
                    replaced = True
            if replaced:  # --force-new-study: a new study, with new defaults
                optuna.delete_study(study_name=name, storage=storage)
                attrs = with_fidelity_resolved(requested, None)
            study = optuna.create_study(
                study_name=name,
                storage=storage,
                sampler=sampler,
                directions=directions(objectives),
                load_if_exists=True,
            )
            have = study.user_attrs  # written under the lock: a worker starting beside this one
            for k, v in {**attrs, "objectives": list(objectives)}.items():  # reads them whole
                if have.get(k, ()) != v:
                    study.set_user_attr(k, v)
    except ConfigError:
        close_storage(storage)
        raise
    if study.metric_names != metric_names(objectives, metric):
        study.set_metric_names(metric_names(objectives, metric))
    return study


@dataclass
class Proposal:
    """A trial ready to train: its config, recipe overrides and counts."""

    trial: Trial
    config: PetlConfig
    lr: float
    deployable: int
    trainable: int
    preset: str | None = None

    @property
    def number(self) -> int:
        return self.trial.number


class TrialSource:
    """Draws proposals from the study, rejecting those over budget before any training.

    With a ``target``, `next` returns None once the study holds that many trained or running
    trials (all workers together). ``lock`` (a `ClaimLock`) makes count-then-claim atomic across
    workers; ``heartbeat`` keeps this process's claimed trials alive until `release`.
    ``sampler_for(n)`` (`seeded_sampler`) gives the sampler each draw uses, n being the number of
    trials the study holds: one seeded sampler for the whole process would repeat its first draws
    in every process, so a resumed study, or a second worker, trained the first trials' proposals
    again. ``head_trains`` False (a generation task: the LM head stays frozen) makes a draw with
    no PETL parameter an invalid configuration, as it would train nothing. ``on_invalid(number,
    reason)`` hears of each draw recorded as an invalid configuration (a form the backbone refuses).
    ``rates`` (measured per family) make a draw's rate a multiplier of them; ``scales`` (the scales
    they were measured at) put every module whose scale is only a rate at its family's
    (`petl_nas.core.family_rates.at_reference_scales`), before it is counted and stored.
    """

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        model_config,
        budget: int | None,
        n_layers: int,
        flat: bool = False,
        target: int | None = None,
        lock=None,
        heartbeat: Heartbeat | None = None,
        sampler_for: Callable[[int], optuna.samplers.BaseSampler] | None = None,
        head_trains: bool = True,
        on_invalid: Callable[[int, str], None] | None = None,
        rates: dict[str, float] | None = None,
        scales: dict[str, float] | None = None,
    ):
        self.study, self.space, self.model_config = study, space, model_config
        self.budget, self.n_layers, self.flat = budget, n_layers, flat
        self.target, self.lock, self.heartbeat = target, lock or contextlib.nullcontext, heartbeat
        self.sampler_for, self.head_trains, self.on_invalid = sampler_for, head_trains, on_invalid
        self.rates, self.scales = rates, scales
        self.backbone = count_parameters(model_config, PetlConfig()).backbone
        self.rejected = 0

    def next(self) -> Proposal | None:
        with self.lock():
            fail_stale(self.study)
            if self.target is not None and claimed(self.study) >= self.target:
                return None
            return self._draw()

    def release(self, p: Proposal) -> None:
        """The proposal's outcome is recorded: stop its heartbeat."""
        if self.heartbeat is not None:
            self.heartbeat.discard(p.trial._trial_id)

    def _draw(self) -> Proposal:
        for _ in range(MAX_CONSECUTIVE_REJECTIONS):
            if self.sampler_for is not None:  # seeded by the number the next trial gets (`seeded_sampler`)
                self.study.sampler = self.sampler_for(len(self.study.get_trials(deepcopy=False)))
            with warnings.catch_warnings():  # "heartbeat is supposed to be used with optimize":
                warnings.simplefilter("ignore")  # we beat for ask/tell trials ourselves (`Heartbeat`)
                trial = self.study.ask()
            if self.heartbeat is not None:
                self.heartbeat.add(trial._trial_id)
            proposal = self._decide(trial)
            if proposal is not None:
                return proposal
            if self.heartbeat is not None:
                self.heartbeat.discard(trial._trial_id)
        raise ConfigError(
            f"{MAX_CONSECUTIVE_REJECTIONS} proposals in a row were over the budget "
            f"({self.budget:,}); the space is mostly infeasible for it: raise the "
            f"budget, narrow the space, or use strategy: oneshot (its supernet proposes "
            f"configurations at the budget)"
        )

    def _decide(self, trial: Trial) -> Proposal | None:
        """A proposal for ``trial``, or None once it is recorded as invalid or over the budget."""
        queued = StoredTrial.of(trial)
        scale, drawn = None, False
        try:
            if queued.given_whole:  # an off-space preset, a one-shot proposal, or the retry
                config = queued.config(resolved=False)  # of a trial whose worker died once decided
                lr = float(queued.lr)
            elif queued.petl_config is not None and (queued.lr_from_sampler or queued.lr_scale is not None):
                config = queued.config(resolved=False)  # given whole, its rate the sampler's or set
                scale = lr = self.space.sample_lr(trial) if queued.lr_scale is None else float(queued.lr_scale)
            else:
                config, recipe = self.space.sample(trial, self.n_layers, flat=self.flat)
                scale = lr = recipe["lr"]
                drawn = True
            if self.rates is not None and scale is not None:  # lr is a multiplier of the measured rates
                config, lr = apply_rates(self.rates, config, scale, self.scales)
            else:
                scale = None
            if drawn:  # two LoRAs on one sublayer (at one scale, after the
                config = canonical(config)  # rates'): one LoRA of their summed rank
            count = count_parameters(self.model_config, config)
            if count.trainable == 0 and not self.head_trains:  # no module on a generation model
                raise ConfigError("nothing to train: no PETL module, and the task's head (the LM head) stays frozen")
        except ConfigError as e:
            trial.set_user_attr("fail_reason", f"invalid configuration: {e}")
            trial.set_user_attr("fail_kind", INVALID)
            self.study.tell(trial, state=TrialState.FAIL)
            if self.on_invalid is not None:
                self.on_invalid(trial.number, str(e))
            return None
        trial.set_user_attr("deployable", count.deployable)
        trial.set_user_attr("trainable", count.trainable)
        trial.set_user_attr("pct_of_backbone", round(count.deployable_pct, 4))
        trial.set_user_attr(
            "recipe", {"lr": lr, **({"lr_scale": scale} if scale is not None else {})}
        )  # before petl_config: a retry of a trial killed
        trial.set_user_attr("config_text", describe_config(config))  # between the two writes is drawn
        trial.set_user_attr("petl_config", config.to_dict())  # again from its parameters
        if self.budget is not None:
            with warnings.catch_warnings():  # a retry carries its first try's value (the same)
                warnings.simplefilter("ignore")
                trial.set_constraint("budget", float(count.deployable - self.budget))
            if count.deployable > self.budget:
                trial.set_user_attr("rejected", "over_budget")
                trial.set_user_attr("over_budget", True)  # the dashboard's column: PRUNED means this here
                self.study.tell(trial, state=TrialState.PRUNED)
                self.rejected += 1
                return None
        return Proposal(trial, config, lr, count.deployable, count.trainable, queued.preset)


def smallest_count(space: SearchSpace, model_config, n_layers: int) -> int:
    """The fewest deployable parameters any configuration of the space can have (0 when every slot
    may be empty: the head alone)."""
    total = sum(
        _smallest_form(space, slot, model_config, n_layers)
        for slot in space.slots
        if "none" not in (slot.forms.choices or (slot.forms.value,))
    )
    if space.globals["bitfit"].kind == "fixed" and space.globals["bitfit"].value:
        total += count_parameters(model_config, PetlConfig(bitfit=True)).deployable
    return total


def smallest_module(space: SearchSpace, model_config, n_layers: int) -> int | None:
    """The fewest deployable parameters of a configuration of the space that trains anything
    beside the head (one module, BitFit, the LayerNorms or a prompt); None if it has none."""
    counts = [_smallest_form(space, slot, model_config, n_layers, skip_none=True) for slot in space.slots]
    for name, config in (("bitfit", PetlConfig(bitfit=True)), ("train_layernorms", PetlConfig(train_layernorms=True))):
        if _can_be(space.globals[name], True):
            counts.append(_deployable(model_config, config))
    prompt = space.globals["prompt_length"]
    lengths = [n for n in (prompt.choices or (prompt.value,)) if n]
    if lengths:
        counts.append(count_parameters(model_config, PetlConfig(prompt_length=min(lengths))).deployable)
    counts = [n for n in counts if n]  # None: a form this backbone refuses
    return min(counts) if counts else None


def _can_be(dim, value) -> bool:
    return dim.value == value if dim.kind == "fixed" else value in dim.choices


def _smallest_form(space: SearchSpace, slot, model_config, n_layers: int, skip_none: bool = False) -> int:
    """The fewest deployable parameters of ``slot`` over the forms the backbone takes (`none` left
    out with ``skip_none``; 0 if nothing is left), each at its dimensions' smallest values."""
    layer_choices = space.globals["layers"].choices or (space.globals["layers"].value,)
    few_layers = (n_layers - 1,) if set(layer_choices) & {"top", "mask"} else None
    best = None
    for form in slot.forms.choices or (slot.forms.value,):
        if skip_none and form == "none":
            continue
        config = PetlConfig(modules=(space.module_spec(slot, form, _smallest_values(slot, form), False, few_layers),))
        n = _deployable(model_config, config)
        if n is not None:  # None: a form this backbone refuses, never drawn validly
            best = n if best is None else min(best, n)
    return best or 0


def _deployable(model_config, config: PetlConfig) -> int | None:
    """The deployable count of ``config``, or None where the backbone refuses it (one count, not two)."""
    try:
        return count_parameters(model_config, config).deployable
    except ConfigError:
        return None


def _smallest_values(slot, form: str) -> dict:
    """The value of each of ``form``'s dimensions at ``slot``: fixed, the low end of a range, or the
    first choice."""
    from ..study.space import form_dimensions

    vals = {}
    for d in form_dimensions(form):
        dim = slot.dims.get(d)
        if dim is not None:
            vals[d] = dim.value if dim.kind == "fixed" else dim.low if dim.kind in ("int", "float") else dim.choices[0]
    if vals.get("composition") == "scaled" or vals.get("prefix_composition") == "scaled":
        vals.setdefault("scale", 1.0)
    return vals


def unit_costs(space: SearchSpace, model_config) -> list[str]:
    """What one unit of each slot's size dimension costs on this backbone, per form: deployable
    parameters on one layer and on every layer (the difference between two sizes, the form's other
    dimensions at their smallest values, in every block where ``blocks`` may be ``all``), so that a
    range reads as parameters; a form the backbone refuses says so instead."""
    lines = [f"{'slot':<12}{'form':<12}{'one unit of':<14}{'per layer':>12}{'all layers':>14}"]
    for slot in space.slots:
        blocks = slot.dims.get("blocks")
        for form in (f for f in slot.forms.choices or (slot.forms.value,) if f != "none"):
            size, vals = form_named(form).size_dimension, _smallest_values(slot, form)
            if size is None:  # a form of one fixed size
                lines.append(f"{slot.name:<12}{form:<12}{'-':<14}  no size dimension")
                continue
            if blocks is not None and "all" in (blocks.choices or ()):  # in every attention kind, not
                vals["blocks"] = "all"  # the first choice's (cross)
            step = form_named(form).size_step(vals)  # PHM sizes are multiples of n
            low = -(-int(vals[size]) // step) * step

            def count(n: int, layers) -> int:
                spec = space.module_spec(slot, form, {**vals, size: n}, False, layers)
                return count_parameters(model_config, PetlConfig(modules=(spec,))).deployable

            if why := refusal(model_config, PetlConfig(modules=(space.module_spec(slot, form, vals, False, None),))):
                lines.append(f"{slot.name:<12}{form:<12}{size:<14}  not for this backbone: {why}")
                continue
            one = (count(low + step, (0,)) - count(low, (0,))) / step
            every = (count(low + step, None) - count(low, None)) / step
            lines.append(f"{slot.name:<12}{form:<12}{size:<14}{one:>12,.0f}{every:>14,.0f}")
    return lines


def seed_presets(
    study: optuna.Study,
    space: SearchSpace,
    names,
    model_config,
    budget: int | None,
    n_layers: int,
    over_budget: list[str] | None = None,
    refused: list[str] | None = None,
    scale: float | None = None,
) -> list[str]:
    """Enqueue the presets that fit the budget and are not in the study yet, each as a point of the
    space so the sampler learns from it; returns what was queued, with how each was placed.

    A preset that is a point of the space is queued as it is. One whose sizes or learning rate lie
    outside the space's ranges is queued at its nearest point (clamped), marked ``mapped``. One the
    space cannot hold at all (a form or choice it lacks) is skipped under ``presets: auto``; named
    explicitly, it is trained off the space (its configuration given whole, marked ``off_space``),
    which the sampler cannot learn from. A preset named explicitly that is over the budget is added
    to ``over_budget`` as "name (count)", and one the backbone cannot take (BitFit without biases, a
    prefix on DeBERTa) to ``refused`` as "name (reason)", so the search can say why it did not train it.
    In a study whose families train at measured rates (``scale``: the ``lr_scale`` they train at, 1),
    a preset takes its families' measured rates, not its paper's.
    """
    seen = {StoredTrial.of(t).preset for t in study.get_trials(deepcopy=False)}
    explicit = names not in ("auto", None)
    fitting, over, refusals = presets_within(names, space, model_config, budget)
    if explicit and over_budget is not None:
        over_budget += [f"{name} ({count:,})" for name, count in over if name not in seen]
    if explicit and refused is not None:
        refused += [f"{name} ({why})" for name, why in refusals if name not in seen]
    queued = []
    for name, config in fitting:
        if name in seen:
            continue
        lr = preset_lr(name) if scale is None else scale
        near = space.nearest_point(config, lr, n_layers)
        if near is not None:
            params, changes = near
            attrs = {"preset": name, **({"mapped": "; ".join(changes)} if changes else {})}
            study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=False)
            queued.append(name + (f" (nearest point: {', '.join(changes)})" if changes else ""))
        elif explicit:
            why = space.why_not(config)
            study.enqueue_trial(
                {},
                user_attrs={
                    "preset": name,
                    "petl_config": config.to_dict(),
                    "recipe": {"lr" if scale is None else "lr_scale": lr},
                    "off_space": why,
                },
            )
            queued.append(f"{name} (off the space: {why})")
    return queued


def presets_within(
    names, space: SearchSpace, model_config, budget: int | None
) -> tuple[list[tuple[str, PetlConfig]], list[tuple[str, int]], list[tuple[str, str]]]:
    """The presets ``names`` says (``auto``: all; ``none``: none) that fit ``budget``, each with its
    configuration as a study trains it (the space's head); those over it, with their deployable
    counts; and those the backbone cannot take, with the reason."""
    check_preset_names(names)
    if names == "none":
        return [], [], []
    fitting, over, refused = [], [], []
    for name in preset_names() if names in ("auto", None) else names:
        config = space.with_head(preset(name, model_config))  # the head the searched trials get
        try:
            count = count_parameters(model_config, config)
        except ConfigError as e:  # a form this backbone refuses
            refused.append((name, str(e)))
            continue
        if budget is not None and count.deployable > budget:
            over.append((name, count.deployable))
        else:
            fitting.append((name, config))
    return fitting, over, refused


def preset_in_space(
    space: SearchSpace, name: str, model_config, n_layers: int, lr: float | None = None
) -> tuple[PetlConfig, float]:
    """Preset ``name`` as a study trains it in ``space``: with the space's head, at the space's nearest
    point when it has one (else as the preset is), and the learning rate that goes with it (``lr``,
    else its paper's; in a calibrated study the ``lr_scale``)."""
    config, lr = space.with_head(preset(name, model_config)), preset_lr(name) if lr is None else lr
    near = space.nearest_point(config, lr, n_layers)
    if near is None:
        return config, lr
    config, recipe = space.sample(optuna.trial.FixedTrial(near[0]), n_layers)
    return config, recipe["lr"]


def front(study: optuna.Study) -> list[FrozenTrial]:
    """The Pareto front: COMPLETE, within-budget trials, by deployable parameters."""
    return sorted(study.best_trials, key=lambda t: t.values[1])


def is_trained(t: FrozenTrial) -> bool:
    """Did this trial count toward the study's ``trials``? Trained to the end, stopped early, or
    failed while training; not: over budget (never trained), an invalid configuration, or lost with
    its worker or interrupted (the retry takes its place)."""
    if t.state == TrialState.COMPLETE:
        return True
    if t.state == TrialState.PRUNED:
        return not StoredTrial.of(t).rejected
    if t.state == TrialState.FAIL:
        return failure_kind(t) not in (LOST, INTERRUPTED, INVALID)
    return False


def claimed(study: optuna.Study) -> int:
    """Trained trials plus running ones (of every worker): what the stopping rule counts."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING or is_trained(t))


__all__ = [
    "LR_FROM_SAMPLER",
    "make_sampler",
    "seeded_sampler",
    "open_study",
    "TrialSource",
    "Proposal",
    "seed_presets",
    "presets_within",
    "preset_in_space",
    "front",
    "state_counts",
    "smallest_count",
    "smallest_module",
    "changed_settings",
    "is_trained",
    "claimed",
    "failure_kind",
    "failure_counts",
    "SAMPLERS",
    "LOST",
    "INTERRUPTED",
    "INVALID",
]
