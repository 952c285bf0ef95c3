"""Tokenised data: a split as token ids, padded batch by batch; encoded once per process.

A worker running many trials tokenises each (tokenizer, task, data, K, seed, max length) once:
the result is kept in the same in-process cache as the splits (`tasks.clear_cache` empties both).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator

import torch

from .config import ConfigError
from .tasks import _CACHE, Split, Task, TaskSplits


@dataclass(frozen=True, eq=False)
class EncodedSplit:
    """One split as unpadded token ids; `batches` pads each batch to its own longest row."""

    input_ids: tuple[list[int], ...]
    token_type_ids: tuple[list[int], ...] | None
    labels: torch.Tensor              # [N] long (classification) or float (regression)
    pad_token_id: int

    def __len__(self) -> int:
        return len(self.input_ids)

    def batches(self, batch_size: int, shuffle: bool = False, seed: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """Padded batches of ``input_ids``, ``attention_mask`` (``token_type_ids``), ``labels``.

        Example:
            >>> batch = next(encoded.train.batches(32, shuffle=True, seed=0))  # doctest: +SKIP
            >>> batch["input_ids"].shape                                      # doctest: +SKIP
            torch.Size([32, 41])
        """
        order = (torch.randperm(len(self), generator=torch.Generator().manual_seed(seed)) if shuffle
                 else torch.arange(len(self)))
        for start in range(0, len(self), batch_size):
            rows = order[start:start + batch_size].tolist()
            width = max(len(self.input_ids[i]) for i in rows)
            ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            types = torch.zeros((len(rows), width), dtype=torch.long) if self.token_type_ids else None
            for j, i in enumerate(rows):
                n = len(self.input_ids[i])
                ids[j, :n] = torch.tensor(self.input_ids[i])
                mask[j, :n] = 1
                if types is not None:
                    types[j, :n] = torch.tensor(self.token_type_ids[i])
            batch = {"input_ids": ids, "attention_mask": mask}
            if types is not None:
                batch["token_type_ids"] = types
            batch["labels"] = self.labels[rows]
            yield batch


@dataclass(frozen=True, eq=False)
class EncodedSplits:
    """`TaskSplits` after tokenisation, same three splits."""

    task: Task
    train: EncodedSplit
    search_dev: EncodedSplit
    test: EncodedSplit
    max_length: int


def _tokenizer_key(tokenizer) -> tuple:
    name = getattr(tokenizer, "name_or_path", "")
    if not name:  # an in-memory tokenizer has no path: identify it by its vocabulary
        vocab = sorted(tokenizer.get_vocab().items())
        name = "vocab:" + hashlib.sha1(repr(vocab).encode()).hexdigest()
    return name, len(tokenizer)


def _encode_split(split: Split, tokenizer, max_length: int, kind: str) -> EncodedSplit:
    dtype = torch.long if kind == "classification" else torch.float32
    if not len(split):
        return EncodedSplit((), None, torch.zeros(0, dtype=dtype), tokenizer.pad_token_id)
    enc = tokenizer(*[list(col) for col in split.texts], truncation=True, max_length=max_length)
    types = enc.get("token_type_ids")
    return EncodedSplit(tuple(enc["input_ids"]), tuple(types) if types is not None else None,
                        torch.from_numpy(split.labels.copy()).to(dtype), tokenizer.pad_token_id)


def encode(splits: TaskSplits, tokenizer, max_length: int = 128) -> EncodedSplits:
    """Tokenise the three splits once per process (cached by tokenizer, data and ``max_length``).

    Example:
        >>> encoded = encode(load_splits("demo_sentiment"), tokenizer, max_length=64)  # doctest: +SKIP
    """
    if tokenizer.pad_token_id is None:
        raise ConfigError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no pad token; "
                          "set tokenizer.pad_token before encoding")
    key = ("encoded", _tokenizer_key(tokenizer), splits.key, max_length)
    if key not in _CACHE:
        parts = [_encode_split(s, tokenizer, max_length, splits.task.kind)
                 for s in (splits.train, splits.search_dev, splits.test)]
        _CACHE[key] = EncodedSplits(splits.task, *parts, max_length)
    return _CACHE[key]


__all__ = ["EncodedSplit", "EncodedSplits", "encode"]
