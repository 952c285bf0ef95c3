"""No storage password reaches disk or a served page: a real PostgreSQL role with a unique password
runs a tiny search on Ray, a second search (local) warm-started from the first, export, train and
report, and the dashboard serves both studies; then every file those commands wrote (Ray's
folder included), every line they printed, every attribute the storage serves (through Optuna and
through the dashboard's API) and every row of the database are searched for the password.

Needs a PostgreSQL server (PETL_NAS_TEST_POSTGRES, a user that may create roles and databases);
skips without it. The role and its database are made for the test and dropped after it.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.request
import uuid

import optuna
import pytest
import sqlalchemy
from conftest import TINY_BACKBONE

from petl_nas.app.cli import main
from petl_nas.dashboards.launcher import make_dashboard
from petl_nas.search import warm_start
from petl_nas.study.space import SearchSpace
from petl_nas.study.storage import redact

PG = os.environ.get("PETL_NAS_TEST_POSTGRES")


def experiment(name: str, executor: str) -> dict:
    """A search of 2 trials that learn, in seconds (as
    test_warm_start.py's); no storage in it: the URL is given as a flag, so the only copy of the
    password on disk would be one petl-nas wrote."""
    return {
        "name": name,
        "backbone": TINY_BACKBONE,
        "task": "demo_keyword",
        "budget": "5%",
        "space": "small",
        "trials": 2,
        "presets": ["lora"],
        "executor": executor,
        "scheduler": "fifo",
        "startup_trials": 1,
        "seed": 3,
        "fidelity": {"k": 320, "epochs": 5, "batch_size": 16, "max_length": 24, "search_dev": 128, "length_buckets": 0},
        "final": {"seeds": 0, "epochs": 1, "baselines": False},
        "rates": "off",
    }


@pytest.fixture
def secret_url():
    """(URL, password) of a fresh role owning a fresh database; both dropped afterwards."""
    if not PG:
        pytest.skip("set PETL_NAS_TEST_POSTGRES to a PostgreSQL URL")
    tag = uuid.uuid4().hex[:10]
    role, password = f"petl_secret_{tag}", f"pw-{uuid.uuid4().hex}"
    admin = sqlalchemy.create_engine(PG, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
            c.exec_driver_sql(f"CREATE DATABASE {role} OWNER {role}")
    except sqlalchemy.exc.ProgrammingError as e:
        admin.dispose()
        pytest.skip(f"the test server's user cannot create a role and a database: {e.orig}")
    url = sqlalchemy.engine.make_url(PG).set(username=role, password=password, database=role)
    try:
        yield url.render_as_string(hide_password=False), password
    finally:
        with admin.connect() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)")
            c.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
        admin.dispose()


def served_json(url: str) -> list[str]:
    """What the dashboard's API serves about every study in ``url``, as text."""
    server, _ = make_dashboard(url, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    pages = []
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        with urllib.request.urlopen(f"{base}/api/studies", timeout=60) as r:
            pages.append(r.read().decode())
        for s in json.loads(pages[0])["study_summaries"]:
            with urllib.request.urlopen(f"{base}/api/studies/{s['study_id']}", timeout=60) as r:
                pages.append(r.read().decode())
    finally:
        server.shutdown()
        server.server_close()
    return pages


def stored_attributes(url: str) -> str:
    """Every study's and trial's user and system attributes, as Optuna's storage serves them."""
    storage = optuna.storages.RDBStorage(url)
    try:
        out = []
        for s in storage.get_all_studies():
            sid = s._study_id
            out.append(
                json.dumps([storage.get_study_user_attrs(sid), storage.get_study_system_attrs(sid)], default=str)
            )
            out += [json.dumps([t.user_attrs, t.system_attrs], default=str) for t in storage.get_all_trials(sid)]
        return "\n".join(out)
    finally:
        storage.engine.dispose()


def database_rows(url: str) -> str:
    """Every row of every table in the study's database, as PostgreSQL prints it."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as c:
            tables = [
                t for (t,) in c.exec_driver_sql("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            ]
            assert "trial_user_attributes" in tables
            return "\n".join(str(row) for t in tables for row in c.exec_driver_sql(f'SELECT t::text FROM "{t}" t'))
    finally:
        engine.dispose()


@pytest.mark.slow
def test_no_file_line_attribute_or_row_holds_the_storage_password(secret_url, tmp_path, monkeypatch, capsys):
    url, password = secret_url
    monkeypatch.chdir(tmp_path)
    for name, executor in (("first", "ray"), ("second", "local")):  # Ray's folder too: its pickles
        (tmp_path / f"{name}.yaml").write_text(json.dumps(experiment(name, executor)))
    printed = []

    def run(*argv):
        code = main(list(argv))
        out = capsys.readouterr()
        printed.append(out.out + out.err)
        assert code == 0, f"petl-nas {argv[0]} exited {code}: {(out.out + out.err)[-3000:]}"

    run("search", "--experiment", "first.yaml", "--storage", url)
    run("search", "--experiment", "second.yaml", "--storage", url, "--warm-start", f"{url}#first")
    run("search", "--experiment", "second.yaml", "--storage", url, "--warm-start", f"{url}#first")  # resumed
    second = optuna.load_study(study_name="second", storage=url)
    warm = [t for t in second.trials if t.user_attrs.get("warm_start")]
    assert warm and len(warm) == len(second.user_attrs["warm_start"]["taken"]), printed  # not queued twice
    run("export", "--storage", url, "--study", "second", "--recipe", "search", "-o", "best.yaml")
    run("train", "--config", "best.yaml", "--seeds", "1", "--out", "trained", "--no-progress")
    run("report", "--storage", url, "--study", "second", "-o", "report")

    secret = password.encode()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "metrics.json" for p in files) and any(p.name == "report.html" for p in files)
    assert any(p.parent.name == "trials" for p in files)  # the run folders' records
    assert any(p.name == "tuner.pkl" for p in files)  # and Ray's state
    leaks = [str(p.relative_to(tmp_path)) for p in files if secret in p.read_bytes()]
    leaks += [
        what
        for what, text in (
            ("printed lines", "\n".join(printed)),
            ("stored attributes", stored_attributes(url)),
            ("dashboard API", "\n".join(served_json(url))),
            ("database rows", database_rows(url)),
        )
        if password in text
    ]
    assert leaks == []
    assert second.user_attrs["warm_start"]["source"] == redact(url) + "#first"


def test_a_warm_start_is_stored_without_its_password_and_still_recognised_on_resume(monkeypatch):
    """The stored source hides the password; a resume compares hidden forms, so it takes nothing
    twice, also for a study that stored the URL as given (before passwords were hidden)."""
    from transformers import BertConfig

    monkeypatch.setattr(warm_start, "front_of", lambda source: ("earlier", []))  # no database needed
    source = "postgresql+psycopg2://u:pw-plain@db:5432/petl#earlier"
    args = (
        SearchSpace.load("small"),
        BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
        None,
        2,
        "sqlite:///x.db",
    )
    study = optuna.create_study(directions=["maximize", "minimize"])
    assert warm_start.seed_warm_start(study, source, *args)  # a line: nothing to queue
    assert study.user_attrs["warm_start"]["source"] == "postgresql+psycopg2://u:***@db:5432/petl#earlier"
    assert warm_start.seed_warm_start(study, source, *args) == []  # resumed: done already
    old = optuna.create_study(directions=["maximize", "minimize"])
    old.set_user_attr("warm_start", {"source": source, "taken": [], "dropped": []})
    assert warm_start.seed_warm_start(old, source, *args) == []
