"""The study's storage: opening a URL, sharing it between processes, and telling live trials from lost ones.

- `open_storage` turns a SQLAlchemy URL into an Optuna `RDBStorage`, or one `ConfigError` line when
  it cannot be opened (a driver that is not installed is named, with its pip command: `check_driver`).
  SQLite files get WAL mode, a busy timeout and ``BEGIN IMMEDIATE`` transactions, so several
  processes on one machine write to one file without "database is locked" (a read-then-write
  transaction would otherwise fail at once, busy timeout or not).
  PostgreSQL gets a connect timeout and TCP keepalives.
- `ClaimLock` serialises the step "count the study's trials, ask for a new one, decide whether it
  fits the budget" across every worker of a study: a flock beside a SQLite file, a PostgreSQL or
  MySQL advisory lock otherwise. The stopping rule (``trials`` trained trials per study) is exact
  under concurrency because of it.
- `Heartbeat` records a heartbeat for each trial this process runs (Optuna's heartbeat table);
  `fail_stale` marks FAIL the RUNNING trials whose heartbeat is older than the grace period (their
  process died), and the storage's callback enqueues each one again, at most ``retries`` times.

- `as_stored` gives a value as a study attribute holds it (a JSON round trip: tuples become lists).

Example:
    >>> storage = open_storage("sqlite:///runs/demo/study.db", heartbeat_interval=20, grace_period=60)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import fcntl
import gc
import hashlib
import importlib.util
import json
import logging
import re
import sqlite3
import threading
import warnings
import weakref
from contextlib import contextmanager, nullcontext
from pathlib import Path

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from ..errors import ConfigError, PetlWarning

SQLITE_BUSY_TIMEOUT_S = 120  # how long a writer waits for the SQLite lock before giving up
PG_CONNECT_TIMEOUT_S = 10
_log = logging.getLogger(__name__)
# We drive trials with ask/tell and keep their heartbeats ourselves (`Heartbeat`), knowingly; the
# heartbeat arguments and callbacks are marked experimental.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", category=ExperimentalWarning)
_IMMEDIATE = weakref.WeakSet()  # engines whose SQLite transactions begin IMMEDIATE (once opened)


class _ImmediateSQLite(sqlite3.Connection):
    """A SQLite connection in WAL mode whose transactions start with ``BEGIN IMMEDIATE``.

    WAL lets readers (the dashboard) run beside the writer. ``BEGIN IMMEDIATE`` (issued by the
    listener below; the Python driver's own transaction handling is off) takes the write lock when
    a transaction starts, waiting up to the busy timeout, instead of failing at the first write of
    a transaction that began by reading. While Optuna sets the storage up it nests connections, so
    its transactions stay deferred then, under a file lock that keeps other processes out.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.execute("PRAGMA journal_mode=WAL")


@sqlalchemy.event.listens_for(sqlalchemy.engine.Engine, "begin")
def _begin_immediate(conn) -> None:
    if isinstance(conn.connection.dbapi_connection, _ImmediateSQLite):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.engine in _IMMEDIATE else "BEGIN")


SECRET_PARAMETER = re.compile(r"pass|pwd|secret|token|key", re.IGNORECASE)  # query parameters that may hold one
_USER_INFO = re.compile(r"(//[^/@\s:]*):[^/@\s]*@")
_SECRET_QUERY = re.compile(r"([?&][^=&#\s]*(?:pass|pwd|secret|token|key)[^=&#\s]*=)[^&#\s]*", re.IGNORECASE)


def redact(url: str) -> str:
    """``url`` with its secrets hidden (for what the tools print and write): the password of its
    user-info, and the value of each query parameter whose name says it holds one (``password``,
    ``sslpassword``, ``secret``, ``token``, ``key``, ...). A URL SQLAlchemy cannot read is masked as text."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
        query = {k: "***" if SECRET_PARAMETER.search(k) else v for k, v in parsed.query.items()}
        return parsed.set(query=query).render_as_string(hide_password=True).replace("%2A%2A%2A", "***")
    except Exception:  # noqa: BLE001 - only for messages
        return _SECRET_QUERY.sub(r"\1***", _USER_INFO.sub(r"\1:***@", str(url)))


def with_installed_driver(url: str) -> str:
    """``url``, with a bare ``postgresql://`` naming psycopg2 where it is the PostgreSQL driver
    installed: SQLAlchemy 2.1 reads a bare URL as psycopg 3, while the ``postgres`` extra (and most
    machines) have psycopg2."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception:  # noqa: BLE001 - the caller reports it
        return url
    if parsed.drivername != "postgresql" or importlib.util.find_spec("psycopg") is not None:
        return url
    if importlib.util.find_spec("psycopg2") is None:
        return url
    return parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)


