"""Warm start: an earlier study's front as the first proposals of a new one.

``--warm-start URL[#STUDY]`` (``warm_start:`` in an experiment file) reads the front of an earlier
study (another task, another backbone) and enqueues each member as a point of the new space, before
the sampler proposes anything: the new study starts from configurations that were good elsewhere,
and the sampler learns from them as from any trial. Each member is re-counted on the new backbone
and dropped, with the reason said, when it no longer fits: layers the backbone lacks, over the new
budget, or not a point of the new space. Numbers outside a range are clamped as for presets (the
nearest point, named). Warm-started trials count toward ``trials``; what was taken and dropped is
stored in the study (user attribute ``warm_start``, its source with the password hidden: the
dashboard serves it), and a resumed study does not take them twice.

Example:
    petl-nas search --experiment experiments/cola_minilm/v4/experiment.yaml \\
        --warm-start sqlite:///runs/sst2_minilm_v4/study.db#sst2_minilm_v4
"""

from __future__ import annotations

import dataclasses

from optuna.trial import FrozenTrial

from ..core.budget import count_parameters
from ..core.config import PetlConfig
from ..errors import ConfigError
from ..study.fronts import learned_trials, pareto
from ..study.header import StudyHeader
from ..study.records import StoredTrial
from ..study.storage import redact


def parse_source(source: str) -> tuple[str, str | None]:
    """``URL[#STUDY]`` -> (storage URL, study name or None)."""
    url, _, name = source.partition("#")
    if not url:
        raise ConfigError(f"warm start {shown(source)!r}: expected a storage URL, optionally #STUDY")
    return url, name or None


def shown(source: str) -> str:
    """``URL[#STUDY]`` with the URL's password hidden: what is printed and stored."""
    url, hash_, name = source.partition("#")
    return redact(url) + hash_ + name


def front_of(source: str) -> tuple[str, list[FrozenTrial]]:
    """The earlier study's name and its front: complete trials that learned, not dominated."""
    from ..study.records import load_study

    url, name = parse_source(source)
    try:
        study = load_study(url, name, naming=redact(url).replace("{", "{{").replace("}", "}}") + "#{}")
    except ConfigError as e:  # said as the warm start's, not as --storage's
        raise ConfigError(f"warm start: {e}") from None
    return study.study_name, pareto(learned_trials(study))


def _fits(config: PetlConfig, n_layers: int) -> str | None:
    for m in config.modules:
        beyond = [i for i in (m.layers or ()) if i >= n_layers]
        if beyond:
            return f"layers {', '.join(map(str, beyond))} beyond the backbone's {n_layers}"
    return None


def seed_warm_start(
    study,
    source: str,
    space,
    model_config,
    budget: int | None,
    n_layers: int,
    storage_url: str,
    scale: float | None = None,
) -> list[str]:
    """Enqueue the earlier front's members this study lacks; returns the lines to print. Their
    structure is taken; their rates per family are not (the space has no such dimension): in a
    study whose families train at measured rates they train at this study's (``scale``: 1)."""
    url, _ = parse_source(source)
    name, members = front_of(source)
    if url == storage_url and name == study.study_name:
        raise ConfigError(f"warm start {shown(source)!r}: that is this study; name an earlier one")
    done = (StudyHeader.of(study).warm_start or {}).get("source")
    if done is not None and shown(done) == shown(source):  # older studies stored the URL as given
        return []  # done when the study began; a resume takes nothing twice
    have = {StoredTrial.of(t).warm_start for t in study.get_trials(deepcopy=False)}
    taken, dropped = [], []
    for t in map(StoredTrial.of, members):
        tag = f"{name} trial {t.number}"
        if tag in have:
            continue
        config = dataclasses.replace(space.with_head(t.config(resolved=False)), lr_mults=())
        lr = scale if scale is not None else t.lr if t.lr is not None else t.params.get("lr")
        why = _fits(config, n_layers)
        if why is None:
            try:
                n = count_parameters(model_config, config).deployable
            except ConfigError as e:  # a form this backbone refuses
                why = f"this backbone cannot take it: {e}"
            else:
                why = (
                    f"{n:,} deployable parameters on this backbone, over the budget of {budget:,}"
                    if budget is not None and n > budget
                    else None
                )
        near = space.nearest_point(config, lr, n_layers) if why is None and lr is not None else None
        if why is None and near is None:
            why = space.why_not(config) if lr is not None else "it has no learning rate on record"
        if why is not None:
            dropped.append(f"trial {t.number} ({why})")
            continue
        params, changes = near
        study.enqueue_trial(
            params,
            user_attrs={"warm_start": tag, **({"mapped": "; ".join(changes)} if changes else {})},
            skip_if_exists=False,
        )
        taken.append(f"trial {t.number}" + (f" (nearest point: {', '.join(changes)})" if changes else ""))
    study.set_user_attr("warm_start", {"source": shown(source), "taken": taken, "dropped": dropped})
    lines = []
    if not members:
        lines.append(
            f"warm start from {name!r}: none of its trials learned (complete and beyond noise of its trivial "
            f"baseline), so it has no front to queue"
        )
    if taken or dropped:
        lines.append(
            f"warm start from {name!r}: {len(taken)} of {len(members)} front members queued first"
            + (f": {', '.join(taken)}" if taken else "")
        )
    if dropped:
        lines.append(f"warm start: dropped {', '.join(dropped)}")
    return lines


__all__ = ["parse_source", "shown", "front_of", "seed_warm_start"]
