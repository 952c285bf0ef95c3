"""What a study's rate calibration record says: a table of the families (its rate and how it was
found), the scales its modules train at, and what calibration cost. Plain text from the stored record, for the
console, the report and the dashboard's note, with no model or backbone at hand."""

from __future__ import annotations

import math

from ..console import detail, table, verbose
from ..core.family_rates import scale_can_be_a_rate

__all__ = ["lines"]


def lines(record: dict) -> list[str]:
    """A table of the families (rate, how it was chosen, the best score measured), each reason
    said once under it, the scales, then what calibration cost; with ``--verbose``, every rate tried."""
    trained = record.get("rates", {})  # what each family trains at: said, whatever families says
    rows, notes = [], {}

    def note(text: str) -> str:
        return f"[{notes.setdefault(text, len(notes) + 1)}]"

    for family, f in record["families"].items():
        rate = trained.get(family, f["rate"])
        if "tried" in f:
            best = max((s for _, s in f["tried"]), default=-math.inf)
            how = f"measured on {f['probe']}, {len(f['tried'])} rate{'s' * (len(f['tried']) != 1)}"
            if f.get("edge"):
                how += " " + note(
                    "the best is at the edge of the rates tried: more runs (rates.share) may find a better one"
                )
            rows.append([family, f"{rate:.1e}", how, f"{best:.4f}" if best > -math.inf else "diverged"])
        else:
            start = note("start x f: the family's starting rate times the factor measured on the others")
            rows.append(
                [
                    family,
                    f"{rate:.1e}",
                    f"start {f['prior']:.1e} x {record['factor']:.2f} {start}, {note(f['why'])}",
                    "-",
                ]
            )
    out = [
        "rates, the rate each family trains at:",
        *table(["family", "rate", "how chosen", "best score"], rows, right=(3,)),
        *(f"  {mark}" for mark in (f"[{n}] {text}" for text, n in notes.items())),
    ]
    if verbose():
        out += [
            f"  {family} tried: "
            + ", ".join(f"{r:.1e} {s:.4f}" if s > -math.inf else f"{r:.1e} diverged" for r, s in f["tried"])
            for family, f in record["families"].items()
            if "tried" in f
        ]
    folded = {f: v for f, v in (record.get("scales") or {}).items() if scale_can_be_a_rate(f)}
    if folded:  # (a multi-head adapter's scale is structure: not listed)
        out.append(
            "scales: "
            + ", ".join(f"{f} s={v:g}" for f, v in folded.items())
            + ", the scales their families' rates were measured at"
        )
        detail(
            out.append,
            "  a fixed scale on a module whose output starts at zero is a rate of its own (under "
            "Adam, s times the output projection's), so such modules train at that scale",
        )
    if record.get("source"):
        out.append(f"rates: from {record['source']}, not measured again")
    else:
        if record.get("planned"):
            share = f"{record['runs'] / record['planned']:.0%} of the {record['planned']} runs the study plans"
        else:  # a record from before calibration counted every run
            share = (
                f"{record['runs'] / record['trials']:.0%} of {record['trials']} trials"
                if record['trials']
                else "the study asks for no trials of the sampler's; the fewest a calibration takes"
            )
        out.append(f"rates: calibration took {record['runs']} runs ({share}) and {record['cost_s'] / 60:.1f} min")
    return out