def check_driver(url: str) -> None:
    """Refuse, in one line, a URL whose database driver is not installed, naming the driver and how
    to install it (Optuna's own error, "Failed to import DB access module", names neither). Called
    by every command that opens a storage (`open_storage`, `check_existing`)."""
    try:
        parsed = sqlalchemy.engine.make_url(with_installed_driver(url))
        dialect = parsed.get_dialect()
    except Exception:  # noqa: BLE001 - the open says what is wrong
        return
    try:
        dialect.import_dbapi()
    except ImportError as e:
        module = e.name or str(e)
        if parsed.drivername in ("postgresql", "postgresql+psycopg2"):  # what the postgres extra installs
            fix = "the PostgreSQL driver psycopg2 is not installed: pip install 'petl-nas[postgres]'"
        elif parsed.get_backend_name() == "postgresql":
            fix = (
                f"the PostgreSQL driver {module} ({parsed.drivername}://) is not installed: install it, or use "
                f"postgresql+psycopg2:// with pip install 'petl-nas[postgres]'"
            )
        else:
            fix = f"its database driver, the Python module {module!r}, is not installed: install it"
        raise ConfigError(f"storage {redact(url)!r}: {fix}") from None


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (None for other databases and in-memory SQLite)."""
    parsed = sqlalchemy.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _refuse_postgres_alias(parsed, shown: str) -> None:
    """``postgres://`` (Heroku's, libpq's spelling) is not a SQLAlchemy dialect: say the one that is."""
    if parsed.drivername.split("+")[0] == "postgres":
        raise ConfigError(
            f"storage {shown!r}: SQLAlchemy names PostgreSQL 'postgresql://' (or "
            f"'postgresql+psycopg2://'), not 'postgres://'"
        )


