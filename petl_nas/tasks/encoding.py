"""Tokenised data: a split as token ids, padded batch by batch; encoded once per process.

A worker running many trials tokenises each (tokenizer, task, data, K, seed, max length) once:
the result is kept in the same in-process cache as the splits (`tasks.clear_cache` empties both).
Classification and regression rows carry one label each; sequence-to-sequence rows carry target
token ids and causal-LM rows per-token labels (-100 where no loss is taken), padded with -100.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ..errors import ConfigError
from . import Split, Task, TaskSplits, cached


@dataclass(frozen=True, eq=False)
class EncodedSplit:
    """One split as unpadded token ids; `batches` pads each batch to its own longest row.

    Generation splits also keep ``label_ids`` (target ids, or per-token labels of a causal LM),
    the ``references`` to score decoded text against, and the ``tokenizer`` that decodes it.
    """

    input_ids: tuple[list[int], ...]
    token_type_ids: tuple[list[int], ...] | None
    labels: torch.Tensor  # [N] long (classification) or float (regression); empty otherwise
    pad_token_id: int
    label_ids: tuple[list[int], ...] | None = None
    references: tuple[str, ...] = ()
    tokenizer: Any = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def head(self, n: int | None) -> EncodedSplit:
        """The first ``n`` rows (all of them for None): a capped subset to score on."""
        if n is None or n >= len(self):
            return self
        cut = lambda rows: rows[:n] if rows is not None else None  # noqa: E731
        return EncodedSplit(
            self.input_ids[:n],
            cut(self.token_type_ids),
            self.labels[:n],
            self.pad_token_id,
            cut(self.label_ids),
            self.references[:n],
            self.tokenizer,
        )

    def by_length(self) -> torch.Tensor:
        """Row indices from shortest to longest: batches of similar lengths pad little."""
        return torch.tensor(sorted(range(len(self)), key=lambda i: len(self.input_ids[i])), dtype=torch.long)

    def bucketed_order(self, batch_size: int, seed: int, pool: int) -> torch.Tensor:
        """A seeded epoch order of every row once, in batches of similar lengths: rows are shuffled,
        each run of ``pool`` batches' worth of rows is sorted by length and cut into batches, and
        the batches are shuffled. ``pool`` trades padding (larger: less) for randomness (smaller:
        more); the last batch may be short, as with a plain shuffle."""
        g = torch.Generator().manual_seed(seed)
        rows = torch.randperm(len(self), generator=g).tolist()
        span = batch_size * pool
        batches = []
        for start in range(0, len(rows), span):
            chunk = sorted(rows[start : start + span], key=lambda i: len(self.input_ids[i]))
            batches += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
        full = [b for b in batches if len(b) == batch_size]
        short = [b for b in batches if len(b) < batch_size]  # at most one (the last pool's): kept last
        full = [full[i] for i in torch.randperm(len(full), generator=g).tolist()]
        return torch.tensor([i for b in full + short for i in b], dtype=torch.long)

    def batches(
        self,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        order: torch.Tensor | None = None,
        multiple: int = 1,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Padded batches of ``input_ids``, ``attention_mask`` (``token_type_ids``), ``labels``,
        in a seeded random order (``shuffle``), the given ``order`` of row indices, or as stored;
        each padded to its longest row rounded up to a ``multiple`` of tokens (few distinct shapes
        for CUDA graphs, `step_graphs`).

        Example:
            >>> batch = next(encoded.train.batches(32, shuffle=True, seed=0))  # doctest: +SKIP
            >>> batch["input_ids"].shape                                      # doctest: +SKIP
            torch.Size([32, 41])
        """
        for _, batch in self.row_batches(batch_size, shuffle, seed, order, multiple):
            yield batch

    def row_batches(
        self,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        order: torch.Tensor | None = None,
        multiple: int = 1,
    ) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
        """`batches`, each with the indices of its rows (what `frozen.FrozenReuse` feeds by)."""
        if order is None:
            order = (
                torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))
                if shuffle
                else torch.arange(len(self))
            )
        for start in range(0, len(self), batch_size):
            rows = order[start : start + batch_size].tolist()
            width = _round_up(max(len(self.input_ids[i]) for i in rows), multiple)
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
            if self.label_ids is not None:  # token labels, padded with -100 (no loss, no score)
                label_width = _round_up(max(len(self.label_ids[i]) for i in rows), multiple)
                batch["labels"] = torch.full((len(rows), label_width), -100, dtype=torch.long)
                for j, i in enumerate(rows):
                    batch["labels"][j, : len(self.label_ids[i])] = torch.tensor(self.label_ids[i])
            else:
                batch["labels"] = self.labels[rows]
            yield rows, batch


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


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


def _encode_generation(split: Split, tokenizer, max_length: int, task: Task) -> EncodedSplit:
    targets = tuple(str(t) for t in split.labels)
    if task.kind == "seq2seq":
        from .seq2seq import encode_pairs

        ids, label_ids = encode_pairs(split.texts[0], targets, tokenizer, max_length, task.seq2seq)
    else:
        from .causal_lm import encode_rows

        prompts = split.texts[0] if split.texts else [""] * len(targets)
        ids, label_ids = encode_rows(prompts, targets, tokenizer, max_length)
    return EncodedSplit(
        tuple(ids), None, torch.zeros(0, dtype=torch.long), tokenizer.pad_token_id, tuple(label_ids), targets, tokenizer
    )


def _encode_split(split: Split, tokenizer, max_length: int, task: Task) -> EncodedSplit:
    kind = task.kind
    if kind in ("seq2seq", "causal_lm"):
        return _encode_generation(split, tokenizer, max_length, task)
    dtype = torch.long if kind == "classification" else torch.float32
    if not len(split):
        return EncodedSplit((), None, torch.zeros(0, dtype=dtype), tokenizer.pad_token_id)
    enc = tokenizer(*[list(col) for col in split.texts], truncation=True, max_length=max_length)
    types = enc.get("token_type_ids")
    return EncodedSplit(
        tuple(enc["input_ids"]),
        tuple(types) if types is not None else None,
        torch.from_numpy(split.labels.copy()).to(dtype),
        tokenizer.pad_token_id,
    )


def encode(splits: TaskSplits, tokenizer, max_length: int = 128) -> EncodedSplits:
    """Tokenise the three splits once per process (cached by tokenizer, data and ``max_length``).

    Example:
        >>> encoded = encode(load_splits("demo_sentiment"), tokenizer, max_length=64)  # doctest: +SKIP
    """
    if tokenizer.pad_token_id is None:
        raise ConfigError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no pad token; "
            "set tokenizer.pad_token before encoding"
        )
    key = ("encoded", _tokenizer_key(tokenizer), splits.key, max_length)

    def make() -> EncodedSplits:
        parts = [
            _encode_split(s, tokenizer, max_length, splits.task) for s in (splits.train, splits.search_dev, splits.test)
        ]
        return EncodedSplits(splits.task, *parts, max_length)

    return cached(key, make)


__all__ = ["EncodedSplit", "EncodedSplits", "encode"]
