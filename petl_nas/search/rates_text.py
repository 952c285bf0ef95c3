"""What a study's rate calibration record says: a line per family (its rate and how it was found),
the scales its modules train at, and what calibration cost. Plain text from the stored record, for the
console, the report and the dashboard's note, with no model or backbone at hand."""

from __future__ import annotations

import math

from ..core.family_rates import scale_can_be_a_rate

__all__ = ["lines"]


def lines(record: dict) -> list[str]:
    """One line per family: its rate and how it was found; then what calibration cost."""
    out = []
    trained = record.get("rates", {})               # what each family trains at: said, whatever families says
    for family, f in record["families"].items():
        rate = trained.get(family, f["rate"])
        if "tried" in f:
            how = ", ".join(f"{r:.1e} {s:.4f}" if s > -math.inf else f"{r:.1e} diverged" for r, s in f["tried"])
            edge = ("; the best is at the edge of the rates tried: more runs (rates.share) may find a better one"
                    if f.get("edge") else "")
            out.append(f"rate {family}: {rate:.1e} (measured on {f['probe']}: {how}{edge})")
        else:
            out.append(f"rate {family}: {rate:.1e} (its starting rate {f['prior']:.1e} x {record['factor']:.2f}, "
                       f"the factor measured on the others; {f['why']})")
    folded = {f: v for f, v in (record.get("scales") or {}).items() if scale_can_be_a_rate(f)}
    if folded:                                         # (a multi-head adapter's scale is structure: not listed)
        out.append("scales: a fixed scale on a module whose output starts at zero is a rate of its own (under Adam, "
                   "s times the output projection's), so such modules train at the scale their family's rate was "
                   "measured at: " + ", ".join(f"{f} s={v:g}" for f, v in folded.items()))
    if record.get("source"):
        out.append(f"rates: from {record['source']}, not measured again")
    else:
        if record.get("planned"):
            share = f"{record['runs'] / record['planned']:.0%} of the {record['planned']} runs the study plans"
        else:                                        # a record from before calibration counted every run
            share = (f"{record['runs'] / record['trials']:.0%} of {record['trials']} trials" if record['trials'] else
                     "the study asks for no trials of the sampler's; the fewest a calibration takes")
        out.append(f"rates: calibration took {record['runs']} runs ({share}) and {record['cost_s'] / 60:.1f} min")
    return out
