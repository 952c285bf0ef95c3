"""Opening a study's storage for browsing: a bad URL, a missing SQLite file or an unknown study
name is one clear `ConfigError` (a missing database driver named, with its pip command), and
browsing never creates a database file as a side effect."""

from __future__ import annotations

import optuna

from ..errors import ConfigError
from ..study.storage import check_existing, redact, with_installed_driver


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """The RDB storage at ``url``, checked by listing its studies."""
    check_existing(url)
    try:
        storage = optuna.storages.RDBStorage(with_installed_driver(url))  # a bare postgresql:// too
        storage.get_all_studies()
    except Exception as e:  # noqa: BLE001 - any driver error
        raise ConfigError(f"storage {redact(url)!r} cannot be opened: {str(e).splitlines()[0]}") from None
    return storage


def load(url: str, study_name: str | None = None) -> optuna.Study:
    """The study ``study_name`` at ``url`` (the name may be left out when the storage holds one)."""
    from ..study.records import load_study

    check_existing(url)
    try:
        return load_study(url, study_name)
    except ConfigError as e:
        raise ConfigError(str(e).replace(url, redact(url))) from None


__all__ = ["open_storage", "load", "redact"]
