"""Reading a study as a search wrote it: finding it in its storage by name, and a trial's
configuration as it trained. Search-time code (warm start, retiming, the dashboards) and export
read studies through here.

Example:
    >>> study = load_study("sqlite:///runs/smoke/study.db")              # doctest: +SKIP
    >>> trial_config(study.best_trials[0])["modules"]                     # doctest: +SKIP
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

from ..errors import ConfigError
from .storage import check_existing, redact, with_installed_driver
from .study import KNOB_STUDY_SUFFIX


def load_study(storage_url: str, study_name: str | None = None, naming: str = "--study {}") -> optuna.Study:
    """The study at ``storage_url``; the name may be left out when the storage holds exactly one
    search (a search's study of supernet runs, ``<name>:oneshot-knobs``, does not count). ``naming``:
    how the caller's user names a study, for the errors (``--study NAME``, or ``URL#NAME``)."""
    check_existing(storage_url)
    try:
        storage = optuna.storages.RDBStorage(with_installed_driver(storage_url))
        names = [s.study_name for s in storage.get_all_studies()]
    except Exception as e:                                      # noqa: BLE001 - any driver error
        raise ConfigError(f"storage {redact(storage_url)!r} cannot be opened: {str(e).splitlines()[0]}") from None
    if study_name is None:
        searches = [n for n in names if not n.endswith(KNOB_STUDY_SUFFIX)]
        if len(searches) != 1:
            raise ConfigError(f"storage {redact(storage_url)!r} holds {len(searches)} studies "
                              f"({', '.join(searches) or 'none'}); name one with {naming.format('NAME')}")
        study_name = searches[0]
    if study_name not in names:
        raise ConfigError(f"study {study_name!r} is not in {redact(storage_url)} (studies: {', '.join(names) or 'none'})")
    if study_name.endswith(KNOB_STUDY_SUFFIX):      # one value per supernet run: no front, no configurations
        search = study_name[:-len(KNOB_STUDY_SUFFIX)]
        raise ConfigError(f"study {study_name!r} holds the supernet runs of {search!r}'s knob search, not its "
                          f"trials; use {naming.format(search)}")
    return optuna.load_study(study_name=study_name, storage=storage)


def trial_config(trial: FrozenTrial) -> dict:
    """The trial's PetlConfig as a dict, with the pooling ``auto`` chose on the study's backbone
    written out."""
    config = dict(trial.user_attrs["petl_config"])
    if config.get("pooling", "auto") == "auto" and trial.user_attrs.get("pooling") not in (None, "native"):
        config["pooling"] = trial.user_attrs["pooling"]
    return config


__all__ = ["load_study", "trial_config"]
