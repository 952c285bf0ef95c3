"""The report's figures as PNG bytes (matplotlib, Agg canvas; no pyplot state, no display).

Every figure has a fixed size in pixels (`SIZES` at `DPI`), so the PNGs are predictable.
"""

from __future__ import annotations

import io
import math

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..study.fronts import pareto as pareto_front
from .view import StudyView

DPI = 100
SIZES = {
    "pareto": (1000, 600),
    "hypervolume": (1000, 400),
    "importance": (800, 500),
    "forms": (1000, 450),
    "costs": (1000, 450),
}
COST_LABELS = {
    "latency": "inference latency of the deployed form (ms)",
    "step_time": "training step time (ms)",
    "memory": "the trial's peak memory (MB)",
}
FORM_ORDER = ("none", "adapter", "mh_adapter", "lora", "prefix", "compacter")
TOP_IMPORTANCES = 15


def _figure(kind: str, **kw) -> Figure:
    w, h = SIZES[kind]
    fig = Figure(figsize=(w / DPI, h / DPI), dpi=DPI, layout="constrained", **kw)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _offsets():
    """Label offsets (points) to try, nearest first: right/left of the point, above/below."""
    yield from ((dx, dy) for k in range(10) for dy in (6 + 11 * k, -14 - 11 * k) for dx in (6, -6))


def _place_labels(ax, items: list[tuple[float, float, str]], color: str, taken: list) -> None:
    """Annotate (x, y, text) items, each at the nearest offset where its label stays inside the
    axes and overlaps no box in ``taken`` (the labels placed before)."""
    renderer = ax.figure.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    for x, y, text in sorted(items, key=lambda i: (i[0], i[1])):
        ann = None
        for dx, dy in _offsets():
            if ann is not None:
                ann.remove()
            far = abs(dy) > 20
            ann = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=8,
                color=color,
                ha="left" if dx > 0 else "right",
                arrowprops=dict(arrowstyle="-", color=color, lw=0.5, alpha=0.6) if far else None,
            )
            box = ann.get_window_extent(renderer)
            if (
                box.x0 >= inside.x0
                and box.x1 <= inside.x1
                and box.y0 >= inside.y0
                and box.y1 <= inside.y1
                and not any(box.overlaps(b) for b in taken)
            ):
                break
        taken.append(ann.get_window_extent(renderer))


def _leading(x: float) -> int:
    """The leading digit of a tick value (label 1, 2, 5 × 10^k on log axes)."""
    return round(x / 10 ** math.floor(math.log10(x))) if x > 0 else 0


def _count(n: float, _=None) -> str:
    return f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k" if n >= 1e3 else f"{n:g}"


def x_axis(view: StudyView) -> tuple[tuple[str, dict], tuple[float, float]]:
    """The Pareto plot's x scale and limits: log, from below the smallest count to above the largest
    (or the budget); with a trial that trains only the head (0 deployable), log down to the smallest
    count and linear from there to 0, so that trial is drawn at 0."""
    xs = [p.deployable for p in view.points if p.deployable > 0] + ([view.budget] if view.budget else [])
    xs = xs or [1]
    if any(p.deployable == 0 for p in view.points):
        return ("symlog", {"linthresh": min(xs) / 1.8, "linscale": 0.4}), (-min(xs) / 10, max(xs) * 1.8)
    return ("log", {}), (min(xs) / 1.8, max(xs) * 1.8)


def pareto(view: StudyView) -> bytes:
    """Search score vs deployable parameters (log x): every complete trial, the front, the presets
    (labelled), the budget, and the held-out re-evaluations (mean ± std). With cost objectives, the
    staircase joins the front's members no other beats on score and parameters alone; the members
    a cost keeps on the front are drawn beside it, unjoined."""
    fig = _figure("pareto")
    ax = fig.add_subplot()
    (scale, scale_kwargs), xlim = x_axis(view)
    ax.set_xscale(scale, **scale_kwargs)
    _draw_trials(ax, view)
    _draw_front(ax, view)
    _draw_sweep(ax, view)
    _draw_marked(ax, view)
    _draw_finals(ax, view)
    _draw_budget(ax, view)
    _pareto_axes(ax, view, scale, xlim)
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)  # never over a point
    fig.canvas.draw()  # fix the layout, then place labels in final coordinates
    fig.set_layout_engine("none")
    _label_front_and_presets(ax, view)
    return _png(fig)


