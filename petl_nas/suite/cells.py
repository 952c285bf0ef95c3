"""A suite's table: per task and budget, the search's pick against the best baseline at that budget
and against the best baseline of the 2021–22 methods, and the macro-average over tasks per budget
(markdown, JSON and a PNG).

A cell reads its study only: the pick is what ``export`` takes by default, the best baseline is the
one confirmation compared it with (else the baseline with the best search score), the best 2022
baseline the best among the baselines that use no method added in 2023–24
(`petl_nas.search.baselines.best_2022_baseline`), and each paired test Δ is the per-seed
difference of their final runs (same seeds). Where nothing beats the best baseline beyond noise the
pick is that baseline (Δ 0); the best confirmed mean, which a user can export instead (``--pick
best-mean``), has its own Δ beside it, so the table shows what the search found as well as what it
deploys. Nothing here chooses anything from the test split; a cell whose pick or baseline has no
test runs says so. A cell without a Δ says why: its study is not run yet, still running, or
finished with nothing learned (every trial within noise of the trivial baseline: its best
search-dev score is shown beside the trivial baseline's).
"""

from __future__ import annotations

import math
import statistics

from ..core.eras import family_name
from ..errors import ConfigError
from ..search.baselines import best_2022_baseline
from ..study.fronts import learned_trials, source_of
from ..study.header import StudyHeader
from ..study.pick import best_baseline, verdict
from ..study.records import run_state, stored_trials
from ..tasks.metrics import points_per_unit
from ..tasks.significance import paired_difference

NOT_RUN, RUNNING, NOTHING_LEARNED, MEASURED = "not run yet", "running", "nothing learned", "measured"


def empty(task: str, budget: str, state: str = NOT_RUN) -> dict:
    """The row of a study not run yet (or, with ``state``, still running): nothing measured."""
    return {
        "task": task,
        "budget": budget,
        "state": state,
        "budget_params": None,
        "metric": None,
        "pick": None,
        "baseline": None,
        "baseline_2022": None,
        "beaten": False,
        "delta": None,
        "delta_2022": None,
        "best_mean_delta": None,
        "best_search": None,
        "trivial": None,
        "trial_min": 0,
        "wall_min": None,
    }


def cell(study, task: str, budget: str) -> dict:
    """The suite's row for one study (see the module docstring)."""
    from ..deploy.export import choose  # export's default pick: what a user of the study deploys

    header, stored = StudyHeader.of(study), {t.number: t for t in stored_trials(study)}
    pts = points_per_unit(header.metric or "accuracy")
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    wall_s = header.wall_s
    said = verdict(study)
    base_no = said.baseline if said is not None else getattr(best_baseline(study), "number", None)
    old_no = getattr(best_2022_baseline(study), "number", None)
    try:
        pick = choose(study)
    except ConfigError:  # nothing complete yet: an empty row, said as such
        pick = None
    pick = trials.get(getattr(pick, "number", None))
    row = {
        "task": task,
        "budget": budget,
        "state": _state(study),
        "budget_params": header.budget,
        "metric": header.metric,
        "pick": _side(pick, stored),
        "baseline": _side(trials.get(base_no), stored),
        "baseline_2022": _side(trials.get(old_no), stored),
        "beaten": bool(said and said.beaten),
        "delta": _delta(pick, trials.get(base_no), stored, pts),
        "delta_2022": _delta(pick, trials.get(old_no), stored, pts),
        "best_mean_delta": _delta(trials.get(said.best), trials.get(base_no), stored, pts) if said else None,
        "best_search": max((t.values[0] for t in trials.values() if t.values is not None), default=None),
        "trivial": (header.baseline or {}).get("score"),
        "trial_min": round(sum(t.user_attrs.get("wall_s") or 0 for t in trials.values()) / 60, 1),
        "wall_min": None if wall_s is None else round(wall_s / 60, 1),
    }
    return row


def _state(study) -> str:
    """``running`` (`run_state`), ``nothing learned`` (finished, no complete trial beyond noise of
    the trivial baseline) or ``measured``."""
    if run_state(study) != "finished":
        return RUNNING
    return MEASURED if learned_trials(study) else NOTHING_LEARNED


def _delta(trial, baseline, stored: dict, pts: float) -> dict | None:
    """The paired test Δ (points) of ``trial`` to ``baseline``; None where either has no test runs."""
    p, b = _side(trial, stored), _side(baseline, stored)
    if not (p and b and p["test"] and b["test"]):
        return None
    d = (
        paired_difference(p["test"], b["test"])
        if p["number"] != b["number"]
        else {"mean": 0.0, "std": 0.0, "n": len(p["test"])}
    )  # the baseline itself
    return {"mean": pts * d["mean"], "std": None if d["std"] is None else pts * d["std"], "n": d["n"]}


def _side(trial, stored: dict) -> dict | None:
    """``trial``'s side of a comparison; ``stored``: the study's trials by number (`stored_trials`)."""
    if trial is None:
        return None
    stored = stored[trial.number]
    final = stored.final or {}
    family = family_name(stored.config(resolved=False)) if stored.petl_config is not None else None
    return {
        "number": trial.number,
        "name": source_of(trial),
        "deployable": int(trial.values[1]),
        "family": family,
        "test": final.get("scores") or None,
    }


