"""A petl-nas pick as a transformers model: the file `petl-nas convert --to transformers-remote-code`
writes into its folder, which ``AutoModelForSequenceClassification.from_pretrained(folder,
trust_remote_code=True)`` runs (transformers' custom-code mechanism: ``auto_map`` in config.json
names the classes here). It imports only torch and transformers, so the folder loads without
petl-nas; trust_remote_code=True means the loader executes this file: read it first.

The backbone is its own transformers classifier (``AutoModelForSequenceClassification.from_config``
of the ``base`` config, trained biases, LayerNorms and head in its weights). The pick's modules are
rebuilt from the ``petl`` description in config.json and put on the backbone's named submodules by
hooks: bottleneck adapters (sequential: h + s·g·f(h·W_down)·W_up on a sublayer's output; parallel:
reads the sublayer's input x), Compacter's PHM projections (W = Σᵢ Aᵢ ⊗ sᵢtᵢᵀ, A shared), LoRA
(s·g·(x·Aᵀ)·Bᵀ), and, in the attention (a registered attention function), prefix keys and values
joined to the tokens' (per-example gate: σ(W·x + b) averaged over real tokens scales them) and the
multi-head adapter relu(q·Kᵀ·scaling)·V. A soft prompt goes after the first token; the classifier
reads the pooling the pick was trained with (mean over real tokens, or the first token).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface, AutoConfig, AutoModelForSequenceClassification, PreTrainedModel
from transformers.configuration_utils import PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "petl_carrier"
EDITS = "_petl_carrier_edits"  # an attention module's prefix / multi-head adapter (kept out of its tree)
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "swish": nn.SiLU, "identity": nn.Identity}


class PetlCarrierConfig(PretrainedConfig):
    """``base``: the backbone's config as a dict; ``petl``: the modules, where they sit, the pooling."""

    model_type = "petl_carrier"

    def __init__(self, base: dict | None = None, petl: dict | None = None, **kwargs):
        self.base, self.petl = base or {}, petl or {}
        super().__init__(**kwargs)


