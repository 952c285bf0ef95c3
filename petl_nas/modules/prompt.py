"""Prompt tuning: l learned input embeddings, inserted right after the first token.

Inserting after the first token (not before it) keeps [CLS]/<s> at position 0, where BERT-style
pooling heads read the sequence representation. The attention mask and token types grow with it.
"""

from __future__ import annotations

import torch
from torch import nn


class SoftPrompt(nn.Module):
    def __init__(self, length: int, dim: int):
        super().__init__()
        self.embeddings = nn.Parameter(torch.randn(length, dim) * 0.02)

    def rewrite_inputs(self, model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Turn the model's (input_ids | inputs_embeds, mask, token types) into prompted inputs."""
        if len(args) > 1:
            raise TypeError("prompt tuning: pass the model's inputs as keyword arguments")
        input_ids = args[0] if args else kwargs.pop("input_ids", None)
        embeds = kwargs.pop("inputs_embeds", None)
        if embeds is None:
            embeds = model.get_input_embeddings()(input_ids)
        b, n = embeds.shape[0], self.embeddings.shape[0]
        prompt = self.embeddings.to(embeds.dtype).expand(b, -1, -1)
        kwargs["inputs_embeds"] = torch.cat([embeds[:, :1], prompt, embeds[:, 1:]], dim=1)
        for key, fill in (("attention_mask", 1), ("token_type_ids", None)):
            t = kwargs.get(key)
            if t is not None:
                pad = t[:, :1].expand(b, n) if fill is None else torch.full((b, n), fill, dtype=t.dtype,
                                                                            device=t.device)
                kwargs[key] = torch.cat([t[:, :1], pad, t[:, 1:]], dim=1)
        kwargs.pop("position_ids", None)  # positions are recomputed for the longer sequence
        return (), kwargs
