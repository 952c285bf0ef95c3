"""The study's note in the Optuna dashboard: the calibration runs that trained before the trials.

Calibrating the trial length (`calibrate`) and the rates (`rates`) trains runs that are not trials
of the study, so the dashboard's trial tables and plots never show them; their records are study
attributes (JSON the dashboard prints as one long string). `markdown` writes them as tables, one
row per length or family, each run's search-dev score in its cell, and `write` stores that text as
the study's note (optuna-dashboard's `save_note`), which the dashboard shows on the study's page.
The search writes it once its calibrations are recorded, where optuna-dashboard is installed.
"""

from __future__ import annotations

import math

from ..study.header import StudyHeader
from . import calibrate, rates

HEADING = "## Calibration runs (before the trials, scored on search-dev; not trials of this study)"


def _score(s: float | None) -> str:
    return "–" if s is None else f"{s:.4f}" if s > -math.inf else "diverged"


def _length_table(record: dict) -> list[str]:
    names = record["presets"]
    out = [
        f"### Trial length (fidelity: auto): {record['epochs']:g} epochs per trial",
        "",
        "| epochs | " + " | ".join(names) + " |",
        "| ---: |" + " ---: |" * len(names),
    ]
    for step in record["steps"]:
        cells = [
            _score(step["scores"][n]["score"]) + ("" if step["scores"][n]["learned"] else " (did not learn)")
            for n in names
        ]
        chosen = " (chosen)" if step["epochs"] == record["epochs"] else ""
        out.append(f"| {step['epochs']:g}{chosen} | " + " | ".join(cells) + " |")
    return out + ["", calibrate.describe(record)]


def _rates_table(record: dict) -> list[str]:
    out = [
        "### Learning rates (rates: auto)",
        "",
        "| family | rate used | measured on | rates tried: score |",
        "| --- | ---: | --- | --- |",
    ]
    for family, f in record["families"].items():
        if "tried" in f:
            tried = ", ".join(f"{r:.1e}: {_score(s)}" for r, s in sorted(f["tried"]))
            out.append(f"| {family} | {f['rate']:.1e} | {f['probe']} | {tried} |")
        else:
            out.append(
                f"| {family} | {f['rate']:.1e} | – | {f['why']}: its paper rate {f['prior']:.1e} x "
                f"{record['factor']:.2f}, the factor measured on the others |"
            )
    return out + ["", rates.lines(record)[-1]]


def markdown(header: StudyHeader) -> str | None:
    """The note for a study with this header; None when nothing was calibrated."""
    length, measured = header.fidelity_calibration, header.rate_calibration
    parts = []
    if length and length.get("steps") and length.get("rule") == "final":
        parts += _length_table(length) + [""]
    if measured and measured.get("families"):
        parts += _rates_table(measured) + [""]
    return "\n".join([HEADING, "", *parts]).rstrip() + "\n" if parts else None


def write(study) -> bool:
    """Store `markdown` as the study's note; False when there is nothing to show or no
    optuna-dashboard to show it (the `dashboard` extra)."""
    text = markdown(StudyHeader.of(study))
    if text is None:
        return False
    try:
        from optuna_dashboard import save_note
    except ImportError:
        return False
    save_note(study, text)
    return True


__all__ = ["markdown", "write", "HEADING"]
