"""What ``--storage`` (and an experiment file's ``storage:``) may say, turned into the SQLAlchemy URL
that opens it: a URL as it is (``sqlite:///runs/x/study.db``, ``postgresql+psycopg2://...``), a SQLite
file's path ending in .db, .sqlite or .sqlite3 (``runs/x/study.db``, ``study.db``), or a run folder
(``runs/x/``, or an existing folder: its ``study.db``). Light on purpose: no database library is imported here.

Example:
    >>> as_url("runs/x/")
    'sqlite:///runs/x/study.db'
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError

STUDY_FILE = "study.db"  # a run folder's study: runs/NAME/study.db
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")  # what a SQLite file's path ends with


def is_url(value: str) -> bool:
    """Whether ``value`` is written as a URL (``scheme://...``) rather than a path."""
    scheme, sep, _ = value.partition("://")
    return bool(sep) and bool(scheme) and "/" not in scheme


def sqlite_file(value: str) -> Path | None:
    """The SQLite file a path names (a folder: its ``study.db``); None for anything else, which is
    left to the opener to read as a URL (and to refuse, in words, if it is none: a mistyped URL or
    a stray word never becomes a new file)."""
    if is_url(value) or ":" in value.partition("/")[0]:  # a URL, or one mistyped (sqlite:/x.db)
        return None
    if value.endswith(("/", os.sep)) or Path(value).is_dir():
        return Path(value) / STUDY_FILE
    return Path(value) if Path(value).suffix.lower() in SQLITE_SUFFIXES else None


def as_url(value: str) -> str:
    """The SQLAlchemy URL ``value`` names (see the module docstring)."""
    path = sqlite_file(value)
    return value if path is None else f"sqlite:///{path.as_posix()}"


def existing_url(value: str, flag: str = "--storage") -> str:
    """`as_url` for a command that reads a study: a path that names no file is one `ConfigError`
    naming the path as written (a URL is checked where it is opened)."""
    path = sqlite_file(value)
    if path is None:
        return value
    if not path.is_file():
        if path == Path(value):
            raise ConfigError(f"{flag} {value}: no such file")
        there = "no such folder" if not Path(value).is_dir() else f"no {STUDY_FILE} in that folder"
        raise ConfigError(f"{flag} {value}: {there}")
    return as_url(value)


__all__ = ["SQLITE_SUFFIXES", "STUDY_FILE", "as_url", "existing_url", "is_url", "sqlite_file"]
