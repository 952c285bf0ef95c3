"""Opening a study's storage for browsing: a bad URL, a missing SQLite file or an unknown study
name is one clear `ConfigError`, and browsing never creates a database file as a side effect."""

from __future__ import annotations

from pathlib import Path

import optuna

from ..config import ConfigError
from ..storage import redact


def _check_url(url: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"storage {url!r} is not an SQLAlchemy URL (expected e.g. sqlite:///runs/NAME/study.db "
                          f"or postgresql+psycopg2://user:password@host/db)") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        if not Path(parsed.database).is_file():
            raise ConfigError(f"storage {url!r}: no such file {parsed.database!r} "
                              f"(sqlite:///relative/path.db, sqlite:////absolute/path.db)")


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """The RDB storage at ``url``, checked by listing its studies."""
    _check_url(url)
    try:
        storage = optuna.storages.RDBStorage(url)
        storage.get_all_studies()
    except Exception as e:                                      # noqa: BLE001 - any driver error
        raise ConfigError(f"storage {redact(url)!r} cannot be opened: {str(e).splitlines()[0]}") from None
    return storage


def load(url: str, study_name: str | None = None) -> optuna.Study:
    """The study ``study_name`` at ``url`` (the name may be left out when the storage holds one)."""
    from ..export import load_study

    _check_url(url)
    try:
        return load_study(url, study_name)
    except ConfigError as e:
        raise ConfigError(str(e).replace(url, redact(url))) from None


__all__ = ["open_storage", "load", "redact"]
