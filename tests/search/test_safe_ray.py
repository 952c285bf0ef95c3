"""The Ray a search starts is private to it: every Ray process listens on 127.0.0.1 only, with Ray's
own authentication (or the user's token); a signal to the search's whole process group (`timeout`,
a batch scheduler) stops it as cleanly as one to petl-nas alone; and nothing Ray Tune writes under
the run folder holds the storage URL's password."""

import ipaddress
import os
import signal
import subprocess
import sys
import time
import uuid

import optuna
import pytest
from optuna.trial import TrialState
from test_search import experiment, write_experiment

psutil = pytest.importorskip("psutil")  # installed with ray
pytest.importorskip("ray")

INTERRUPTED_LINE = "petl-nas: interrupted; the study is kept: run the same command again to go on"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs/ goes here


def start_search(tmp_path, env: dict | None = None, import_ray_first: bool = False) -> subprocess.Popen:
    """`petl-nas search` on a long study (40 trials of 20 epochs), through a local Ray, in a session of
    its own (its process group is its pid). ``import_ray_first``: as a Python program that imported
    ray before petl-nas starts it (the library's use)."""
    exp = experiment(tmp_path, executor="ray", trials=40, presets="none", budget="20%")
    write_experiment(tmp_path, exp, epochs=20, scheduler="fifo")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")} | (env or {})
    first = "import ray; " if import_ray_first else ""
    program = f"{first}import sys; from petl_nas.app.cli import main; sys.exit(main(sys.argv[1:]))"
    run = subprocess.Popen(
        [sys.executable, "-c", program, "search", "--experiment", "e.yaml"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    run.exp = exp
    return run


def running_trials(exp) -> list[int]:
    try:
        return [
            t.number
            for t in optuna.load_study(study_name=exp.study_name, storage=exp.storage_url).trials
            if t.state == TrialState.RUNNING
        ]
    except KeyError:  # no study in the file yet
        return []


def processes_of(run) -> list:
    """petl-nas's process and every process under it: Ray's gcs_server, raylet, agents, workers."""
    try:
        root = psutil.Process(run.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listening(procs) -> set[tuple[str, str, int]]:
    """(process name, address, port) of each listening TCP socket of ``procs``."""
    found = set()
    for p in procs:
        try:
            found |= {
                (p.name(), c.laddr.ip, c.laddr.port)
                for c in p.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            }
        except psutil.Error:  # gone meanwhile
            pass
    return found


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback  # ::ffff:127.0.0.1 too


def wait_for_a_running_trial(run, procs_seen: dict, timeout_s: float = 300) -> list[int]:
    """The trials running once a Ray worker trains one; ``procs_seen`` collects the run's processes."""
    deadline = time.time() + timeout_s
    while run.poll() is None and time.time() < deadline:
        procs = processes_of(run)
        procs_seen.update({p.pid: p for p in procs})
        running = running_trials(run.exp)
        if running and any(p.name().startswith("ray::") and listening([p]) for p in procs[1:]):
            return running
        time.sleep(0.5)
    run.kill()
    pytest.fail(f"no trial ran within {timeout_s}s: {run.communicate()[1][-3000:]}")


def alive(procs) -> list:
    def up(p):
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    return [p for p in procs if up(p)]


@pytest.mark.parametrize("auth", ["ray's default", "the user's token"])
@pytest.mark.slow
def test_a_local_ray_listens_on_loopback_only(tmp_path, auth):
    """Every listening socket of every Ray process of a search's own Ray is on 127.0.0.1 (it was
    gcs_server, raylet, the driver's and each worker's gRPC server on 0.0.0.0, and Ray's runtime-env
    agent on the machine's address). With Ray's default authentication (token, made by Ray), and with
    the user's own RAY_AUTH_MODE=token and token, from a program that imported ray first."""
    token = uuid.uuid4().hex * 2
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if auth == "the user's token" else {}
    run = start_search(tmp_path, env, import_ray_first=auth == "the user's token")
    seen: dict = {}
    try:
        wait_for_a_running_trial(run, seen)
        sockets = set()
        for _ in range(6):  # workers start their servers as they come
            sockets |= listening(processes_of(run))
            time.sleep(0.5)
    finally:
        os.kill(run.pid, signal.SIGTERM)
        _, err = run.communicate(timeout=120)
    assert run.returncode == 143, err
    assert {name for name, _, _ in sockets} >= {"gcs_server", "raylet"}, sockets
    exposed = {s for s in sockets if not is_loopback(s[1])}
    assert not exposed, f"listening beyond 127.0.0.1: {sorted(exposed)}"
    assert any(is_loopback(ip) for _, ip, _ in sockets)


@pytest.mark.slow
def test_sigterm_to_the_process_group_stops_a_ray_search_cleanly(tmp_path):
    """`timeout` and batch schedulers signal the whole process group. Ray's gcs_server and raylet
    were in it: they died first, and petl-nas waited 60 s on the dead GCS ("Failed to connect to GCS
    within 60 seconds ... The program will terminate"), exit 1, trials left RUNNING. Now it stops as
    a SIGTERM to petl-nas alone does: exit 143, the one line, its running trials failed as
    interrupted, and no process of its Ray left."""
    from petl_nas.search.study import INTERRUPTED

    run = start_search(tmp_path)
    seen: dict = {}
    running = wait_for_a_running_trial(run, seen)
    seen.update({p.pid: p for p in processes_of(run)})
    start = time.time()
    os.killpg(run.pid, signal.SIGTERM)  # the session's group: petl-nas's pid
    _, err = run.communicate(timeout=180)
    took = time.time() - start
    assert run.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == INTERRUPTED_LINE
    assert took < 30, f"took {took:.0f}s to stop"
    trials = optuna.load_study(study_name=run.exp.study_name, storage=run.exp.storage_url).trials
    assert not any(t.state == TrialState.RUNNING for t in trials)
    for number in running:  # each ended meanwhile, or was stopped for a retry
        assert trials[number].state == TrialState.COMPLETE or trials[number].user_attrs["fail_kind"] == INTERRUPTED
    ray_procs = [p for pid, p in seen.items() if pid != run.pid]
    assert ray_procs
    deadline = time.time() + 15  # Ray's own processes go with the driver
    while alive(ray_procs) and time.time() < deadline:
        time.sleep(0.5)
    assert not alive(ray_procs), [(p.pid, p.name()) for p in alive(ray_procs)]


@pytest.fixture
def pg_url_with_secret():
    """A PostgreSQL URL whose password is unique to this test: a role made for it."""
    url = os.environ.get("PETL_NAS_TEST_POSTGRES")
    if not url:
        pytest.skip("PETL_NAS_TEST_POSTGRES is not set")
    import sqlalchemy as sa

    admin = sa.create_engine(url)
    role, secret = f"petl_nas_secret_{uuid.uuid4().hex[:8]}", f"pw{uuid.uuid4().hex}"
    with admin.begin() as c:  # a member of the test's role: its tables, not its rights
        c.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD '{secret}' IN ROLE {sa.engine.make_url(url).username}"))
    own = sa.engine.make_url(url).set(username=role, password=secret)
    try:
        yield own.render_as_string(hide_password=False), secret
    finally:
        with admin.begin() as c:
            c.execute(sa.text(f"REASSIGN OWNED BY {role} TO {sa.engine.make_url(url).username}"))
            c.execute(sa.text(f"DROP OWNED BY {role}"))
            c.execute(sa.text(f"DROP ROLE {role}"))
        admin.dispose()


@pytest.mark.slow
def test_nothing_ray_tune_writes_holds_the_storage_password(tmp_path, pg_url_with_secret):
    """Ray Tune pickled the searcher, and with it the Optuna storage and its URL, into
    runs/NAME/ray/tune/tuner.pkl (mode 0644): no file under the run folder holds the password."""
    import ray

    from petl_nas.search.driver import run_search

    url, secret = pg_url_with_secret
    name = f"secret-{uuid.uuid4().hex[:8]}"
    exp = experiment(tmp_path, name=name, executor="ray", trials=2, presets="none", storage=url, scheduler="fifo")
    try:
        run_search(exp, printer=lambda line: None)
    finally:
        ray.shutdown()
        optuna.delete_study(study_name=exp.study_name, storage=url)
    files = [p for p in (tmp_path / "runs" / name).rglob("*") if p.is_file()]
    assert any(p.name == "tuner.pkl" for p in files)  # Tune wrote what it pickles
    holding = [str(p.relative_to(tmp_path)) for p in files if secret.encode() in p.read_bytes()]
    assert not holding
