"""What a combined preset's step costs against the sum of its parts' costs, from a recorded step table.

Owns one reading. Several presets combine modules that other presets use alone: Houlsby is two
sequential adapters and trained LayerNorms; MAM is a prefix and a scaled parallel adapter; UniPELT
is a prefix and a sequential adapter, plus LoRA for APL, each behind a gate. This script reads a
`bench/step_time.py` results table that was already measured. For each combined preset it adds up
the excess over the floor (ratio − 1) of the presets it is made of, and prints that sum beside the
preset's own measured ratio. Nothing is timed here. The parts are named in `PARTS`; where a part
has no preset of its own, that is stated:
- the attention adapter of Houlsby/Compacter is counted as the FFN one (same shape: d → d/16 → d);
- the trained LayerNorms are counted as Compacter++ minus one PHM adapter, solved from Compacter
  and Compacter++ together (2·phm + ln = Compacter, phm + ln = Compacter++);
- MAM's r = 512 and MAM (GLUE)'s r = 16 adapters are counted as the r = 48 scaled PA; prefix lengths
  10 and 16 are counted as the l = 30 prefix. A GPU A/B found l = 10 and l = 30 within 1.5%
  (`gpu_kernels_ab_h200.md`).

Where a target caps every preset at T times the floor, a preset made of k parts meets it only if
those parts cost on average at most (T − 1)/k each. The last column gives that cut for each part.

    python bench/preset_parts.py --table bench/results/step_time_gpu_h200_graphs.md --column "× floor, after" \
        [--target 1.30] [--out bench/results/preset_parts_h200.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from preset_trials import emit

# combined preset -> the (part, count) it is predicted from; "ln" and "phm" are solved in `excesses`
PARTS = {
    "houlsby": [("pfeiffer", 2), ("ln", 1)],
    "compacter": [("phm", 2), ("ln", 1)],
    "mam": [("prefix", 1), ("scaled_pa", 1)],
    "mam_glue": [("prefix", 1), ("scaled_pa", 1)],
    "unipelt_ap": [("prefix", 1), ("pfeiffer", 1)],
    "unipelt_apl": [("prefix", 1), ("pfeiffer", 1), ("lora", 1)],
}
NOTES = {
    "houlsby": "2 × sequential adapter (pfeiffer) + trained LayerNorms",
    "compacter": "2 × PHM adapter + trained LayerNorms (the two define both: no prediction)",
    "mam": "prefix l=30 + scaled PA (r=48 for r=512)",
    "mam_glue": "prefix (l=30 for 16) + scaled PA (r=48 for 16)",
    "unipelt_ap": "prefix (l=30 for 10) + sequential adapter; its gates are the rest",
    "unipelt_apl": "prefix + sequential adapter + LoRA q, v; its gates are the rest",
}
FIXED = {"ln"}  # a part no cut to the modules changes: the paper trains the LayerNorms


def read_ratios(table: Path, column: str) -> dict[str, float]:
    """Method name -> the number in ``column``, for the petl-nas rows (and the library-less rows) of
    the first Markdown table in ``table`` that has that column."""
    header, ratios = None, {}
    for line in table.read_text().splitlines():
        if not line.lstrip().startswith("|"):
            if ratios:
                break
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells if column in cells else None
        elif not set(cells[0]) <= set("-: "):
            row = dict(zip(header, cells))
            if row.get("library", "-") in ("petl-nas", "-"):
                try:
                    ratios[cells[0]] = float(row[column].replace(",", ""))
                except (KeyError, ValueError):
                    pass
    if not ratios:
        raise SystemExit(f"preset_parts: no table in {table} has a column {column!r}")
    return ratios


def excesses(ratios: dict[str, float]) -> dict[str, float]:
    """Each preset's excess over the floor (ratio − 1), plus the trained LayerNorms ("ln") and one PHM
    adapter ("phm") solved from Compacter (2·phm + ln) and Compacter++ (phm + ln) where both were
    measured."""
    excess = {name: r - 1 for name, r in ratios.items()}
    if "compacter" in excess and "compacter_pp" in excess:
        excess["phm"] = excess["compacter"] - excess["compacter_pp"]
        excess["ln"] = excess["compacter_pp"] - excess["phm"]
    return excess


def rows(ratios: dict[str, float], target: float) -> list[dict]:
    """One row per combined preset whose parts were all measured."""
    excess, out = excesses(ratios), []
    for name, parts in PARTS.items():
        if name not in excess or any(p not in excess for p, _ in parts):
            continue
        predicted = sum(n * excess[p] for p, n in parts)
        fixed = sum(n * excess[p] for p, n in parts if p in FIXED)
        pieces = sum(n for p, n in parts if p not in FIXED)
        allowed, now = (target - 1 - fixed) / pieces, (predicted - fixed) / pieces
        out.append(
            {
                "preset": name,
                "made of": NOTES[name],
                "measured": f"{ratios[name]:.2f}",
                "1 + sum of parts": f"{1 + predicted:.2f}",
                "rest": f"{excess[name] - predicted:+.2f}",
                "a part's excess now (mean)": f"{now:.3f}",
                f"a part's excess for ≤ {target:.2f}×": f"{allowed:.3f}",
                "cut each part needs": f"{max(0.0, 1 - allowed / now):.0%}",
            }
        )
    return out


def markdown(rows: list[dict], intro: str) -> str:
    head = list(rows[0])
    lines = [
        intro,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|",
    ]
    lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True, help="a bench/step_time.py results file")
    ap.add_argument("--column", required=True, help="the ratio column to read, e.g. '× floor, after'")
    ap.add_argument("--target", type=float, default=1.30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    ratios = read_ratios(args.table, args.column)
    parts = rows(ratios, args.target)
    if not parts:
        print(f"preset_parts: {args.table} lacks the presets to compare", file=sys.stderr)
        return 1
    excess = excesses(ratios)
    singles = ", ".join(
        f"{n} {excess[n]:+.3f}" for n in ("pfeiffer", "scaled_pa", "prefix", "lora", "phm", "ln") if n in excess
    )
    intro = (
        f"Read from `{args.table.as_posix()}`, column \"{args.column}\" (nothing timed here). "
        f"Each part's excess over the floor: {singles}."
    )
    emit(markdown(parts, intro), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
