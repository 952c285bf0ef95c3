"""``rates.json``: a study's measured rates as a file, for a later study (a suite's other budgets)
to reuse. The rule: the file is the study's own record, checked by the one validation dialect on
reading (every rate and scale finite, positive and within `RATE_RANGE` / `SCALE_RANGE`), and
written again from the study's record whenever it is missing or differs from it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from ..fileio import atomic_write
from ..rules import between, check_fields

RATE_RANGE = (0.0, 1.0)  # a learning rate above 1 trains nothing under Adam: a typo or a damaged file
SCALE_RANGE = (0.0, 1000.0)  # a module's fixed output scale (LoRA's alpha / r 0.5 to 32; FourierFT's 140)


def check_record(record, path) -> None:
    """One `ConfigError` line naming ``path`` and the key, unless ``record`` holds rates (and
    scales) that a study can train at."""
    if not isinstance(record, dict) or not isinstance(record.get("rates"), dict) or not record["rates"]:
        raise ConfigError(f"rates.file {str(path)!r}: not a rates file (no rates of families in it)")
    check_fields(record["rates"], f"{path}: rates.", {f: between(*RATE_RANGE) for f in record["rates"]})
    scales = record.get("scales")
    if scales is not None:
        if not isinstance(scales, dict):
            raise ConfigError(f"{path}: scales: expected a mapping of family to scale, got {scales!r}")
        check_fields(scales, f"{path}: scales.", {f: between(*SCALE_RANGE) for f in scales})


def file_text(record: dict) -> str:
    """What ``rates.json`` holds for ``record`` (no runs: their specs name the study's own paths)."""
    return json.dumps({k: v for k, v in record.items() if k != "results"}, indent=2)


def write_file(record: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = file_text(record)
    atomic_write(path, lambda p: Path(p).write_text(text, encoding="utf-8"))


def keep_file(record: dict, path: Path) -> str | None:
    """Write ``path`` from the study's ``record`` where it is missing or says otherwise; what to
    say of it (None when it already held the record)."""
    try:
        held = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        held = None
    except (OSError, UnicodeDecodeError):
        held = ""
    if held == file_text(record):
        return None
    write_file(record, path)
    how = "was missing" if held is None else "differed from the study"
    return f"rates: {path} {how}; written again from its record"


__all__ = ["RATE_RANGE", "SCALE_RANGE", "check_record", "file_text", "keep_file", "write_file"]