def macro(cells: list[dict], key: str = "delta") -> list[dict]:
    """Per budget, in the order first seen: the mean of Δ (points; ``key``: ``delta`` to the best
    baseline, ``delta_2022`` to the best 2022 one) over the tasks that have one, its standard error
    (the per-task standard errors combined, tasks independent), the lowest cell, and how many of the
    budget's tasks have a Δ (a suite still running, or a study without finals, shows ``2 of 3``:
    the mean is then over those two)."""
    out = []
    for budget in dict.fromkeys(c["budget"] for c in cells):
        row = [c for c in cells if c["budget"] == budget]
        deltas = [c[key] for c in row if c.get(key) is not None]
        entry = {"budget": budget, "tasks": len(row), "measured": len(deltas), "mean": None, "se": None, "lowest": None}
        if deltas:
            entry["mean"] = statistics.fmean(d["mean"] for d in deltas)
            if all(d["std"] is not None for d in deltas):
                entry["se"] = math.sqrt(sum(d["std"] ** 2 / d["n"] for d in deltas)) / len(deltas)
            entry["lowest"] = min(d["mean"] for d in deltas)
        out.append(entry)
    return out


def _test(side: dict | None, pts: float) -> str:
    if side is None:
        return "-"
    if not side["test"]:
        return "not re-evaluated"
    m = statistics.fmean(side["test"])
    sd = statistics.stdev(side["test"]) if len(side["test"]) > 1 else None
    return f"{pts * m:.2f}" + (f" ± {pts * sd:.2f}" if sd is not None else "")


def _who(side: dict | None) -> str:
    if side is None:
        return "-"
    name = side["name"] if side["name"] != "-" else "searched"
    return f"trial {side['number']} ({name}, {side['deployable']:,})"


def _family(side: dict | None) -> str:
    return (side or {}).get("family") or "-"


def state_text(c: dict) -> str:
    """The cell's state in a few words; ``nothing learned`` with the study's best search-dev score
    beside the trivial baseline's (points)."""
    state = c.get("state", MEASURED)
    if state != NOTHING_LEARNED or c.get("trivial") is None:
        return state
    pts = points_per_unit(c["metric"] or "accuracy")
    best = "-" if c.get("best_search") is None else f"{pts * c['best_search']:.2f}"
    return f"{state} (best search-dev {best}, trivial {pts * c['trivial']:.2f})"