def gate_value(proj: nn.Linear, per: str, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """UniPELT's gate σ(W·x + b): per token, or its mean over each example's real tokens."""
    g = torch.sigmoid(proj(x))
    if per != "example":
        return g
    if mask is None or mask.shape != g.shape[:2]:
        return g.mean(dim=1, keepdim=True)
    m = mask.to(g.dtype)
    weights = (m / m.sum(dim=1, keepdim=True).clamp(min=1)).view(*mask.shape, *([1] * (g.ndim - 2)))
    return (g * weights).sum(dim=1, keepdim=True)


class Compose(nn.Module):
    """Δh times s (fixed, or a learned scalar) and times the gate read from ``x``."""

    def __init__(self, d: int, c: dict):
        super().__init__()
        self.fixed = c["scale"]
        self.scale = nn.Parameter(torch.tensor(float(c["scale"]))) if c.get("learned") else None
        self.per = c.get("gate")
        self.gate = nn.Linear(d, 1) if self.per else None

    def forward(self, delta, x=None, mask=None):
        delta = delta * (self.scale if self.scale is not None else self.fixed)
        return delta * gate_value(self.gate, self.per, x, mask) if self.gate is not None else delta


class PHMLinear(nn.Module):
    """x·W + b with W = Σᵢ kron(Aᵢ, sᵢ·tᵢᵀ); A (n×n×n) is the module's shared rule."""

    def __init__(self, rules: nn.ParameterDict, key: str, d_in: int, d_out: int, n: int, rank: int):
        super().__init__()
        # looked up at each call (loading replaces the parameter); in a list: not this layer's parameter
        self.rules, self.key, self.d_in, self.d_out = [rules], key, d_in, d_out
        self.s = nn.Parameter(torch.zeros(n, d_in // n, rank))
        self.t = nn.Parameter(torch.zeros(n, rank, d_out // n))
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x):
        w = torch.einsum("iab,ipq->apbq", self.rules[0][self.key], self.s @ self.t).reshape(self.d_in, self.d_out)
        return nn.functional.linear(x, w.t(), self.bias)


class Bottleneck(nn.Module):
    def __init__(self, m: dict, rules: nn.ParameterDict):
        super().__init__()
        d, r = m["dim"], m["size"]
        if m.get("phm"):
            key, n, rank = m["phm"]["rule"], m["phm"]["n"], m["phm"]["rank"]
            self.down, self.up = PHMLinear(rules, key, d, r, n, rank), PHMLinear(rules, key, r, d, n, rank)
        else:
            self.down, self.up = nn.Linear(d, r), nn.Linear(r, d)
        self.act = ACTIVATIONS[m["act"]]()
        self.compose = Compose(d, m["compose"])

    def forward(self, z, mask):
        return self.compose(self.up(self.act(self.down(z))), z, mask)


class LoRA(nn.Module):
    def __init__(self, m: dict, rules=None):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(m["size"], m["in"]))
        self.B = nn.Parameter(torch.zeros(m["out"], m["size"]))
        self.compose = Compose(m["in"], m["compose"])

    def forward(self, x, mask):
        return self.compose(x @ self.A.t(), x, mask) @ self.B.t()


class Prefix(nn.Module):
    """One layer's prefix keys and values [2, H_kv, l, D], joined to the tokens' in one softmax."""

    def __init__(self, m: dict, rules=None):
        super().__init__()
        self.kv = nn.Parameter(torch.zeros(2, m["kv_heads"], m["size"], m["head_dim"]))
        self.gate = nn.Linear(m["dim"], 1) if m.get("gate") else None


class MultiHeadAdapter(nn.Module):
    def __init__(self, m: dict, rules=None):
        super().__init__()
        self.keys = nn.Parameter(torch.zeros(m["heads"], m["size"], m["head_dim"]))
        self.values = nn.Parameter(torch.zeros(m["heads"], m["size"], m["head_dim"]))
        self.compose = Compose(m["heads"] * m["head_dim"], m["compose"])

    def forward(self, query, scaling):  # [B, H, Lq, D]
        return torch.relu(query @ (self.keys * scaling).transpose(-1, -2)) @ self.values


KINDS = {"bottleneck": Bottleneck, "lora": LoRA, "prefix": Prefix, "mh_adapter": MultiHeadAdapter}


def _with_prefix_columns(mask, n: int):
    """A [B, 1, Lq, Lk] mask with n always-visible columns first (None stays None)."""
    if mask is None:
        return None
    pad = (torch.ones if mask.dtype == torch.bool else torch.zeros)(
        *mask.shape[:-1], n, dtype=mask.dtype, device=mask.device
    )
    return torch.cat([pad, mask], dim=-1)


def carrier_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA with this attention's prefix and multi-head adapter, if it has them."""
    edits = module.__dict__.get(EDITS)
    if edits is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    prefix, mh, gate_input, mask = edits["prefix"], edits["mh"], edits["input"], edits["mask"]
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    if prefix is not None:
        b, kv = query.shape[0], prefix.kv.to(key.dtype)
        if prefix.gate is not None:
            g = gate_value(prefix.gate, "example", gate_input(), mask()).view(b, 1, 1, 1, 1)
            pk, pv = (kv * g.to(kv.dtype)).unbind(1)
        else:
            pk, pv = (t.expand(b, -1, -1, -1) for t in kv.unbind(0))
        attention_mask = _with_prefix_columns(attention_mask, kv.shape[2])
        key, value = torch.cat([pk, key], dim=2), torch.cat([pv, value], dim=2)
        kwargs["is_causal"] = False
    out, weights = sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )  # out [B, Lq, H, D]
    if mh is not None:
        out = out + mh.compose(mh(query, scaling).transpose(1, 2)).to(out.dtype)
    return out, weights


AttentionInterface.register(ATTENTION, carrier_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


class PetlForSequenceClassification(PreTrainedModel):
    config_class = PetlCarrierConfig
    base_model_prefix = "carrier"
    _supports_sdpa = True

    def __init__(self, config: PetlCarrierConfig):
        super().__init__(config)
        self.model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(**config.base))
        petl = config.petl
        self.rules = nn.ParameterDict({k: nn.Parameter(torch.zeros(n, n, n)) for k, n in petl.get("rules", {}).items()})
        self.petl = nn.ModuleDict({k: KINDS[m["kind"]](m, self.rules) for k, m in petl.get("modules", {}).items()})
        prompt = petl.get("prompt")
        self.prompt = nn.Parameter(torch.zeros(prompt["length"], prompt["dim"])) if prompt else None
        self._mask, self._inputs = None, {}
        self._hook()
        self.post_init()

    def _hook(self) -> None:
        petl, model = self.config.petl, self.model
        for path in {e["reads"] for e in petl.get("edits", []) + petl.get("attention", []) if e.get("reads")}:
            model.get_submodule(path).register_forward_pre_hook(self._keep(path))
        by_site = {}
        for e in petl.get("edits", []):
            by_site.setdefault(e["at"], []).append(e)
        for path, edits in by_site.items():
            model.get_submodule(path).register_forward_hook(self._edit(edits))
        for a in petl.get("attention", []):
            model.get_submodule(a["at"]).__dict__[EDITS] = {
                "prefix": self.petl[a["prefix"]] if a.get("prefix") else None,
                "mh": self.petl[a["mh"]] if a.get("mh") else None,
                "input": (lambda path=a.get("reads"): self._inputs.get(path)),
                "mask": lambda: self._mask,
            }
        if petl.get("attention"):
            model.set_attn_implementation(ATTENTION)
        if petl.get("pooling") in ("mean", "cls"):
            model.base_model.register_forward_hook(self._pool, with_kwargs=True)

    def _keep(self, path: str):
        def keep(mod, args):
            self._inputs[path] = args[0]

        return keep

    def _edit(self, edits: list):
        def edit(mod, args, out):  # updates that read the input first, in the order petl-nas applies them
            for e in edits:
                x = {"lora": args[0], "sequential": out}.get(e["kind"])
                x = self._inputs[e["reads"]] if x is None else x
                out = out + self.petl[e["module"]](x, self._mask).to(out.dtype)
            return out

        return edit

    def _pool(self, mod, args, kwargs, out):
        """What the classifier reads: the mean over real tokens or the first token's state."""
        h, mask = out["last_hidden_state"], self._mask
        if self.config.petl["pooling"] == "cls":
            vector = h[:, 0]
        elif mask is None or mask.shape != h.shape[:2]:
            vector = h.mean(dim=1)
        else:
            m = mask.to(h.dtype).unsqueeze(-1)
            vector = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
        if self.config.petl.get("reads_pooler"):
            out["pooler_output"] = vector
        else:
            out["last_hidden_state"] = torch.cat([vector.unsqueeze(1), h[:, 1:]], dim=1)
        return out

    def _prompted(self, inputs: dict) -> dict:
        """The soft prompt inserted after the first token; the mask and token types grow with it."""
        at, n = self.config.petl["prompt"]["at"], self.prompt.shape[0]
        ids, embeds = inputs.pop("input_ids", None), inputs.pop("inputs_embeds", None)
        embeds = self.model.get_input_embeddings()(ids) if embeds is None else embeds
        prompt = self.prompt.to(embeds.dtype).expand(embeds.shape[0], -1, -1)
        inputs["inputs_embeds"] = torch.cat([embeds[:, :at], prompt, embeds[:, at:]], dim=1)
        for key, fill in (("attention_mask", 1), ("token_type_ids", None)):
            t = inputs.get(key)
            if t is not None:
                pad = (
                    t[:, :1].expand(-1, n)
                    if fill is None
                    else torch.full((t.shape[0], n), fill, dtype=t.dtype, device=t.device)
                )
                inputs[key] = torch.cat([t[:, :at], pad, t[:, at:]], dim=1)
        return inputs

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, inputs_embeds=None, **kwargs):
        inputs = {
            k: v
            for k, v in dict(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                inputs_embeds=inputs_embeds,
            ).items()
            if v is not None
        }
        if self.prompt is not None:
            inputs = self._prompted(inputs)
        self._mask, self._inputs = inputs.get("attention_mask"), {}
        try:
            return self.model(**inputs, **kwargs)
        finally:
            self._mask, self._inputs = None, {}