def _draw_trials(ax, view: StudyView) -> None:
    """Every complete trial off the front; those that did not learn as crosses; the trivial baseline."""
    others = [p for p in view.points if not p.on_front and not p.did_not_learn]
    ax.scatter(
        [p.deployable for p in others],
        [p.score for p in others],
        s=22,
        color="0.6",
        alpha=0.7,
        label="complete trial",
        zorder=2,
    )
    flat = [p for p in view.points if p.did_not_learn]
    if flat:
        ax.scatter(
            [p.deployable for p in flat],
            [p.score for p in flat],
            s=26,
            marker="x",
            color="0.45",
            label="did not learn (within noise of the baseline)",
            zorder=2,
        )
    if view.baseline:
        ax.axhline(
            view.baseline["score"],
            color="0.3",
            ls=":",
            lw=1.2,
            zorder=1,
            label=f"trivial baseline: {view.baseline['what']}",
        )


def _staircase(ax, points: list, fmt: str, color: str, lw: float, label: str) -> list:
    """Draw the front of ``points`` (score and parameters alone) as a staircase; returns its members."""
    steps = pareto_front(points, score=lambda p: p.score, size=lambda p: p.deployable)
    ax.plot(
        [p.deployable for p in steps],
        [p.score for p in steps],
        fmt,
        drawstyle="steps-post",
        color=color,
        markersize=6,
        lw=lw,
        label=label,
        zorder=3,
    )
    return steps


def _draw_front(ax, view: StudyView) -> None:
    """The front's staircase (score and parameters), and the members only a cost keeps on it."""
    front = view.front
    steps = _staircase(ax, front, "-o", "tab:blue", 1.2, "Pareto front (search score)")
    by_costs = [p for p in front if p not in steps]  # on the front by a cost this plot does not show
    if by_costs:
        ax.scatter(
            [p.deployable for p in by_costs],
            [p.score for p in by_costs],
            s=40,
            facecolors="none",
            edgecolors="tab:blue",
            linewidths=1.4,
            zorder=3,
            label=f"on the front by {', '.join(view.cost_objectives)} (see the Costs figure)",
        )


def _draw_sweep(ax, view: StudyView) -> None:
    """The LoRA rank sweep: its points and its own front."""
    if not view.sweep:
        return
    _staircase(
        ax, [p for p in view.sweep if not p.did_not_learn], "--^", "tab:green", 1.0, "LoRA rank sweep (its front)"
    )
    ax.scatter(
        [p.deployable for p in view.sweep],
        [p.score for p in view.sweep],
        marker="^",
        s=30,
        color="tab:green",
        alpha=0.5,
        zorder=3,
    )


def _draw_marked(ax, view: StudyView) -> None:
    """The supernet's proposals and the presets, each marked its own way."""
    oneshot = [p for p in view.points if p.group == "oneshot"]
    if oneshot:
        ax.scatter(
            [p.deployable for p in oneshot],
            [p.score for p in oneshot],
            marker="s",
            s=34,
            facecolors="none",
            edgecolors="tab:purple",
            linewidths=1.4,
            label="one-shot proposal (read off the supernet)",
            zorder=4,
        )
    ax.scatter(
        [p.deployable for p in view.presets],
        [p.score for p in view.presets],
        marker="D",
        s=46,
        facecolors="none",
        edgecolors="tab:orange",
        linewidths=1.6,
        label="preset (seeded trial)",
        zorder=4,
    )


def _draw_finals(ax, view: StudyView) -> None:
    """The held-out re-evaluations (mean ± std), each joined to its search score."""
    finals = view.reevaluated
    if finals:
        seeds = finals[0].final.get("seeds") or len(finals[0].final.get("scores", []))
        ax.errorbar(
            [p.deployable for p in finals],
            [p.final["mean"] for p in finals],
            yerr=[p.final.get("std") or 0.0 for p in finals],
            fmt="s",
            color="black",
            markersize=5,
            capsize=4,
            lw=1.2,
            label=(
                "re-evaluated: test score (1 seed)" if seeds == 1 else f"re-evaluated: test mean ± std ({seeds} seeds)"
            ),
            zorder=5,
        )
        for p in finals:
            ax.plot([p.deployable] * 2, [p.score, p.final["mean"]], ":", color="black", lw=0.8, zorder=1)