def markdown(suite_name: str, cells: list[dict]) -> str:
    """The table (one row per task and budget) and the macro-average per budget, in markdown."""
    lines = [
        f"# Suite {suite_name}: the search's pick against the best baseline at each budget",
        "",
        "| task | budget | state | pick (deployable) | pick's family | test | best baseline (deployable) | "
        "its family | test | paired Δ pts (test, ±std) | seeds | best 2022 baseline (deployable) | its family | "
        "test | paired Δ pts to it | beats the best on search-dev | best confirmed mean's Δ | "
        "trial compute (min) | study wall (min) |",
        "|" + "---|" * 19,
    ]
    for c in cells:
        pts = points_per_unit(c["metric"] or "accuracy")
        d = c["delta"]
        budget = c["budget"] + (f" ({c['budget_params']:,})" if c["budget_params"] is not None else "")
        old = c.get("baseline_2022")
        lines.append(
            f"| {c['task']} | {budget} | {state_text(c)} | {_who(c['pick'])} | {_family(c['pick'])} | "
            f"{_test(c['pick'], pts)} | {_who(c['baseline'])} | {_family(c['baseline'])} | "
            f"{_test(c['baseline'], pts)} | {_signed(d)} | {d['n'] if d else '-'} | {_who(old)} | "
            f"{_family(old)} | {_test(old, pts)} | {_signed(c.get('delta_2022'))} | "
            f"{'yes' if c['beaten'] else 'no'} | {_signed(c.get('best_mean_delta'))} | {c['trial_min']:g} | "
            f"{_minutes(c.get('wall_min'))} |"
        )
    lines += [
        "",
        "| budget | macro-average Δ pts over the tasks measured (± se) | lowest cell | tasks measured | "
        "macro-average Δ pts to the best 2022 baseline (± se) | lowest cell | tasks measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, old in zip(macro(cells), macro(cells, "delta_2022")):
        lines.append(f"| {m['budget']} | {_macro_cells(m)} | {_macro_cells(old)} |")
    lines += [
        "",
        "State: not run yet (no study), running (a run started and has not ended), nothing learned "
        "(finished, every trial within noise of the trivial baseline; best search-dev score beside the "
        "trivial baseline's, in points) or measured. "
        "Δ: the pick's test score minus the best baseline's, seed by seed (the same seeds), in points; "
        "the pick is what `petl-nas export` takes by default, the best baseline the one confirmation compared "
        "it with on search-dev; where nothing beats that baseline beyond noise, the pick is the baseline itself "
        "(Δ 0), or the reference preset (`final.reference`) where that baseline is larger than it and does not "
        "beat it beyond noise, and the best confirmed mean's Δ is what `export --pick best-mean` would have "
        "given. The best 2022 baseline: the best baseline among the methods the space held before 2023 (no "
        "(IA)³, LN-tuning, VeRA, FourierFT, LoKr or DoRA), by confirmed mean where confirmed, else by search "
        "score. Family: the trained families of the configuration. "
        "Trial compute: the studies' trials' wall time, calibration and finals aside. "
        "Study wall: the study's runs from start to end (calibration, supernet, trials, confirmation, finals), "
        "summed over its resumes.",
    ]
    walls = per_task_wall(cells)
    if walls:
        lines += [
            "",
            "Wall time per task, its studies summed: "
            + "; ".join(f"{w['task']} {w['minutes']:g} min ({w['studies']} of {w['of']} studies)" for w in walls)
            + ".",
        ]
    return "\n".join(lines) + "\n"


def _macro_cells(m: dict) -> str:
    mean = "-" if m["mean"] is None else f"{m['mean']:+.2f}" + (f" ± {m['se']:.2f}" if m["se"] is not None else "")
    lowest = "-" if m["lowest"] is None else f"{m['lowest']:+.2f}"
    return f"{mean} | {lowest} | {m['measured']} of {m['tasks']}"


def per_task_wall(cells: list[dict]) -> list[dict]:
    """Per task with any study's wall time recorded: the minutes of its studies summed, and of how
    many of its studies (a suite still running, or a study older than the record, counts fewer)."""
    out = []
    for task in dict.fromkeys(c["task"] for c in cells):
        row = [c for c in cells if c["task"] == task]
        known = [c["wall_min"] for c in row if c.get("wall_min") is not None]
        if known:
            out.append({"task": task, "minutes": round(sum(known), 1), "studies": len(known), "of": len(row)})
    return out


def _signed(d: dict | None) -> str:
    return "-" if d is None else f"{d['mean']:+.2f}" + (f" ± {d['std']:.2f}" if d["std"] is not None else "")


def _minutes(value) -> str:
    return "-" if value is None else f"{value:g}"


def plot_png(cells: list[dict]) -> bytes:
    """Δ per task against the budget (each budget one position, in the suite's order), the
    macro-average with its standard error, and that against the best 2022 baseline (dashed); a cell
    without a Δ is named at its budget with its state (`state_text`)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    budgets = list(dict.fromkeys(c["budget"] for c in cells))
    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.axhline(0, color="grey", linewidth=1)
    for task in dict.fromkeys(c["task"] for c in cells):
        points = [(budgets.index(c["budget"]), c["delta"]) for c in cells if c["task"] == task and c["delta"]]
        if points:
            ax.errorbar(
                [x for x, _ in points],
                [d["mean"] for _, d in points],
                yerr=[d["std"] or 0 for _, d in points],
                marker="o",
                capsize=3,
                alpha=0.6,
                label=task,
            )
    for key, style in (
        ("delta", {"color": "black", "linewidth": 2.5, "marker": "s", "capsize": 4, "label": "macro-average (± se)"}),
        (
            "delta_2022",
            {
                "color": "dimgrey",
                "linewidth": 1.5,
                "linestyle": "--",
                "marker": "D",
                "capsize": 3,
                "label": "macro-average to the best 2022 baseline",
            },
        ),
    ):
        avg = [(i, m) for i, m in enumerate(macro(cells, key)) if m["mean"] is not None]
        if avg:
            ax.errorbar([i for i, _ in avg], [m["mean"] for _, m in avg], yerr=[m["se"] or 0 for _, m in avg], **style)
    for x, line, text in plot_notes(cells):  # named where they stand, stacked below the axis line
        ax.annotate(
            text,
            (x, 0),
            xytext=(0, -14 * (1 + line)),
            textcoords="offset points",
            ha="center",
            fontsize=7,
            color="grey",
        )
    ax.set_xticks(range(len(budgets)), budgets)
    ax.set_xlim(-0.5, len(budgets) - 0.5)
    ax.set_xlabel("parameter budget (share of the backbone)")
    ax.set_ylabel("pick − best baseline, test (points)")
    if any(c["delta"] for c in cells):
        ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def plot_notes(cells: list[dict]) -> list[tuple[int, int, str]]:
    """(budget position, line in its stack, text) of each cell without a Δ, as the plot names it:
    ``task: state`` (`state_text`), or ``task: no paired test Δ`` where its study was measured."""
    budgets = list(dict.fromkeys(c["budget"] for c in cells))
    out, stacked = [], dict.fromkeys(budgets, 0)
    for c in cells:
        if c["delta"] is None:
            state = state_text(c) if c.get("state", MEASURED) != MEASURED else "no paired test Δ"
            out.append((budgets.index(c["budget"]), stacked[c["budget"]], f"{c['task']}: {state}"))
            stacked[c["budget"]] += 1
    return out


__all__ = [
    "cell",
    "empty",
    "macro",
    "markdown",
    "per_task_wall",
    "plot_notes",
    "plot_png",
    "state_text",
    "NOT_RUN",
    "RUNNING",
    "NOTHING_LEARNED",
    "MEASURED",
]
