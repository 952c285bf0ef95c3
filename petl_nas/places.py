"""Where things are on this machine, found without importing torch (so `petl-nas doctor` can say it
when torch is broken): the GLUE data folders and whether the Hugging Face hub answers.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

GLUE_FOLDERS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE")


def glue_candidates() -> list[Path]:
    """Where a GLUE directory is looked for, in order: $GLUE_DIR, ``../shared/data/glue`` next to
    the source checkout and next to the working directory, ``./glue_data``, ``./data/glue``,
    ``~/glue_data``."""
    repo = Path(sys.modules[__name__.partition(".")[0]].__file__).resolve().parent.parent  # the checkout
    found = [Path(os.environ["GLUE_DIR"])] if os.environ.get("GLUE_DIR") else []
    found += [
        repo.parent / "shared" / "data" / "glue",
        Path.cwd().parent / "shared" / "data" / "glue",
        Path.cwd() / "glue_data",
        Path.cwd() / "data" / "glue",
        Path.home() / "glue_data",
    ]
    unique: list[Path] = []
    for p in found:
        if p.resolve() not in [u.resolve() for u in unique]:
            unique.append(p)
    return unique


def glue_tasks(folder: Path) -> list[str]:
    """The GLUE task folders (``SST-2``, ``CoLA``, ...) under ``folder`` that a search can use: a
    train.tsv and a dev.tsv (a folder with only dev and test files trains nothing)."""
    return [t for t in GLUE_FOLDERS if all((Path(folder) / t / f).is_file() for f in ("train.tsv", "dev.tsv"))]


def hub_status(timeout: float = 3.0) -> tuple[bool, str]:
    """(reachable, why): offline when HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set, else one HEAD request."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes", "on"):
            return False, f"offline ({var}={os.environ[var]})"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return True, f"{endpoint} answers"
    except (OSError, ValueError) as e:
        return False, f"{endpoint} unreachable ({type(getattr(e, 'reason', e)).__name__})"
    return True, f"{endpoint} answers"


__all__ = ["GLUE_FOLDERS", "glue_candidates", "glue_tasks", "hub_status"]
