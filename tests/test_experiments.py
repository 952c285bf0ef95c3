"""Every file under experiments/ still loads as what it is (an experiment file and its space, a
suite file, an exported record, a space), every local link of its write-ups resolves, and no file name carries a
version (versions are folders)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"
YAMLS = sorted(EXPERIMENTS.rglob("*.yaml"))
WRITE_UPS = sorted(EXPERIMENTS.rglob("*.md"))


def kind_of(path: Path) -> str:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and "petl_config" in data:
        return "record"
    if isinstance(data, dict) and "slots" in data:
        return "space"
    if isinstance(data, dict) and "tasks" in data and "budgets" in data:
        return "suite"
    return "experiment"


@pytest.mark.parametrize("path", YAMLS, ids=[str(p.relative_to(EXPERIMENTS)) for p in YAMLS])
def test_every_yaml_file_loads_as_what_it_is(path, monkeypatch):
    from petl_nas.deploy.export import read_record
    from petl_nas.study.experiment import Experiment
    from petl_nas.study.space import SearchSpace

    monkeypatch.chdir(ROOT)  # paths in the files are the repository's
    kind = kind_of(path)
    if kind == "record":
        assert read_record(path).petl_config is not None
    elif kind == "space":
        SearchSpace.load(path)
    elif kind == "suite":
        from petl_nas.suite.config import Suite

        assert all(SearchSpace.load(exp.space) for _, _, exp in Suite.load(path).experiments())
    else:
        exp = Experiment.load(path)
        SearchSpace.load(exp.space)


SUITES = sorted((ROOT / "suites").glob("*.yaml"))


@pytest.mark.parametrize("path", SUITES, ids=[p.name for p in SUITES])
def test_every_suite_file_loads(path, monkeypatch):
    from petl_nas.study.space import SearchSpace
    from petl_nas.suite.config import Suite

    monkeypatch.chdir(ROOT)
    studies = Suite.load(path).experiments()
    assert studies and all(SearchSpace.load(exp.space) for _, _, exp in studies)


def test_there_are_experiments_records_and_a_space():
    kinds = [kind_of(p) for p in YAMLS]
    assert kinds.count("experiment") >= 20 and kinds.count("record") >= 10 and kinds.count("space") >= 1


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("path", WRITE_UPS, ids=[str(p.relative_to(EXPERIMENTS)) for p in WRITE_UPS])
def test_every_local_link_of_a_write_up_resolves(path):
    links = [t for t in LINK.findall(path.read_text(encoding="utf-8")) if "://" not in t]
    dangling = [t for t in links if not (path.parent / t).exists()]
    assert not dangling, dangling


def test_no_file_name_carries_a_version():
    versioned = [
        str(p.relative_to(EXPERIMENTS)) for p in EXPERIMENTS.rglob("*") if p.is_file() and re.search(r"_v\d", p.stem)
    ]
    assert not versioned, versioned


def test_no_generated_report_is_committed():
    assert not list(EXPERIMENTS.rglob("report.html"))
