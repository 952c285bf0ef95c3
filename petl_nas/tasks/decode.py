"""Decoding an encoded split with beam search and scoring the output against its references.

`generate_texts` runs ``model.generate`` batch by batch with a task's `Seq2SeqSettings` (beam
width, length limits, length penalty, n-gram blocking) and returns detokenised strings;
`evaluate_generation` scores them with the task's text metrics (ROUGE, sacreBLEU). Beam search is
the slow part of a generation trial, so both can stop after the first ``max_rows`` rows of a split
(the search's capped decoding subset; He et al. scored their dev checks on 1,600 rows).

Example:
    >>> evaluate_generation(model, encoded.search_dev, get_task("xsum"), 32, "cpu", max_rows=200)  # doctest: +SKIP
    {'rouge1': ..., 'rouge2': ..., 'rougeL': ...}
"""

from __future__ import annotations

import torch

from .seq2seq import language_start

__all__ = ["generate_texts", "evaluate_generation"]


def _pad_right(rows: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for j, r in enumerate(rows):
        ids[j, : len(r)] = torch.tensor(r)
        mask[j, : len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def generate_ids(model, input_ids: list[list[int]], tokenizer, settings, batch_size: int, device) -> list[list[int]]:
    """Beam-search output token ids (start token included, padding removed) for each source."""
    model.eval()
    extra = language_start(tokenizer, settings)
    out: list[list[int]] = []
    with torch.no_grad():
        for i in range(0, len(input_ids), batch_size):
            batch = {
                k: v.to(device) for k, v in _pad_right(input_ids[i : i + batch_size], tokenizer.pad_token_id).items()
            }
            seqs = model.generate(
                **batch, **settings.generate_kwargs(), pad_token_id=tokenizer.pad_token_id, **extra
            ).cpu()  # [b, <= max_length]
            for row in seqs.tolist():
                while row and row[-1] == tokenizer.pad_token_id:
                    row.pop()
                out.append(row)
    return out


def generate_texts(model, split, settings, batch_size: int, device, max_rows: int | None = None) -> list[str]:
    """Detokenised beam-search outputs for the first ``max_rows`` rows of an encoded split."""
    ids = generate_ids(model, list(split.head(max_rows).input_ids), split.tokenizer, settings, batch_size, device)
    texts = split.tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)
    return [t.strip() for t in texts]


def evaluate_generation(model, split, task, batch_size: int, device, max_rows: int | None = None) -> dict:
    """The task's text metrics of beam-search outputs against the split's reference strings."""
    predictions = generate_texts(model, split, task.seq2seq, batch_size, device, max_rows)
    return task.compute_metrics(predictions, split.references[: len(predictions)])
