"""petl-nas dashboard: the real optuna-dashboard serves a study over HTTP on 127.0.0.1 (SQLite from
the CLI in a subprocess, PostgreSQL in-process), headless Chromium renders its page, Ctrl-C stops it
with status 0, and bad input is one clear error line."""

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from petl_nas import ConfigError
from petl_nas.app.cli import main
from petl_nas.core.config import ModuleSpec, PetlConfig
from petl_nas.core.describe import describe_config
from petl_nas.dashboards.launcher import make_dashboard
from petl_nas.search import study_note

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
CONFIGS = [
    PetlConfig(modules=(ModuleSpec(form="lora", size=2, scale=2.0),)),
    PetlConfig(modules=(ModuleSpec(form="adapter", position="ffn", size=8, insertion="sequential"),)),
    PetlConfig(bitfit=True),
]


CALIBRATION = {
    "presets": ["lora"],
    "epochs": 2,
    "stable": True,
    "rule": "final",
    "skipped": [],
    "cost_s": 60.0,
    "steps": [
        {"epochs": 1, "scores": {"lora": {"score": 0.61, "learned": False}}},
        {"epochs": 2, "scores": {"lora": {"score": 0.8, "learned": True}}},
    ],
}


def make_study(url: str, name: str) -> optuna.Study:
    """A small finished study shaped like a search's: 3 complete trials (one a preset), a failure."""
    study = optuna.create_study(study_name=name, storage=url, directions=["maximize", "minimize"])
    study.set_metric_names(["accuracy", "deployable_params"])
    study.set_user_attr("metric", "accuracy")
    dists = {"lr": FloatDistribution(1e-5, 1e-2, log=True), "form": CategoricalDistribution(["lora", "adapter"])}
    for i, (config, score, n) in enumerate(zip(CONFIGS, (0.71, 0.78, 0.65), (8_192, 6_400, 640))):
        attrs = {
            "deployable": n,
            "trainable": n,
            "pct_of_backbone": 100 * n / 400_000,
            "petl_config": config.to_dict(),
            "config_text": describe_config(config),
            "recipe": {"lr": 1e-3},
            "epochs": 2,
            "k": 400,
            "wall_s": 12.5,
            "peak_mem_mb": 850.0,
        }
        if i == 2:
            attrs["preset"] = "bitfit"
        study.add_trial(
            create_trial(values=[score, n], params={"lr": 1e-3, "form": "lora"}, distributions=dists, user_attrs=attrs)
        )
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "RuntimeError: boom"}))
    study.set_user_attr("fidelity_calibration", CALIBRATION)
    assert study_note.write(study)  # what a search with fidelity: auto writes
    return study


def chromium_or_skip() -> str:
    path = os.environ.get("PETL_NAS_CHROMIUM")
    if not path or not shutil.which(path):
        pytest.skip("set PETL_NAS_CHROMIUM to a headless Chromium to run the browser check")
    return path


def rendered_text(chromium: str, url: str, tmp_path) -> str:
    """The page's visible text after its scripts ran (the DOM Chromium dumps, tags stripped)."""
    out = subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    dom = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", out.stdout, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", dom).split())