def _draw_budget(ax, view: StudyView) -> None:
    if view.budget:
        pct = view.pct(view.budget)
        ax.axvline(
            view.budget,
            color="tab:red",
            ls="--",
            lw=1.2,
            zorder=1,
            label=f"budget {view.budget:,}" + (f" ({pct:.2f}% of the backbone)" if pct else ""),
        )


def _pareto_axes(ax, view: StudyView, scale: str, xlim) -> None:
    """Limits with room for the labels, counts on x (and % of the backbone on top), titles, grid."""
    ax.set_xlim(*xlim)
    ys = [p.score for p in view.points] + [
        p.final["mean"] + s * (p.final.get("std") or 0) for p in view.reevaluated for s in (-1, 1)
    ]
    ys += [view.baseline["score"]] if view.baseline else []
    span = max(ys) - min(ys) or 0.05
    ax.set_ylim(min(ys) - 0.1 * span, max(ys) + 0.25 * span)  # room for the labels
    ax.xaxis.set_major_formatter(_count)
    ax.xaxis.set_minor_formatter(lambda n, _: _count(n) if _leading(n) in (2, 5) else "")
    if view.backbone_params and scale != "symlog":  # matplotlib maps a secondary axis linearly on symlog
        top = ax.secondary_xaxis(
            "top", functions=(lambda n: 100 * n / view.backbone_params, lambda pct: pct * view.backbone_params / 100)
        )
        top.xaxis.set_major_formatter(lambda v, _: f"{v:g}%")
        top.xaxis.set_minor_formatter(lambda v, _: f"{v:g}%" if _leading(v) in (2, 5) else "")
        top.set_xlabel("% of the backbone's parameters")
    ax.set_xlabel("deployable parameters (log scale" + (", linear from 0" if scale == "symlog" else "") + ")")
    ax.set_ylabel(f"{view.metric} (search dev; test where re-evaluated)")
    ax.set_title(f"Pareto front of study {view.name!r}: {view.metric} vs deployable parameters", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)


def _label_front_and_presets(ax, view: StudyView) -> None:
    """The front's trial numbers and the presets' names beside their points, never over each other."""
    taken: list = []
    groups: dict[tuple[int, float], list[str]] = {}
    for p in view.presets:
        groups.setdefault((p.deployable, p.score), []).append(p.preset)
    labels = [(x, y, ", ".join(names)) for (x, y), names in groups.items()]
    _place_labels(ax, [(p.deployable, p.score, f"#{p.number}") for p in view.front], "tab:blue", taken)
    _place_labels(ax, labels, "tab:orange", taken)


def hypervolume(history: dict, metric: str) -> bytes:
    """Hypervolume after each complete trial: by trial number (left), by wall time (right)."""
    fig = _figure("hypervolume")
    left, right = fig.subplots(1, 2)
    n, hv = zip(*history["by_number"])
    left.plot(n, hv, drawstyle="steps-post", marker=".", color="tab:purple")
    left.set_xlabel("trial number")
    t, hv_t = zip(*history["by_time"])
    right.plot([s / 60 for s in t], hv_t, drawstyle="steps-post", marker=".", color="tab:purple")
    right.set_xlabel("wall time since the study's first trial (minutes)")
    ref_score, ref_params = history["reference"]
    for ax in (left, right):
        ax.set_ylabel(f"hypervolume ({metric} × decades)")
        ax.grid(True, alpha=0.3)
    fig.suptitle(
        f"Hypervolume of (search {metric} ↑, log10 deployable parameters ↓) from the reference "
        f"point ({metric} {ref_score:.4g}, {ref_params:,.0f} parameters)",
        fontsize=10,
    )
    return _png(fig)


