"""``petl-nas report``: one self-contained ``report.html`` (figures embedded as base64 data URIs,
no script, no network) and the same figures as PNGs, written atomically into a folder.

Everything is computed in memory first, so a bad URL, a wrong study name or a study with nothing
to show writes nothing.

Example:
    >>> write_report("sqlite:///runs/smoke/study.db", None, "runs/smoke/report")   # doctest: +SKIP
"""

from __future__ import annotations

import base64
import datetime
import html
import json
from pathlib import Path

from .. import __version__
from ..errors import ConfigError
from ..fileio import atomic_write
from ..study.exportable import best_of, candidates
from ..study.header import StudyHeader
from ..study.pick import confirmed_text
from ..study.rates_text import lines as rate_lines
from ..tasks.shift import shift_line
from ..tasks.significance import mean_std
from ..training.costs import UNITS
from . import plots
from .storage import load, redact
from .view import Point, StudyView, hypervolume_history, importances, modules_by_position, study_view

REPORT = "report.html"
CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.facts th { font-weight: 600; color: #555; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption, .note { color: #555; font-size: 13px; } code { background: #f4f4f4; padding: 1px 4px; }
"""


def write_report(storage_url: str, study_name: str | None, out_dir: str | Path) -> list[Path]:
    """Write ``report.html`` and the PNGs into ``out_dir``; returns the written paths."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"-o {str(out)!r}: exists and is not a folder")
    study = load(storage_url, study_name)
    view = study_view(study, redact(storage_url))
    ranked, note = importances(study)
    figures = {
        "pareto.png": plots.pareto(view),
        "hypervolume.png": plots.hypervolume(hypervolume_history(view), view.metric),
        "forms.png": plots.forms(modules_by_position(view), view.metric),
    }
    if ranked:
        figures["importance.png"] = plots.importance(ranked, view.metric)
    if view.cost_objectives:
        figures["costs.png"] = plots.costs(view)
    page = render(view, figures, note, hypervolume_history(view)["reference"], pick=_picked(study))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in {**figures, REPORT: page.encode()}.items():
        atomic_write(out / name, lambda p, data=data: Path(p).write_bytes(data))
        written.append(out / name)
    return written


def _picked(study) -> int | str:
    """The number of the trial ``petl-nas export`` writes by default (`study.exportable`), or why it has none."""
    try:
        return best_of(study, candidates(study)).number
    except ConfigError as e:
        return str(e)


# ---- HTML -----------------------------------------------------------------------------------
def _e(x) -> str:
    return html.escape(str(x))


def _figure(figures: dict, name: str, caption: str) -> str:
    data = base64.b64encode(figures[name]).decode()
    return (
        f'<figure id="fig-{name[:-4]}"><img alt="{_e(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def _table(view: StudyView, points: list[Point], caption_id: str) -> str:
    m = _e(view.metric)
    costs = ["latency", *(c for c in view.cost_objectives if c != "latency")]  # every trial times latency
    head = (
        "<tr><th>trial</th><th>source</th><th>configuration</th>"
        f"<th>search {m}</th><th>test {m} (mean ± std)</th><th>deployable</th><th>% of backbone</th>"
        "<th>trainable</th><th>lr</th><th>train s</th>"
        + "".join(f"<th>{name.replace('_', ' ')} {UNITS[name]}</th>" for name in costs)
        + "</tr>"
    )
    rows = []
    for p in points:
        n = len(p.final.get("scores", [])) if p.final else 0
        test = (
            mean_std(p.final["mean"], p.final.get("std"), n) + (f" ({n} seeds)" if n != 1 else "") if p.final else "–"
        )
        pct = view.pct(p.deployable)
        rows.append(
            f'<tr id="{caption_id}-trial-{p.number}"><td class="n">{p.number}</td>'
            f'<td>{_e("–" if p.source == "-" else p.source)}</td>'
            f"<td>{_e(p.config_text)}</td><td class='n'>{p.score:.4f}"
            f"{f' ± {p.se:.4f}' if p.se is not None else ''}{' (did not learn)' if p.did_not_learn else ''}"
            f"{f'<br>{_e(confirmed_text(p.confirmed, p.on_front))}' if p.confirmed else ''}</td>"
            f"<td class='n'>{test}</td>"
            f"<td class='n'>{p.deployable:,}</td><td class='n'>{f'{pct:.3f}' if pct is not None else '–'}</td>"
            f"<td class='n'>{f'{p.trainable:,}' if p.trainable is not None else '–'}</td>"
            f"<td class='n'>{f'{p.lr:.2g}' if p.lr else '–'}</td>"
            f"<td class='n'>{f'{p.train_s:.0f}' if p.train_s is not None else '–'}</td>"
            + "".join(f"<td class='n'>{p.costs[c]:.1f}</td>" if c in p.costs else "<td class='n'>–</td>" for c in costs)
            + "</tr>"
        )
    return f'<table id="{caption_id}">{head}{"".join(rows)}</table>'


def _backbone(stored) -> str:
    try:
        value = json.loads(stored)  # stored as JSON: a name or {tiny: ...}
    except (TypeError, ValueError):
        return str(stored)
    return value if isinstance(value, str) else json.dumps(value)


def _fronts(view: StudyView) -> str:
    """Hypervolume of the searched, preset and sweep fronts, and the comparison with the sweep."""
    return _e(view.sweep_line or "no LoRA rank sweep in this study (final.baselines: false)")


def _calibration(record: dict | None) -> str:
    if not record:
        return "– (fixed length)"
    tried = "; ".join(
        f"{s['epochs']:g} epochs: " + ", ".join(f"{n} {v['score']:.4f}" for n, v in s["scores"].items())
        for s in record["steps"]
    )
    return _e(
        f"{record['epochs']:g} epochs chosen ({'stable' if record['stable'] else 'no stable order'}; "
        f"{record['cost_s'] / 60:.1f} min). {tried}"
    )


def _rates(record: dict | None, setting: dict | None) -> str:
    """Each family's measured rate and how it was found, or why the trials drew one rate each."""
    if not record:
        return (
            "– (one learning rate per trial, drawn from the space's lr range)"
            if not (setting or {}).get("calibrated")
            else "– (not measured yet)"
        )
    return "<br>".join(map(_e, rate_lines(record))) + _e(
        f"; trials draw lr_scale in [1/{setting['spread']:g}, {setting['spread']:g}] of them"
    )


def _oneshot(record: dict | None) -> str:
    """The supernet run behind the one-shot proposals; with a knob search, every run and the chosen one."""
    if not record:
        return "–"
    if record.get("from"):  # another study's supernet proposed for this budget too
        return _e(
            f"none trained here: {len(record['proposed'])} proposals for this budget read from "
            f"{record['from']['file']} (the supernet of study {record['from']['study']}; {record['run']})"
        )
    text = (
        f"{record['supernet_params']:,} gated parameters, {record['epochs']:g} epochs, "
        f"{record['cost_s'] / 60:.1f} min; search-dev {record['score']:.4f} at an expected "
        f"{record['expected_count']:,}; {len(record['proposed'])} proposals ({record['run']})"
    )
    if built := [p["anchor"] for p in record["proposed"] if p.get("anchor")]:
        text += f", {len(built)} of them a baseline plus the supernet's choice beside it ({', '.join(built)})"
    search = record.get("knob_search")
    if search:
        runs = "; ".join(
            f"run {r['number']}"
            + (" (chosen)" if r["number"] == search["chosen"] else "")
            + ": "
            + ", ".join(f"{k} {v:.3g}" for k, v in r["knobs"].items())
            + f", inherited hypervolume {r['hypervolume']:.4f}"
            for r in search["runs"]
        )
        text += f". Knobs searched over {len(search['runs'])} runs (study {search['study']}): {runs}"
    if record.get("serves"):
        text += (
            f"; it also proposed for budgets "
            f"{', '.join(f'{b:,}' for b in record['serves']['budgets'] if b != record['target'])} "
            f"({record['serves']['file']})"
        )
    return _e(text)


def _confirmed(view: StudyView) -> str:
    """Which trials the confirmation runs re-scored; the pick (export, the re-evaluation) takes the best mean."""
    points = sorted((p for p in view.points if p.confirmed), key=lambda p: p.number)
    if not points:
        return "– (no trial re-scored over extra seeds)"
    return _e(
        f"trials {', '.join(str(p.number) for p in points)} re-trained with extra seeds on search-dev; "
        f"the pick (export, the final re-evaluation) is the best mean over a trial's seeds, shown beside "
        f"its single search score"
    )


def _facts(view: StudyView) -> str:
    h, c, m_ = view.header, view.counts, _e(view.metric)
    f = h.fidelity
    budget = (
        f"{view.budget:,} deployable parameters ({view.pct(view.budget):.3f}% of the backbone)"
        if view.budget and view.pct(view.budget)
        else f"{view.budget:,}"
        if view.budget
        else "none"
    )
    rows = {
        "storage": f"<code>{_e(view.storage)}</code>",
        "task / metric": f"{_e(h.task or '?')} / {_e(view.metric)}",
        "backbone": _e(_backbone(h.backbone))
        + (f" ({view.backbone_params:,} parameters)" if view.backbone_params else ""),
        "budget": budget,
        "space": f"{_e(h.space_name or '?')} (version {_e(_or_unknown(h.space_version))}, "
        f"hash {_e(h.space_hash or '?')}); sampler {_e(h.sampler or '?')}",
        "search fidelity": ", ".join(f"{k} {_e(v)}" for k, v in f.items() if v is not None) or "–",
        "trivial baseline": (
            f"{_e(view.baseline['what'])}: {m_} {view.baseline['score']:.4f} on search-dev; trials "
            f"within two standard errors of it did not learn"
            + (
                f"; the same predictor scores {view.baseline['test_score']:.4f} on the test split"
                if view.baseline.get("test_score") is not None
                else ""
            )
            if view.baseline
            else "–"
        ),
        "inputs: search-dev vs test": _e(shift_line(h.input_shift)) if h.input_shift else "–",
        "fidelity calibration": _calibration(h.fidelity_calibration),
        "learning rates": _rates(h.rate_calibration, h.rates_mode),
        "one-shot supernet": _oneshot(h.oneshot),
        "fronts": _fronts(view),
        "final.confirm": _confirmed(view) + (f"<br>{_e(view.verdict_line)}" if view.verdict_line else ""),
        "wall time": _wall(h),
        "trials": (
            f"{c['complete']} complete, {c['pruned']} pruned (stopped early), {c['failed']} failed, "
            + (f"{c['interrupted']} interrupted (trained again on resume), " if c.get("interrupted") else "")
            + f"{c['rejected']} over budget (never trained), {c['running']} running, {c['waiting']} waiting"
        ),
    }
    return '<table class="facts">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows.items()) + "</table>"


def _or_unknown(value) -> str:
    """A stored setting as the facts show it: ``?`` where the study did not store it."""
    return "?" if value is None else value


def _wall(header: StudyHeader) -> str:
    total, runs = header.wall_s, header.sessions
    if total is None:
        return "– (recorded as each run of the search ends; older studies lack it)"
    return (
        f"{total / 60:.1f} min over {len(runs)} run{'s' * (len(runs) != 1)} of the search, the first from "
        f"{_e(runs[0]['started'])}"
    )


def _pick(view: StudyView, pick: int | str | None) -> str:
    """What ``petl-nas export`` writes by default, and the command that writes it (`render`'s ``pick``)."""
    point = next((p for p in view.points if p.number == pick), None)
    if point is None:
        return f"<p id='pick'><strong>The pick:</strong> none; {_e(pick or 'no trial is picked yet')}.</p>"
    pct = view.pct(point.deployable)
    share = f" ({pct:.3f}% of the backbone)" if pct is not None else ""
    said = [
        f"search {_e(view.metric)} {point.score:.4f}" + (f" ± {point.se:.4f}" if point.se is not None else ""),
        f"{point.deployable:,} deployable parameters{share}",
    ]
    if point.confirmed:
        said.insert(1, _e(confirmed_text(point.confirmed, point.on_front)))
    if point.final:
        n = len(point.final.get("scores", []))
        said.insert(1, f"test {mean_std(point.final['mean'], point.final.get('std'), n)}")
    return (
        f"<p id='pick'><strong>The pick:</strong> trial {point.number}, {_e(point.config_text)}: "
        f"{'; '.join(said)}. Write it with <code>petl-nas export --storage {_e(view.storage)} -o best.yaml"
        f"</code> (<code>--list</code> shows the candidates).</p>"
    )


def render(
    view: StudyView, figures: dict[str, bytes], importance_note: str, reference, pick: int | str | None = None
) -> str:
    """The report page: the Pareto plot, the pick and the front's table first, then the study's facts and the
    other figures. ``pick``: the number of the trial export writes by default (`study.exportable`), or why
    there is none."""
    m, name = _e(view.metric), _e(view.name)
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>petl-nas report: {name}</title>"
        f"<style>{CSS}</style></head><body>",
        f"<h1>Study {name}</h1><p class='note'>petl-nas {_e(__version__)} report, {when}. "
        f"Browse it live: <code>petl-nas dashboard --storage {_e(view.storage)}</code></p>",
        "<h2>Pareto front</h2>",
        _figure(
            figures,
            "pareto.png",
            f"Search {m} (on the dev split carved from the training data) against deployable parameters, "
            "log scale. Blue: the Pareto front; orange diamonds: presets seeded into the study, measured "
            "the same way; red dashed line: the budget; black squares: front members and presets "
            "re-trained at full fidelity with several seeds and scored on the held-out test split "
            "(mean ± std); dotted line: the trivial baseline on search-dev; grey crosses: trials within "
            "noise of it (did not learn), never on the front.",
        ),
        _pick(view, pick),
        _table(view, view.front, "front"),
    ]
    if view.presets:
        parts += ["<h2>Presets measured in this study</h2>", _table(view, view.presets, "presets")]
    if view.confirmed_off_front:
        parts += [
            "<h2>Confirmed by final.confirm, off the front</h2>",
            "<p class='note'>Export's candidates too, by their mean.</p>",
            _table(view, view.confirmed_off_front, "confirmed"),
        ]
    parts += ["<h2>How the study ran</h2>", _facts(view)]
    if "costs.png" in figures:
        parts += [
            "<h2>Costs</h2>",
            _figure(
                figures,
                "costs.png",
                f"The study minimises {', '.join(_e(c) for c in view.cost_objectives)} besides deployable "
                f"parameters: search {m} against each, coloured by log10 deployable parameters. Red rings: "
                "the study's front over all its objectives (a trial slower but smaller can be on it). "
                "Times are measured on the machine the trial ran on, beside whatever else ran there. "
                "<code>petl-nas export --pick fastest-within=X</code> takes the lowest latency within X "
                "points of the best search score.",
            ),
        ]
    ref_score, ref_params = reference
    parts += [
        "<h2>Hypervolume</h2>",
        _figure(
            figures,
            "hypervolume.png",
            f"Area dominated by the front in the Pareto plot's coordinates (search {m} up, log10 "
            f"deployable parameters down), from the reference point ({m} {ref_score:.4g}: "
            f"{'the trivial baseline' if view.baseline else 'the worst complete trial'}; "
            f"{ref_params:,.0f} parameters: the budget, or the largest trial without "
            "one); after each complete trial, by trial number and by wall time.",
        ),
        "<h2>Forms per position</h2>",
        _figure(
            figures,
            "forms.png",
            "Each complete trial's modules at the attention and FFN sublayers: form (columns) and "
            f"size (log scale), coloured by search {m}; Pareto-front members ringed in red. A trial "
            "with no module at a position counts under <em>none</em>.",
        ),
        "<h2>Parameter importances</h2>",
        _figure(figures, "importance.png", _e(importance_note))
        if "importance.png" in figures
        else f"<p class='note'>{_e(importance_note)}</p>",
        "</body></html>",
    ]
    return "\n".join(parts)


__all__ = ["write_report", "render", "REPORT"]