def get_json(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`petl-nas dashboard --port 0` on an SQLite study, in a subprocess: (process, base URL, storage URL)."""
    d = tmp_path_factory.mktemp("dash")
    url = f"sqlite:///{d}/study.db"
    make_study(url, "dash_study")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "petl_nas.app.cli", "dashboard", "--storage", url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        first = lines.get(timeout=180)
    except queue.Empty:
        proc.kill()
        pytest.fail(f"the dashboard printed no address; stderr: {proc.stderr.read()[-2000:]}")
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", first)
    assert match, first
    yield proc, match.group(0).rstrip("/"), url, first
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_dashboard_prints_its_address_and_serves_the_study(served):
    proc, base, url, first = served
    assert f"on {url} (1 study: dash_study)" in first and "Ctrl-C" in first
    studies = get_json(base, "/api/studies")["study_summaries"]
    assert [s["study_name"] for s in studies] == ["dash_study"]
    detail = get_json(base, f"/api/studies/{studies[0]['study_id']}")
    assert len(detail["trials"]) == 4
    assert sorted(t["number"] for t in detail["best_trials"]) == [1, 2]  # 0.71@8.2k is dominated
    attrs = {a["key"]: a["value"] for a in detail["trials"][1]["user_attrs"]}
    assert attrs["config_text"] == "ffn adapter r=8 sequential relu" and attrs["deployable"] == "6400"
    with urllib.request.urlopen(base + "/dashboard", timeout=30) as r:  # the single-page app
        assert r.status == 200 and b"<script" in r.read()


def test_chromium_renders_the_dashboard_page(served, tmp_path):
    chromium = chromium_or_skip()
    _, base, _, _ = served
    study_id = get_json(base, "/api/studies")["study_summaries"][0]["study_id"]
    text = rendered_text(chromium, f"{base}/dashboard/studies/{study_id}", tmp_path)
    assert "dash_study" in text  # rendered by the app's JavaScript, not in the HTML
    assert "Pareto Front" in text and "Best Trials" in text
    assert "Trial 1" in text and "Trial 2" in text and "Objective Values = [0.78, 6400]" in text
    note = rendered_text(chromium, f"{base}/dashboard/studies/{study_id}/note", tmp_path)  # the study's note
    assert "Calibration runs (before the trials" in note and "2 (chosen) 0.8000" in note


@pytest.mark.slow
def test_ctrl_c_stops_the_dashboard_with_status_0(served):
    """Runs last in this file: it stops the shared server."""
    proc, base, _, _ = served
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert "Traceback" not in proc.stderr.read()
    with pytest.raises(OSError):
        urllib.request.urlopen(base + "/api/studies", timeout=5)


def test_dashboard_errors_are_one_line(tmp_path, capsys):
    missing = tmp_path / "nope.db"
    assert main(["dashboard", "--storage", f"sqlite:///{missing}", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no such file" in err and str(missing) in err
    assert not missing.exists()  # browsing never creates a database
    assert main(["dashboard", "--storage", "not a url"]) == 2
    assert "not an SQLAlchemy URL" in capsys.readouterr().err


NO_DRIVER = "postgresql+psycopg2://u:pw@127.0.0.1:9/petl"  # never reached: the missing driver is said first


@pytest.mark.parametrize(
    "args",
    [
        ["search", "--experiment", "e.yaml", "--storage", NO_DRIVER],
        ["search", "--experiment", "e.yaml", "--warm-start", NO_DRIVER + "#earlier"],
        ["export", "--storage", NO_DRIVER, "-o", "best.yaml"],
        ["report", "--storage", NO_DRIVER.replace("+psycopg2", ""), "-o", "report"],  # a bare URL: the same driver
        ["dashboard", "--storage", NO_DRIVER, "--port", "0"],
    ],
    ids=["search", "warm-start", "export", "report", "dashboard"],
)
def test_a_missing_database_driver_is_named_with_its_extra(args, tmp_path, monkeypatch, capsys):
    """Every command that opens a storage names psycopg2 and the extra that installs it, in one line,
    and writes nothing (Optuna alone says "Failed to import DB access module")."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # a machine without the postgres extra
    (tmp_path / "e.yaml").write_text(
        json.dumps(
            {
                "name": "s",
                "backbone": {
                    "tiny": {
                        "hidden_size": 32,
                        "num_hidden_layers": 2,
                        "num_attention_heads": 4,
                        "intermediate_size": 64,
                        "vocab_size": 400,
                    }
                },
                "task": "demo_keyword",
                "budget": None,
                "space": "small",
                "trials": 1,
                "executor": "local",
                "fidelity": {"k": 32, "epochs": 1, "search_dev": 16},
            }
        )
    )
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("petl-nas: error: ")
    assert err.rstrip().endswith(
        ":***@127.0.0.1:9/petl': the PostgreSQL driver psycopg2 is not installed: pip install 'petl-nas[postgres]'"
    ), err
    assert [p.name for p in tmp_path.iterdir()] == ["e.yaml"]


def test_a_busy_port_is_a_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path}/study.db"
    make_study(url, "s")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{busy.getsockname()[1]}"):
            make_dashboard(url, "127.0.0.1", busy.getsockname()[1])


def test_dashboard_on_postgresql():
    url = os.environ.get("PETL_NAS_TEST_POSTGRES")
    if not url:
        pytest.skip("set PETL_NAS_TEST_POSTGRES to a PostgreSQL URL")
    name = f"dash_{uuid.uuid4().hex[:8]}"
    make_study(url, name)
    try:
        server, names = make_dashboard(url, "127.0.0.1", 0)
        assert name in names
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            base = f"http://127.0.0.1:{server.server_port}"
            studies = {s["study_name"]: s["study_id"] for s in get_json(base, "/api/studies")["study_summaries"]}
            assert len(get_json(base, f"/api/studies/{studies[name]}")["trials"]) == 4
        finally:
            server.shutdown()
            server.server_close()
    finally:
        optuna.delete_study(study_name=name, storage=url)