def importance(ranked: list[tuple[str, float]], metric: str) -> bytes:
    """The most important parameters for a high search score, as horizontal bars."""
    fig = _figure("importance")
    ax = fig.add_subplot()
    top = ranked[:TOP_IMPORTANCES][::-1]
    ax.barh([k for k, _ in top], [v for _, v in top], color="tab:green")
    ax.set_xlabel(f"importance for a high search {metric} (PED-ANOVA, sums to 1 over all parameters)")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title(f"Parameter importances (top {len(top)} of {len(ranked)})", fontsize=11)
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def forms(rows_by_position: dict[str, list[dict]], metric: str) -> bytes:
    """Per position (attention, FFN): the forms and sizes the trials used, coloured by score;
    Pareto-front members ringed in red."""
    fig = _figure("forms")
    axes = fig.subplots(1, 2, sharey=True)
    scores = [r["score"] for rows in rows_by_position.values() for r in rows]
    lo, hi = (min(scores), max(scores)) if scores else (0.0, 1.0)
    hi = hi if hi > lo else lo + 1e-6
    sc = None
    for ax, (pos, rows) in zip(axes, rows_by_position.items()):
        seen = {r["form"] for r in rows}
        order = [f for f in FORM_ORDER if f in seen] + sorted(seen - set(FORM_ORDER)) or ["none"]  # new forms last
        labels = []
        for i, form in enumerate(order):
            these = [r for r in rows if r["form"] == form]
            on_front = sum(r["on_front"] for r in these)
            labels.append(f"{form}\n{len(these)} trials" + (f"\n{on_front} on front" if on_front else ""))
            sized = sorted((r for r in these if r["size"]), key=lambda r: r["score"])  # best on top
            if not sized:
                continue
            # Spread points sideways a little (deterministic) so equal sizes stay visible.
            xs = [i + 0.5 * ((r["number"] * 0.618034) % 1 - 0.5) for r in sized]
            sc = ax.scatter(
                xs,
                [r["size"] for r in sized],
                c=[r["score"] for r in sized],
                cmap="viridis",
                vmin=lo,
                vmax=hi,
                s=36,
                edgecolors=["tab:red" if r["on_front"] else "none" for r in sized],
                linewidths=1.8,
                zorder=3,
            )
        ax.set_xticks(range(len(order)), labels, fontsize=8)
        ax.set_xlim(-0.6, len(order) - 0.4)
        ax.set_yscale("log")
        ax.set_title({"attn": "attention sublayer", "ffn": "FFN sublayer"}.get(pos, pos), fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("size (bottleneck r / rank r / length l)")
    if sc is not None:
        fig.colorbar(sc, ax=list(axes), label=f"search {metric}")
    fig.suptitle("Which forms and sizes the trials used, per position (red ring: Pareto front)", fontsize=10)
    return _png(fig)


def costs(view: StudyView) -> bytes:
    """The front in its further objectives: search score against each measured cost the study
    minimises, coloured by deployable parameters (log); members of the study's front (all its
    objectives at once) ringed in red, trials that did not learn as crosses."""
    names = view.cost_objectives
    fig = _figure("costs")
    axes = fig.subplots(1, len(names), sharey=True, squeeze=False)[0]
    learned = [p for p in view.points if not p.did_not_learn and all(n in p.costs for n in names)]
    flat = [p for p in view.points if p.did_not_learn and all(n in p.costs for n in names)]
    sizes = [math.log10(max(p.deployable, 1)) for p in learned] or [0.0]
    sc = None
    for ax, name in zip(axes, names):
        sc = ax.scatter(
            [p.costs[name] for p in learned],
            [p.score for p in learned],
            c=sizes[: len(learned)],
            cmap="viridis",
            vmin=min(sizes),
            vmax=max(sizes) + 1e-6,
            s=36,
            zorder=3,
            edgecolors=["tab:red" if p.on_front else "none" for p in learned],
            linewidths=1.8,
        )
        ax.scatter([p.costs[name] for p in flat], [p.score for p in flat], marker="x", color="0.45", s=26, zorder=2)
        for p in learned:
            if p.on_front:
                ax.annotate(
                    f"#{p.number}",
                    (p.costs[name], p.score),
                    textcoords="offset points",
                    xytext=(5, 4),
                    fontsize=7,
                    color="tab:red",
                )
        if view.baseline:
            ax.axhline(view.baseline["score"], color="0.3", ls=":", lw=1.2, zorder=1)
        ax.set_xlabel(COST_LABELS[name])
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel(f"search {view.metric}")
    one_size = len({p.deployable for p in learned}) == 1  # a colour scale of one value says nothing
    if sc is not None and not one_size:
        fig.colorbar(sc, ax=list(axes), label="log10 deployable parameters")
    fig.suptitle(
        f"Search {view.metric} against the measured costs the study minimises "
        f"(red ring: on the front of all {2 + len(names)} objectives)"
        + (f"; every trial has {learned[0].deployable:,} deployable parameters" if one_size else ""),
        fontsize=10,
    )
    return _png(fig)


__all__ = ["pareto", "hypervolume", "importance", "forms", "costs", "SIZES", "DPI"]