def check_existing(url: str) -> None:
    """Refuse, in one line, a URL that cannot name an existing study: not an SQLAlchemy URL, or a
    SQLite file that does not exist (opening it would create an empty database: a typo in a path
    must not leave a file behind). For the commands that read a study: export, report, dashboard."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(
            f"storage {redact(url)!r} is not an SQLAlchemy URL or a path (expected e.g. runs/NAME/, "
            f"runs/NAME/study.db, sqlite:///runs/NAME/study.db or "
            f"postgresql+psycopg2://user:password@host/db)"
        ) from None
    _refuse_postgres_alias(parsed, redact(url))
    check_driver(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        if not Path(parsed.database).is_file():
            raise ConfigError(
                f"storage {redact(url)!r}: no such file {parsed.database!r} "
                f"(sqlite:///relative/path.db, sqlite:////absolute/path.db)"
            )


def _engine_kwargs(backend: str, sqlite: bool) -> dict:
    """SQLAlchemy's engine settings: SQLite waits for a busy database and takes its write lock at
    once (`_ImmediateSQLite`); PostgreSQL checks a pooled connection and keeps it alive."""
    if sqlite:
        return {
            "connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S, "isolation_level": None, "factory": _ImmediateSQLite}
        }
    if backend == "postgresql":
        return {
            "pool_pre_ping": True,
            "connect_args": {
                "connect_timeout": PG_CONNECT_TIMEOUT_S,
                "keepalives": 1,
                "keepalives_idle": 30,
                "keepalives_interval": 10,
                "keepalives_count": 3,
            },
        }
    return {}


def _sqlite_folder(path: Path, shown: str) -> list[Path]:
    """Create the folders a SQLite file ``path`` lacks, outermost first; returns them (removed again
    if the open fails). One line naming the folder that cannot be made."""
    made: list[Path] = []
    for parent in reversed([p for p in [path.parent, *path.parent.parents] if not p.exists()]):
        try:
            parent.mkdir()
        except OSError as e:
            _remove(made)
            raise ConfigError(
                f"storage {shown!r} cannot be opened: cannot create folder {parent} ({e.strerror})"
            ) from None
        made.append(parent)
    return made


def open_storage(
    url: str,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    retries: int = 0,
    create_dirs: bool = True,
) -> optuna.storages.RDBStorage:
    """An `RDBStorage` for ``url`` with the settings above; `ConfigError` if it cannot be opened.

    Args:
        heartbeat_interval: seconds between heartbeats of a running trial (None: no heartbeats).
        grace_period: seconds without a heartbeat after which a RUNNING trial counts as lost.
        retries: how many times a lost trial is enqueued again (the same parameters).
        create_dirs: create the folder of a SQLite file (removed again if the open fails).
    """
    shown = redact(url)
    url = with_installed_driver(url)
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception:  # noqa: BLE001 - any parse error
        raise ConfigError(
            f"storage {shown!r} is not a database URL or a path (e.g. runs/x/, runs/x/study.db, "
            f"sqlite:///runs/x/study.db, postgresql://user:password@host/db)"
        ) from None
    _refuse_postgres_alias(parsed, shown)
    check_driver(url)
    path = sqlite_path(url)
    engine_kwargs = _engine_kwargs(parsed.get_backend_name(), path is not None)
    made = _sqlite_folder(path, shown) if path is not None and create_dirs else []
    if path is not None and path.parent.exists() and not path.parent.is_dir():
        raise ConfigError(f"storage {shown!r} cannot be opened: {path.parent} is a file, not a folder")
    callback = (
        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=retries) if retries and heartbeat_interval else None
    )
    error = None
    lock_file = Path(f"{path}.lock") if path is not None else None
    had_lock_file = lock_file is not None and lock_file.exists()
    for _ in range(3):  # concurrent first opens may race to create the tables
        try:
            with _file_lock(path) if path is not None and path.parent.is_dir() else nullcontext():
                storage = optuna.storages.RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=callback,
                )
            _IMMEDIATE.add(storage.engine)
            return storage
        except Exception as e:  # noqa: BLE001 - any driver error
            error = e
            text = str(getattr(e, "orig", None) or e)
            if not any(w in text for w in ("already exists", "duplicate key")):
                break
    if lock_file is not None and not had_lock_file:
        lock_file.unlink(missing_ok=True)
    _remove(made)
    cause = error.__cause__ if isinstance(error, optuna.exceptions.StorageInternalError) and error.__cause__ else error
    first = (str(getattr(cause, "orig", None) or cause).strip().splitlines() or [type(cause).__name__])[0]
    raise ConfigError(f"storage {shown!r} cannot be opened: {first}")


@contextmanager
def _file_lock(db: Path):
    """An exclusive flock on ``<db>.lock`` (the file stays; it holds nothing)."""
    with open(f"{db}.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove(folders: list[Path]) -> None:
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass


def close_storage(study_or_storage) -> None:
    """Close the connections of a study's storage, or of a storage (a SQLite file in WAL mode then
    drops its -wal/-shm files)."""
    inner = _rdb(study_or_storage)
    engine = getattr(inner, "engine", None)
    if engine is not None:
        inner.scoped_session.remove()
        engine.dispose()


def _rdb(study_or_storage):
    storage = getattr(study_or_storage, "_storage", study_or_storage)
    return getattr(storage, "_backend", storage)


class ClaimLock:
    """A lock every worker of one study takes around claiming a trial (see the module docstring).

    SQLite: ``flock`` on ``<file>.lock`` (one machine, which is SQLite's domain anyway). PostgreSQL:
    ``pg_advisory_xact_lock`` on a connection of its own (released if that process or machine dies:
    the server ends the idle transaction after a timeout). MySQL: ``GET_LOCK``. In-memory SQLite
    needs only the process lock.
    """

    PG_IDLE_TIMEOUT = "300s"

    def __init__(self, storage, study_name: str):
        self.rdb = _rdb(storage)
        self.key = int.from_bytes(
            hashlib.blake2b(f"petl-nas:{study_name}".encode(), digest_size=8).digest(), "big", signed=True
        )
        self.name = f"petl-nas:{hashlib.sha1(study_name.encode()).hexdigest()[:40]}"
        self.local = threading.Lock()
        self.path = sqlite_path(str(self.rdb.engine.url))

    def __getstate__(self):  # Ray Tune pickles the searcher that holds this
        return {**self.__dict__, "local": None}

    def __setstate__(self, state):
        self.__dict__.update(state, local=threading.Lock())

    @contextmanager
    def __call__(self):
        with self.local:
            dialect = self.rdb.engine.dialect.name
            if self.path is not None:
                with _file_lock(self.path):
                    yield
            elif dialect == "postgresql":
                with self.rdb.engine.connect() as conn, conn.begin():
                    conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = '{self.PG_IDLE_TIMEOUT}'")
                    conn.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:k)"), {"k": self.key})
                    yield
            elif dialect in ("mysql", "mariadb"):
                with self.rdb.engine.connect() as conn:
                    conn.execute(sqlalchemy.text("SELECT GET_LOCK(:n, -1)"), {"n": self.name})
                    try:
                        yield
                    finally:
                        conn.execute(sqlalchemy.text("SELECT RELEASE_LOCK(:n)"), {"n": self.name})
            else:
                yield


class Heartbeat:
    """Keeps this process's running trials alive in the storage: one thread, one beat per trial
    every ``interval`` seconds. A database hiccup is logged and retried at the next beat."""

    def __init__(self, storage, interval: int | None):
        self.rdb, self.interval = _rdb(storage), interval
        self.live: set[int] = set()
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def __getstate__(self):  # a copy (Ray Tune pickles the searcher) beats for nothing
        return {"rdb": self.rdb, "interval": self.interval}

    def __setstate__(self, state):
        self.__init__(state["rdb"], state["interval"])

    def add(self, trial_id: int) -> None:
        if not self.interval:
            return
        self.rdb.record_heartbeat(trial_id)  # at once: it is never without one
        with self.lock:
            self.live.add(trial_id)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="petl-nas-heartbeat", daemon=True)
                self.thread.start()

    def discard(self, trial_id: int) -> None:
        with self.lock:
            self.live.discard(trial_id)

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval):
            with self.lock:
                ids = sorted(self.live)
            for trial_id in ids:
                try:
                    self.rdb.record_heartbeat(trial_id)
                except Exception as e:  # noqa: BLE001 - retried at the next beat
                    _log.warning("heartbeat of trial id %s failed: %s", trial_id, e)

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join()


LOST = "lost: its worker stopped (no heartbeat)"  # the failure kind of a trial whose process died


def fail_stale(study: optuna.Study) -> None:
    """Mark FAIL the RUNNING trials whose heartbeat is older than the grace period, with `LOST` as
    their ``fail_kind`` and a ``fail_reason`` (retrying them when the storage was opened with
    ``retries``; the retry starts without those attributes). A RUNNING trial without any heartbeat (from a
    process that died between creating it and its first beat, or from an older petl-nas) gets
    one now, so it turns stale after the grace period unless its owner is alive to refresh it."""
    rdb = _rdb(study)
    if not getattr(rdb, "heartbeat_interval", None):
        return
    for tid in _trials_without_heartbeat(rdb, study._study_id):
        rdb.record_heartbeat(tid)
    fail_now(
        study,
        rdb._get_stale_trial_ids(study._study_id),  # as optuna.storages.fail_stale_trials,
        {"fail_kind": LOST, "fail_reason": "its worker stopped: no heartbeat within the grace period"},
    )


def fail_now(study: optuna.Study, trial_ids, user_attrs: dict | None = None) -> list[int]:
    """Mark FAIL at once the RUNNING trials ``trial_ids`` (this process's, in a search interrupted
    by Ctrl-C), with ``user_attrs`` set on each first, and hand each to the storage's stale-trial
    callback, as `fail_stale` would once their heartbeat lapsed: with ``retries`` each is queued
    again (without those attributes), so the resumed search trains it first instead of waiting out
    the grace period. Returns the ids it failed."""
    storage = study._storage
    attrs = user_attrs or {}
    failed = []
    for trial_id in trial_ids:
        try:
            for key, value in attrs.items():
                storage.set_trial_user_attr(trial_id, key, value)
            if storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                failed.append(trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:  # finished meanwhile
            pass
    callback = (
        storage.get_heartbeat_stale_trial_callback() if hasattr(storage, "get_heartbeat_stale_trial_callback") else None
    )
    for trial_id in failed if callback is not None else ():
        trial = copy.deepcopy(storage.get_trial(trial_id))
        trial.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in attrs}  # the retry's
        callback(study, trial)
    return failed


def fail_interrupted(
    study: optuna.Study, running_ids, lock, user_attrs: dict, grace_s: int | None, masked: str | None = None
) -> None:
    """`fail_now` for a worker stopped by Ctrl-C, on the trial ids the callable ``running_ids()``
    names under ``lock`` (the study's `ClaimLock`, called). Run it out of the except block that
    caught the interrupt (`interrupts.interruptible`): the interrupt may have cut a storage call
    short and left that call's SQLite connection, its write lock held, in a reference cycle (2 of
    300 interrupts of a read in a loop), which a collection closes (rolling back) only once the
    interrupt's frames are let go. ``masked``: an error raised while the interrupt unwound, said in
    a warning. Should the storage refuse, the worker still stops, with a warning: a resumed search
    retries those trials once their heartbeat is ``grace_s`` old. (A second Ctrl-C in here waits
    for it to end: `interrupts.interruptible`.)"""
    if masked:
        warnings.warn(f"stopping raised {masked}", PetlWarning, stacklevel=2)
    gc.collect()
    try:
        with lock():
            fail_now(study, running_ids(), user_attrs)
    except Exception as e:  # noqa: BLE001 - stopping all the same
        while e.__cause__ is not None:  # the database's words, not Optuna's guess
            e = e.__cause__
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        when = f"once their heartbeat is {grace_s}s old" if grace_s else "once they are found stale"
        warnings.warn(
            f"the running trials could not be marked as interrupted ({reason}); a resumed search retries them {when}",
            PetlWarning,
            stacklevel=2,
        )


def delete_beside(study: optuna.Study, name: str) -> bool:
    """Delete the study ``name`` from ``study``'s storage if it is there; whether it was. This uses the
    storage ``study`` already has open, so it works under the `ClaimLock`. Opening the storage again
    there would wait forever on SQLite's file lock, which `open_storage` takes too."""
    if name not in optuna.get_all_study_names(study._storage):
        return False
    optuna.delete_study(study_name=name, storage=study._storage)
    return True


def running_without_heartbeat(study: optuna.Study) -> list[int]:
    """Ids of the study's RUNNING trials that never beat: under the `ClaimLock`, where workers ask
    for a trial and start its heartbeat, those of a process that stopped in between."""
    rdb = _rdb(study)
    return _trials_without_heartbeat(rdb, study._study_id) if getattr(rdb, "heartbeat_interval", None) else []


def _trials_without_heartbeat(rdb, study_id: int) -> list[int]:
    """RUNNING trials of the study that never beat. Optuna has no public query for this, so it reads
    its RDB models; should those move in a later Optuna, such trials are left RUNNING (with a warning)
    rather than the search failing."""
    try:
        from optuna.storages._rdb import models

        with rdb.scoped_session() as session:
            return [
                tid
                for (tid,) in session.query(models.TrialModel.trial_id)
                .outerjoin(models.TrialHeartbeatModel)
                .filter(
                    models.TrialModel.study_id == study_id,
                    models.TrialModel.state == TrialState.RUNNING,
                    models.TrialHeartbeatModel.trial_heartbeat_id.is_(None),
                )
            ]
    except (ImportError, AttributeError) as e:
        _log.warning("cannot list trials without a heartbeat in this Optuna (%s); those stay RUNNING", e)
        return []


def as_stored(value):
    """``value`` as a study attribute holds it: through JSON (tuples become lists; others as text)."""
    return json.loads(json.dumps(value, default=str))


__all__ = [
    "LOST",
    "as_stored",
    "check_driver",
    "check_existing",
    "open_storage",
    "redact",
    "with_installed_driver",
    "close_storage",
    "sqlite_path",
    "ClaimLock",
    "Heartbeat",
    "fail_stale",
    "fail_now",
    "fail_interrupted",
    "running_without_heartbeat",
    "delete_beside",
    "SQLITE_BUSY_TIMEOUT_S",
]
