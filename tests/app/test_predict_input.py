"""`predict` input: a text over ``--max-text-bytes`` is one line before the model loads, showing the
text's start only; an answer shows at most ``ECHO_CHARS`` characters of its text."""

from __future__ import annotations

import json

import pytest

from petl_nas.app.cli import main
from petl_nas.deploy.texts import ECHO_CHARS, MAX_TEXT_BYTES


@pytest.fixture
def no_model(monkeypatch):
    """`predict` without a trained run: every text is 'pos'; ``loaded`` says whether a model was asked for."""
    from petl_nas.deploy import runs as deploy

    loaded = []
    monkeypatch.setattr(
        deploy,
        "load",
        lambda backbone, directory: (
            loaded.append(directory)
            or type(
                "M", (), {"petl": type("P", (), {"info": {"task": "demo_sentiment", "labels": ["neg", "pos"]}})()}
            )()
        ),
    )
    monkeypatch.setattr(deploy, "predict", lambda model, rows: [{"label": "pos"} for _ in rows])
    return loaded


@pytest.mark.parametrize(
    "name, text, args, words",
    [
        (
            "in.txt",
            "fine\n" + "x" * (MAX_TEXT_BYTES + 1) + "\n",
            [],
            f"input 'in.txt', line 2: {MAX_TEXT_BYTES + 1:,} bytes, over --max-text-bytes {MAX_TEXT_BYTES:,} (starts "
            f"'{'x' * 20}...')",
        ),
        (
            "in.txt",
            "fine\n" + "é" * 60 + "\n",
            ["--max-text-bytes", "100"],  # bytes, not characters
            "input 'in.txt', line 2: 120 bytes, over --max-text-bytes 100 (starts",
        ),
        (
            "in.csv",
            "sentence\nfine\n" + "y" * 300 + "\n",
            ["--max-text-bytes", "200"],
            "input 'in.csv', row 2, column 'sentence': 300 bytes, over --max-text-bytes 200",
        ),
        ("in.txt", "fine\n", ["--max-text-bytes", "0"], "--max-text-bytes: expected a whole number >= 1, got 0"),
    ],
    ids=["txt-line-over-the-default", "txt-bytes-not-characters", "csv-cell-over-the-flag", "flag-zero"],
)
def test_a_text_over_the_cap_is_one_short_line(tmp_path, monkeypatch, capsys, no_model, name, text, args, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(text)
    assert main(["predict", "--run", "m", "--input", name, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("petl-nas: error: ") and err.count("\n") == 1 and words in err, err
    assert len(err) < 160
    if name.endswith(".txt"):
        assert not no_model  # refused before the model loads


def test_an_answer_shows_the_start_of_a_long_text(tmp_path, monkeypatch, capsys, no_model):
    long = "a good film " + "z" * 1000
    (tmp_path / "in.txt").write_text(f"short\n{long}\n")
    assert main(["predict", "--run", "m", "--input", str(tmp_path / "in.txt")]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert answers == [{"text": "short", "label": "pos"}, {"text": long[:ECHO_CHARS] + "...", "label": "pos"}]
