"""The registered attention function ``petl``: head-attention edits through transformers' interface.

transformers 5 models call ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, q, k, v,
mask, ...)``. Registering ``petl`` there (and, so that padding masks still arrive, the same name in
``AttentionMaskInterface``) lets prefix tuning and the multi-head adapter work on any model that
routes through the interface, with no copy of its attention code. Attention modules without edits
fall through to SDPA unchanged.

Prefix keys/values are stored per key/value head, so grouped-query attention shares them across each
group exactly as it shares the token keys; they get no relative position bias (T5) and no causal
mask. They never enter the KV cache: each call prepends them to whatever keys the cache returns, so
cached decoding sees the prefix exactly once per step, as a full forward does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .compose import Composition
from .mh_adapter import MultiHeadAdapter
from .prefix import PrefixEncoder

ATTENTION_NAME = "petl"
_EDITS_ATTR = "_petl_head_edits"


def _nothing() -> None:
    """What an edit reads where nothing was given (a module-level function: a copy or pickle keeps it)."""
    return None


@dataclass
class HeadEdits:
    """What one attention module adds: a prefix (with its layer slot) and/or a multi-head adapter.

    ``sublayer_input`` returns the attention sublayer's input x (what UniPELT's prefix gate reads) and
    ``pad_mask`` the current [B, L] padding mask (or None), both kept by `inject` per forward.
    ``prefix_gate`` (the one-shot supernet's) returns one gate value in [0, 1] per prefix position:
    a shut position is left out of the attention, an open one adds log g to its logits.
    ``key_gate`` (the supernet's, for a gated prompt) returns None or (start, log g [m]): the m
    token keys from ``start`` on are prompt positions and get log g added to their logits.
    """

    is_enabled: callable
    prefix: PrefixEncoder | None = None
    prefix_index: int = 0
    prefix_composition: str = "gated"
    prefix_compose: Composition | None = None
    mh: MultiHeadAdapter | None = None
    sublayer_input: callable = _nothing
    pad_mask: callable = _nothing
    prefix_gate: callable | None = None
    key_gate: callable | None = None


def attach(module: nn.Module, edits: HeadEdits) -> None:
    # Kept out of the module tree on purpose: the parameters live under `petl.`, not the backbone.
    module.__dict__[_EDITS_ATTR] = edits


def detach(module: nn.Module) -> None:
    module.__dict__.pop(_EDITS_ATTR, None)


def edits_of(module: nn.Module) -> HeadEdits | None:
    return module.__dict__.get(_EDITS_ATTR)


def _flat_query(query: torch.Tensor) -> torch.Tensor:
    b, h, l, d = query.shape
    return query.transpose(1, 2).reshape(b, l, h * d)  # gate input, [B, Lq, H·D]


def _prefix_mask(mask, query, key, n_prefix: int, causal: bool):
    """Extend a [B,1,Lq,Lk] mask with n_prefix always-visible columns (None stays None)."""
    lq, lk = query.shape[2], key.shape[2]
    if mask is None and causal:
        mask = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril(lk - lq)[None, None]
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        pad = torch.ones(*mask.shape[:-1], n_prefix, dtype=torch.bool, device=mask.device)
    else:
        pad = torch.zeros(*mask.shape[:-1], n_prefix, dtype=mask.dtype, device=mask.device)
    return torch.cat([pad, mask], dim=-1)


def gate_columns(head_dim: int, device: torch.device) -> int:
    """Feature columns a gate on the logits takes: one on a CPU; on a GPU as many as bring the head
    dim to a multiple of 8 (64 + 8), where cuDNN's attention kernel runs, instead of 64 + 1, which
    SDPA pads to the next head dim its flash kernel has (96)."""
    return 8 - head_dim % 8 if device.type == "cuda" else 1


def _with_feature(query, key, value, q_feature, k_feature):
    """q, k and v with one more feature, whose product ``q_feature``·``k_feature`` joins every logit
    (times the call's scaling), zero-padded to `gate_columns` columns; v padded alike."""
    extra = gate_columns(query.shape[-1], query.device)
    query = nn.functional.pad(torch.cat([query, q_feature], dim=-1), (0, extra - 1))
    key = nn.functional.pad(torch.cat([key, k_feature], dim=-1), (0, extra - 1))
    value = nn.functional.pad(value, (0, extra))  # same width for every kernel
    return query, key, value


def _with_gate_column(query, key, value, log_gate, n_prefix: int, scaling: float):
    """Add log g(x) to the prefix logits exactly, without a float mask.

    One extra feature: log g / scale on the query, 1 on prefix keys, 0 on token keys, so that
    [q, log g/s]·[k, 1]·s = q·k·s + log g on prefix columns only. The mask stays boolean (or None),
    which keeps SDPA on its fast kernels (a learned float mask forces the slow math path). Further
    zero columns (`gate_columns`) keep the head dim where those kernels want it.
    """
    b, h, lq, _ = query.shape
    extra_q = (log_gate.to(query.dtype) / scaling).unsqueeze(1).expand(b, h, lq, 1)  # [B,Lq,1] -> [B,H,Lq,1]
    marker = torch.zeros(b, key.shape[1], key.shape[2], 1, dtype=key.dtype, device=key.device)
    marker[:, :, :n_prefix] = 1
    return _with_feature(query, key, value, extra_q, marker)


def _with_key_gates(query, key, value, log_gate, scaling: float):
    """Add log g_j to the logits of key j exactly, without a float mask (``log_gate``: [Lk], 0
    where a key is not gated): one extra feature, 1/scale on the query and log g_j on key j, so
    that [q, 1/s]·[k_j, log g_j]·s = q·k_j·s + log g_j; further zero columns as `gate_columns` says."""
    b, h, lq, _ = query.shape
    marker = log_gate.to(key.dtype).view(1, 1, -1, 1).expand(b, key.shape[1], -1, 1)
    return _with_feature(query, key, value, query.new_full((b, h, lq, 1), 1.0 / scaling), marker)


def _key_log_gates(edits: HeadEdits, n_keys: int, n_prefix: int, prefix_log_gate, device: torch.device):
    """The [n_keys] log gates of one attention call's keys (``n_prefix`` prefix keys first, then the
    tokens): the prefix's per position, the prompt's at its token keys; None when neither gates."""
    prompt = edits.key_gate() if edits.key_gate is not None else None
    if prefix_log_gate is None and prompt is None:
        return None
    out = torch.zeros(n_keys, dtype=torch.float32, device=device)
    if prefix_log_gate is not None:
        out[:n_prefix] = prefix_log_gate
    if prompt is not None:
        start, log_g = prompt
        start += n_prefix
        out[start : start + log_g.shape[0]] = log_g
    return out


def _open_positions(kv: torch.Tensor, gate: torch.Tensor):
    """The prefix positions of ``kv`` [2, H_kv, l, D] whose gate is open (> 0) and the log of their
    gates; (None, None) when every position is shut, so that the layer computes exactly what the
    backbone does."""
    keep = gate > 0
    if not bool(keep.any()):
        return None, None
    return kv[:, :, keep], gate[keep].log()


def petl_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    edits = edits_of(module)
    if edits is None or not edits.is_enabled():
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    b = query.shape[0]
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    prefix_kv = kv = None
    gate = edits.prefix_compose.gate if edits.prefix_compose is not None else None
    log_position_gate = None
    if edits.prefix is not None:
        kv = edits.prefix.layer_pair(edits.prefix_index)  # [2, H_kv, l, D]
        if edits.prefix_gate is not None:  # the supernet's gate per position
            if gate is not None or edits.prefix_composition != "gated":
                raise ValueError("a prefix gated per position takes no other gate and composes by 'gated'")
            kv, log_position_gate = _open_positions(kv, edits.prefix_gate())
    if kv is not None:
        kv = kv.to(key.dtype)
        if gate is not None and gate.per == "example" and edits.prefix_composition == "gated":
            # UniPELT: one gate per example from the sublayer input scales P_K and P_V, both in one
            # product (its backward: one stack, and one product and sum per operand).
            g = gate(edits.sublayer_input(), edits.pad_mask()).view(b, 1, 1, 1, 1)
            prefix_kv = (kv * g.to(kv.dtype)).unbind(1)  # two [B, H_kv, l, D]
            gate = None
        else:
            prefix_kv = tuple(t.expand(b, -1, -1, -1) for t in kv.unbind(0))
    if prefix_kv is not None and edits.prefix_composition == "gated":
        # Plain prefix tuning: one softmax over [prefix; tokens] = He et al.'s λ(x)-gated sum.
        n = kv.shape[2]
        causal = bool(kwargs.pop("is_causal", getattr(module, "is_causal", False)))
        attention_mask = _prefix_mask(attention_mask, query, key, n, causal)
        if kwargs.get("position_bias") is not None:  # T5: no relative bias to the prefix
            kwargs["position_bias"] = nn.functional.pad(kwargs["position_bias"], (n, 0))
        key = torch.cat([prefix_kv[0], key], dim=2)
        value = torch.cat([prefix_kv[1], value], dim=2)
        kwargs["is_causal"] = False
        if gate is not None:  # log g per token on the prefix (UniPELT)
            if edits.key_gate is not None:
                raise ValueError("a gated prompt takes no per-token prefix gate in the same attention")
            head_dim = value.shape[-1]
            q, k, v = _with_gate_column(query, key, value, gate.log(_flat_query(query)), n, scaling)
            out, weights = sdpa_attention_forward(
                module, q, k, v, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
            out = out[..., :head_dim]
        else:
            out, weights = _attend(
                module,
                query,
                key,
                value,
                attention_mask,
                _key_log_gates(edits, key.shape[2], n, log_position_gate, key.device),
                dropout,
                scaling,
                **kwargs,
            )
    else:
        out, weights = _attend(
            module,
            query,
            key,
            value,
            attention_mask,
            _key_log_gates(edits, key.shape[2], 0, None, key.device),
            dropout,
            scaling,
            **kwargs,
        )  # out [B, Lq, H, D]
    if prefix_kv is not None and edits.prefix_composition != "gated":
        # The ungated variant: the prefix's own softmax attention, added (or scaled, gated) to h.
        rep = query.shape[1] // prefix_kv[0].shape[1]
        pk_, pv_ = (t.repeat_interleave(rep, dim=1) if rep > 1 else t for t in prefix_kv)
        delta = nn.functional.scaled_dot_product_attention(query, pk_, pv_, scale=scaling).transpose(1, 2)
        out = out + _compose_heads(edits.prefix_compose, delta, query, edits).to(out.dtype)
    if edits.mh is not None:
        delta = edits.mh(query, scaling).transpose(1, 2)  # [B, Lq, H, D]
        out = out + _compose_heads(edits.mh.compose, delta, query, edits).to(out.dtype)
    return out, weights


def _attend(module, query, key, value, attention_mask, log_gate, dropout, scaling, **kwargs):
    """SDPA, with ``log_gate`` ([Lk] or None: the supernet's) added to the logits of each key."""
    if log_gate is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    head_dim = value.shape[-1]
    q, k, v = _with_key_gates(query, key, value, log_gate, scaling)
    out, weights = sdpa_attention_forward(module, q, k, v, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return out[..., :head_dim], weights


def _compose_heads(compose: Composition, delta: torch.Tensor, query: torch.Tensor, edits: HeadEdits) -> torch.Tensor:
    if compose is None:
        return delta
    gate_input = _flat_query(query) if compose.gate is not None else None
    if gate_input is not None:
        gate_input = gate_input.unsqueeze(2)  # [B, Lq, 1, H·D] broadcasts over heads
    return compose(delta, gate_input, edits.pad_mask())


AttentionInterface.register(ATTENTION_NAME, petl_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
