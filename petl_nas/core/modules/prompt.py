"""Prompt tuning: l learned input embeddings, inserted at a fixed index of the input.

Encoders (and the encoder of an encoder-decoder) get them right after the first token, which keeps
[CLS]/<s> at position 0 where BERT-style pooling heads read the sequence representation. A
decoder-only model gets them before every token (the sequence then starts with the prompt, as in
Lester et al.), and the prompt positions are cut from the base model's output again, so heads,
labels and pooling see the original length. The attention masks and token types grow with it.

Under the one-shot supernet, ``position_gate`` returns one gate value per position: a forward
inserts only the open positions (gate > 0), and `key_log_gate` gives every attention that reads
them log g to add to their logits, so a shut position is exactly absent and the tokens sit where
a prompt of the open positions alone would put them.
"""

from __future__ import annotations

import torch
from torch import nn


class SoftPrompt(nn.Module):
    def __init__(self, length: int, dim: int, at: int = 1):
        super().__init__()
        self.embeddings = nn.Parameter(torch.randn(length, dim) * 0.02)
        self.at = at  # insertion index: 1 after the first token, 0 first
        self.position_gate = None  # the supernet's gate per position (callable -> [length])
        self._open_log_gate: torch.Tensor | None = None  # this forward's log g of the inserted positions

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_open_log_gate": None}  # this forward's: not copied or pickled

    @property
    def n(self) -> int:
        """How many positions this forward inserts (under a position gate: the open ones)."""
        return self.embeddings.shape[0] if self._open_log_gate is None else self._open_log_gate.shape[0]

    def key_log_gate(self) -> tuple[int, torch.Tensor] | None:
        """(first index, log g per inserted position) for the attention logits, under a position gate."""
        if self._open_log_gate is None or self._open_log_gate.numel() == 0:
            return None
        return self.at, self._open_log_gate

    def _inserted(self) -> torch.Tensor:
        """The embeddings to insert: every position, or the open ones under a position gate."""
        if self.position_gate is None:
            return self.embeddings
        z = self.position_gate()
        keep = z > 0
        self._open_log_gate = z[keep].log()
        return self.embeddings[keep]

    def grow(self, t: torch.Tensor, fill=None) -> torch.Tensor:
        """Insert n columns at the prompt's index: ``fill``, or copies of the first column."""
        b, n = t.shape[0], self.n
        pad = t[:, :1].expand(b, n) if fill is None else torch.full((b, n), fill, dtype=t.dtype, device=t.device)
        return torch.cat([t[:, : self.at], pad, t[:, self.at :]], dim=1)

    def shrink(self, t: torch.Tensor) -> torch.Tensor:
        """Drop the prompt positions of a [B, L+n, ...] tensor."""
        return torch.cat([t[:, : self.at], t[:, self.at + self.n :]], dim=1)

    def rewrite_inputs(
        self, model: nn.Module, args: tuple, kwargs: dict, ids_scale: float = 1.0
    ) -> tuple[tuple, dict, bool]:
        """Turn the model's (input_ids | inputs_embeds, mask, token types) into prompted inputs.

        ``ids_scale`` multiplies the embeddings of given ids, for a stack that scales them in its
        own forward only when given ids (Marian, Pegasus). Returns (args, kwargs, inserted). When a
        decoder cache already holds the prompt (generation after the first step) only the attention
        mask grows, and ``inserted`` is False.
        """
        if len(args) > 1:
            raise TypeError("prompt tuning: pass the model's inputs as keyword arguments")
        past = kwargs.get("cache", kwargs.get("past_key_values"))  # named cache from transformers 5.24
        if past is not None and past.get_seq_length() > 0:
            if kwargs.get("attention_mask") is not None:
                kwargs["attention_mask"] = self.grow(kwargs["attention_mask"], 1)
            if kwargs.get("position_ids") is not None:  # given positions do not count the prompt
                kwargs["position_ids"] = kwargs["position_ids"] + self.n
            return args, kwargs, False
        inserted = self._inserted()
        n = inserted.shape[0]
        if n == 0:  # every position shut: the inputs as they are
            return args, kwargs, False
        input_ids = args[0] if args else kwargs.pop("input_ids", None)
        embeds = kwargs.pop("inputs_embeds", None)
        if embeds is None:
            embeds = model.get_input_embeddings()(input_ids)
            if ids_scale != 1.0:
                embeds = embeds * ids_scale
        b = embeds.shape[0]
        prompt = inserted.to(embeds.dtype).expand(b, -1, -1)
        kwargs["inputs_embeds"] = torch.cat([embeds[:, : self.at], prompt, embeds[:, self.at :]], dim=1)
        for key, fill in (("attention_mask", 1), ("token_type_ids", None)):
            if kwargs.get(key) is not None:
                kwargs[key] = self.grow(kwargs[key], fill)
        positions = kwargs.pop("position_ids", None)
        if positions is not None and self.at == 0:  # the prompt takes 0..n-1, the tokens move up by n
            start = torch.arange(n, device=positions.device).expand(positions.shape[0], n)
            kwargs["position_ids"] = torch.cat([start, positions + n], dim=1)
        return (), kwargs, True  # (elsewhere positions are recomputed)

    def grow_encoder_mask(self, kwargs: dict) -> dict:
        """In a decoder: widen the cross-attention mask to encoder states that carry the prompt."""
        states, mask = kwargs.get("encoder_hidden_states"), kwargs.get("encoder_attention_mask")
        if states is not None and mask is not None and mask.shape[-1] + self.n == states.shape[1]:
            kwargs["encoder_attention_mask"] = self.grow(mask, 1)
        return kwargs
