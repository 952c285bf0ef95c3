"""Split GLUE QNLI's labelled dev file into train and test files for a file task.

The data folder has no QNLI train.tsv (../shared/data/glue/README.md), so a QNLI yardstick takes
its rows from dev.tsv: a seeded shuffle, the first half as the training file (K rows and
search-dev are drawn from it), the second half as the test split. Rows are written as read (GLUE's
TSV: no quoting), header included.

    python experiments/rates/qnli_split.py ../shared/data/glue/QNLI/dev.tsv runs/qnli_split
"""

from __future__ import annotations

import random
import sys
from pathlib import Path


def split(source: Path, out: Path, seed: int = 0) -> tuple[int, int]:
    header, *rows = source.read_text(encoding="utf-8").splitlines()
    random.Random(seed).shuffle(rows)
    half = len(rows) // 2
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.tsv", rows[:half]), ("test.tsv", rows[half:])):
        (out / name).write_text("\n".join([header, *part]) + "\n", encoding="utf-8")
    return half, len(rows) - half


if __name__ == "__main__":
    train, test = split(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{sys.argv[2]}: train.tsv {train:,} rows, test.tsv {test:,} rows")
