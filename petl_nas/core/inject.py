"""Apply a `PetlConfig` to a transformers model, freeze the rest, and save/load the PETL weights.

Every PETL parameter lives under one submodule, ``model.petl`` (so its names all start with
``petl.``); BitFit biases, LayerNorms and a classification head are the only other trainable
tensors (a language-model head stays frozen). Each module goes to the blocks it names (encoder
self-, decoder self-, cross-attention; all by default) and the layers it names within each stack.
Edits reach the backbone in three ways, all named by the backbone spec, never by model class:
- one forward hook per modified linear (q/k/v/o, W1/W2) applies its edits in a fixed order:
  updates that read the linear's input first (LoRA; DoRA, which also reads the linear's weight;
  on a fused projection, to its slice), then adapters (sequential ones read the updated output);
  a module may also have its input rewritten first (a pre-hook) or its output computed by a
  trained copy (a LayerNorm's), before the updates;
- head-attention edits (prefix, multi-head adapter) ride on the ``petl`` attention function;
- input hooks insert prompt tokens and refresh reparameterised prefixes once per forward.

Example:
    >>> model = AutoModelForSequenceClassification.from_pretrained(path)   # doctest: +SKIP
    >>> apply_petl(model, preset("mam", model.config))                     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import warnings
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.initialization import no_init_weights

from ..errors import ConfigError, PetlWarning
from ..fileio import atomic_write
from .backbones import BackboneSpec, Block, OutSlice, depths, features, spec_for, stacks
from .config import PetlConfig
from .forms import form_named
from .head import (
    head_parameters,
    install_pooling,
    native_pooling,
    pooler_parameters,
    resolve_pooling,
    set_head_dropout,
    stock_head_fields,
)
from .modules import (
    ATTENTION_NAME,
    HeadEdits,
    LoRA,
    PrefixEncoder,
    SharedRead,
    SharedRule,
    SoftPrompt,
    as_param_dtype,
    head_attention,
)
from .precision import master_dtype

ROOT = "petl"
CONFIG_FILE = "petl_config.json"
WEIGHTS_FILE = "petl_weights.safetensors"


class PetlRoot(nn.Module):
    """Owns the PETL parameters (``groups``: one per module spec), the hooks and the on/off switch.

    Every hook `apply_petl` installs is one of its methods or a module-level function bound to it
    (`functools.partial`), never a closure: `copy.deepcopy` of the model then gives the copy hooks
    that call the copy's modules, and `torch.save` of the whole model can pickle them. What one
    forward keeps (inputs, the padding mask, caches) is left out of a copy."""

    def __init__(self, config: PetlConfig, flat_prefix: bool):
        super().__init__()
        self.config = config
        self.flat_prefix = flat_prefix
        self.enabled = True
        self.groups = nn.ModuleDict()
        self.prompt: SoftPrompt | None = None
        self._handles: list = []
        self._attn_modules: list[nn.Module] = []
        self._inputs: dict[tuple[str, int, str], torch.Tensor] = {}
        self._pad_mask: torch.Tensor | None = None  # this forward's [B, L] padding mask (per-example gates)
        self._previous_attn: str | None = None
        self._sites: list[tuple[nn.Module, list, object]] = []  # (linear, its edits, its hook): `merge_lora` folds
        self._input_sites: list[tuple[nn.Module, list]] = []  # (module, the edits that rewrite its input)
        self._shared_reads: list[SharedRead] = []  # modules of one layer reading one input (`shared_read`)
        self.pooling = "native"  # the concrete pooling the classifier reads (head.py)
        self.merged = 0  # LoRA updates `merge_lora` folded into their weights
        self.scales_ids_in_stack = False  # the prompt's stack scales token embeddings (BackboneSpec)

    def prefix_encoders(self) -> list[tuple[str, PrefixEncoder]]:
        return [(n, m) for n, m in self.named_modules() if isinstance(m, PrefixEncoder)]

    def forward_caches(self) -> list:
        """What keeps values for one forward: reparameterised prefixes, PHM weights built together,
        products shared by the readers of one input."""
        return [m for m in self.modules() if isinstance(m, (PrefixEncoder, SharedRule))] + self._shared_reads

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        state.update(_inputs=dict.fromkeys(self._inputs), _pad_mask=None)  # this forward's: maybe in its graph
        return state

    # What the hooks read and call (bound methods, so that a copy's hooks are the copy's).
    def is_enabled(self) -> bool:
        return self.enabled

    def pad_mask(self) -> torch.Tensor | None:
        return self._pad_mask

    def input_of(self, key: tuple[str, int, str]) -> torch.Tensor | None:
        return self._inputs.get(key)

    def keep_input(self, key: tuple[str, int, str], mod, args) -> None:
        self._inputs[key] = args[0]

    def clear_caches(self, *hook_args) -> None:
        for cache in self.forward_caches():
            cache.clear()

    def begin_forward(self, mod, args, kwargs):
        """At the stack that takes the inputs: a fresh forward; the prompt's tokens inserted."""
        self.clear_caches()
        self._inputs.update(dict.fromkeys(self._inputs))  # drop last forward's inputs, keep the keys
        self._pad_mask = kwargs.get("attention_mask")
        if self.prompt is None or not self.enabled:
            return None
        scale = getattr(mod, "embed_scale", 1.0) if self.scales_ids_in_stack else 1.0
        args, kwargs, inserted = self.prompt.rewrite_inputs(mod, args, kwargs, scale)
        mod.__dict__["_petl_prompt_inserted"] = inserted
        self._pad_mask = kwargs.get("attention_mask")  # grown by the prompt's positions
        return args, kwargs

    def end_forward(self, mod, args, kwargs, out):
        """At a decoder-only stack's output: the prompt's positions taken out again."""
        if mod.__dict__.pop("_petl_prompt_inserted", False):
            out["last_hidden_state"] = self.prompt.shrink(out["last_hidden_state"])
            if out.get("hidden_states") is not None:
                out["hidden_states"] = tuple(self.prompt.shrink(h) for h in out["hidden_states"])
        return out

    def grow_encoder_mask(self, mod, args, kwargs):
        """At an encoder-decoder's decoder: the cross-attention mask widened by the prompt's positions."""
        return (args, self.prompt.grow_encoder_mask(kwargs)) if self.enabled else None


def _input_of(target: str, block: str) -> str | None:
    """Which input a LoRA target's weight reads, for `SharedRead`: the attention sublayer's (q, k
    and v of a self-attention; q alone of a cross-attention, whose k and v read the encoder's output:
    ``kv``), the FFN's (every W1), or one no other weight reads (o, W2: None)."""
    if target in ("q", "k", "v"):
        return "attn" if block != "cross" or target == "q" else "kv"
    return "ffn" if target == "ffn_in" else None


def _head_dims(config, block: Block, layer: nn.Module) -> tuple[int, int, int]:
    """(query heads, head dim, key/value heads) of one block, read off its q and k widths."""
    heads = getattr(config, block.heads)
    q, k = block.sites("q")[0], block.sites("k")[0]
    head_dim = features(layer.get_submodule(q.path), q, config)[1] // heads
    kv_heads = features(layer.get_submodule(k.path), k, config)[1] // head_dim
    return heads, head_dim, kv_heads


def head_attention_refusal(model_config) -> str | None:
    """Why the ``petl`` attention function cannot serve this backbone (None when it can): a family
    whose attention does not call transformers' interface, or logits SDPA would compute otherwise
    than the model (soft-capping)."""
    spec = spec_for(model_config)
    if any(b.attention is None for b in spec.blocks):
        return (
            f"transformers' attention interface is needed, and the {model_config.model_type} backbone "
            f"computes attention in its own code"
        )
    if getattr(model_config, "attn_logit_softcapping", None):
        return (
            f"attention goes through SDPA, which cannot soft-cap attention logits as this "
            f"{model_config.model_type} backbone does (attn_logit_softcapping="
            f"{model_config.attn_logit_softcapping})"
        )
    return None


def _check_head_attention(config, index: int, form: str) -> None:
    if (reason := head_attention_refusal(config)) is not None:
        raise ConfigError(f"modules[{index}]: {form}: {reason}; use lora, adapter, compacter or prompt tuning")


class _Site:
    """The ordered edits on one module: its input rewritten (``input``); then on its output a
    replacement (``replace``), the updates reading its input (``lora``, ``weight``), then adapters."""

    ORDER = {"input": -2, "replace": -1, "lora": 0, "weight": 0}  # every other kind: 1

    def __init__(self):
        self.edits: list[tuple[int, str, nn.Module, object]] = []  # (order, kind, module, x source | slice)

    def add(self, kind: str, module: nn.Module, extra=None, path: str = ""):
        if kind == "replace" and any(e[1] == "replace" for e in self.edits):
            raise ConfigError(f"{path}: two modules would each compute it in its place; give them disjoint layers")
        self.edits.append((self.ORDER.get(kind, 1), kind, module, extra))


class Placement:
    """One module spec on one block of a backbone: what a form's `place` builds its layers from and
    puts them on (`petl_nas.core.forms.Form.place`).

    Attributes:
        block_name, block: the block (``encoder``, ``decoder``, ``cross``) and its `Block` spec.
        covered: the layer indices of the block the module applies to.
        modules: a `ModuleDict` for this block's layers of the module (its parameters' names).
        shared: the form's module shared by every layer (`Form.shared`), or None.
        d, heads, head_dim, kv_heads: the hidden width, and the attention's query heads, head width
            and key/value heads; causal: whether tokens must not see later ones here.
        flat_prefix, root: build prefixes flat (as loaded); the model's `PetlRoot`.
    """

    def __init__(
        self,
        model,
        root,
        block_name: str,
        block: Block,
        layers,
        covered,
        modules,
        shared,
        causal: bool,
        heads: tuple[int, int, int],
        flat_prefix: bool,
        sites,
        captures,
        readers,
        head_edits,
        new_edits,
    ):
        self.model_config, self.root = model.config, root
        self.block_name, self.block, self._layers, self.covered = block_name, block, layers, covered
        self.modules, self.shared, self.causal, self.flat_prefix = modules, shared, causal, flat_prefix
        self.d = model.config.hidden_size
        self.heads, self.head_dim, self.kv_heads = heads
        self._sites, self._captures, self._readers = sites, captures, readers
        self._head_edits, self._new_edits = head_edits, new_edits

    def linear(self, layer: int, site) -> nn.Module:
        return self._layers[layer].get_submodule(site.path)

    def features(self, layer: int, site) -> tuple[int, int]:
        """(in, out) features of a site's weight (of its slice, for a fused projection)."""
        return features(self.linear(layer, site), site, self.model_config)

    def weight(self, layer: int, site) -> torch.Tensor:
        """A site's frozen weight as [out, in] (its slice's rows, for a fused projection)."""
        return site_weight(self.linear(layer, site), self.out_slice(layer, site))

    def out_slice(self, layer: int, site) -> OutSlice | None:
        """Where a fused projection's slice sits in its output (None: a whole weight)."""
        return site.out_slice(features(self.linear(layer, site))[1], self.model_config)

    def edit(self, layer: int, path: str, kind: str, module: nn.Module, extra=None) -> None:
        """Add ``module``'s update to the output of the linear at ``path``: ``lora`` reads the linear's
        input (``extra``: its `OutSlice`), ``sequential`` its output, ``parallel`` the sublayer input
        ``extra`` (``attn``/``ffn``, kept by `read_sublayer_input`); ``weight`` is ``lora`` that also
        reads the linear: ``module(x, mask, W, x·Wᵀ)`` with W its weight as [out, in] and x·Wᵀ its
        output without bias (both of the slice). Updates reading the input come first.
        Two kinds change the module itself, for any module at ``path`` (a linear, a LayerNorm):
        ``input`` gives it module(x) as its input, before everything else reads it (IA3's scaled FFN
        activations); ``replace`` computes its output as module(x) in its place, before the updates
        (a trained copy of a LayerNorm); one ``replace`` per module."""
        self._sites[(self.block_name, layer, path)].add(kind, module, extra, path)

    def read_sublayer_input(self, layer: int, position: str) -> None:
        """Keep the input x of a layer's attention or FFN sublayer for the forward (`PetlRoot.input_of`)."""
        self._captures.add((self.block_name, layer, position))

    def share_read(self, layer: int, source: str, module: nn.Module) -> None:
        """``module`` reads input ``source`` of the layer: readers of one input share one read (`SharedRead`)."""
        self._readers[(self.block_name, layer, source)].append(module)

    def input_source(self, target: str) -> str | None:
        """Which input a weight reads, for `share_read` (None: one no other weight reads)."""
        return _input_of(target, self.block_name)

    def head_edits(self, layer: int) -> HeadEdits:
        """The edits of a layer's attention heads (prefix, multi-head adapter), made on first use."""
        return self._head_edits.setdefault((self.block_name, layer), self._new_edits())


def petl_root(model: nn.Module, caller: str) -> PetlRoot:
    """``model``'s PETL modules, or one `ConfigError` saying that ``caller`` needs `apply_petl` first."""
    root = getattr(model, ROOT, None)
    if not isinstance(root, PetlRoot):
        raise ConfigError(f"{caller}: this {type(model).__name__} has no PETL modules (apply_petl first)")
    return root


def _checked(model: nn.Module, config: PetlConfig):
    """(backbone spec, its layer lists, each position's depths) of a fresh transformers ``model``
    that ``config`` applies to; a `ConfigError` naming what does not."""
    if hasattr(model, ROOT):
        raise ConfigError("model already has PETL modules; apply a config to a fresh backbone")
    if not hasattr(getattr(model, "config", None), "model_type") or not hasattr(model, "base_model"):
        raise ConfigError(
            f"apply_petl: expected a transformers model (a PreTrainedModel, e.g. from "
            f"AutoModelForSequenceClassification.from_pretrained), got a {type(model).__name__}"
        )
    if not isinstance(config, PetlConfig):
        raise ConfigError(
            f"apply_petl: expected a PetlConfig (PetlConfig(modules=(ModuleSpec(...),)), "
            f"PetlConfig.from_dict(...) or preset(name, model.config)), got a {type(config).__name__}"
        )
    spec, layer_lists = stacks(model)
    available = depths(spec, layer_lists)
    config.check_backbone(available, name=f"the {model.config.model_type} backbone")
    if config.bitfit and not any(n.endswith("bias") for n, _ in model.base_model.named_parameters()):
        raise ConfigError(
            f"bitfit: the {model.config.model_type} backbone has no bias terms, so BitFit "
            f"would train nothing; use another method"
        )
    return spec, layer_lists, available


def apply_petl(model: nn.Module, config: PetlConfig, *, flat_prefix: bool = False) -> nn.Module:
    """Insert the configured modules into ``model`` in place, freeze everything else, and return it.

    Args:
        model: a transformers model whose ``config.model_type`` has a backbone spec.
        config: the design to apply.
        flat_prefix: build prefixes in their deployable (flattened) form, as ``load_petl`` does.
    """
    spec, layer_lists, available = _checked(model, config)
    ref = next(model.parameters())
    root = PetlRoot(config, flat_prefix)
    root_edits = functools.partial(HeadEdits, is_enabled=root.is_enabled, pad_mask=root.pad_mask)
    sites: dict[tuple[str, int, str], _Site] = defaultdict(_Site)  # (block, layer, module path)
    captures: set[tuple[str, int, str]] = set()  # (block, layer, 'attn'|'ffn') whose input x is kept
    head_edits: dict[tuple[str, int], HeadEdits] = {}
    readers: dict[tuple[str, int, str], list[nn.Module]] = defaultdict(list)  # (block, layer, input): `shared_read`
    single = len(spec.blocks) == 1  # one block: parameter names carry no block name

    # On the meta device (parameter counting) weights have no values: skip their initialisation.
    skip_init = no_init_weights() if ref.device.type == "meta" else contextlib.nullcontext()
    with torch.device(ref.device), skip_init:
        for i, m in enumerate(config.modules):
            group = nn.ModuleDict()
            root.groups[f"{i}_{m.key}"] = group
            form = form_named(m.form)
            shared = form.shared(m)  # one per module, every layer's
            if shared is not None:
                group["rule"] = shared
            for name in config.blocks_of(m, available[m.position]):
                block, layers = spec.block(name), layer_lists[name]
                if not single:
                    group[name] = nn.ModuleDict()
                if form.head_attention:
                    _check_head_attention(model.config, i, m.form)
                form.place(
                    m,
                    Placement(
                        model,
                        root,
                        name,
                        block,
                        layers,
                        config.layers_of(m, len(layers)),
                        group if single else group[name],
                        shared,
                        spec.decoder_only or name in ("decoder", "cross"),  # tokens must not see later ones
                        _head_dims(model.config, block, layers[0]),
                        flat_prefix,
                        sites,
                        captures,
                        readers,
                        head_edits,
                        root_edits,
                    ),
                )
        for group in (rs for rs in readers.values() if len(rs) > 1):
            root._shared_reads.append(SharedRead())
            for reader in group:
                root._shared_reads[-1].add(reader)
        if config.prompt_length:
            width = model.get_input_embeddings().embedding_dim  # ELECTRA embeds narrower than d
            root.prompt = SoftPrompt(config.prompt_length, width, at=0 if spec.decoder_only else 1)
    root.to(master_dtype(ref.dtype))

    pooling = resolve_pooling(config.pooling, model, sequence_model=not (spec.decoder_only or spec.encoder_decoder))
    with _undone_on_error(model):
        model.add_module(ROOT, root)
        root.pooling = pooling
        _freeze(model, root, config)
        _install_hooks(model, root, spec, layer_lists, sites, captures, head_edits)
        install_pooling(model, root.pooling, root.pad_mask, root._handles)
        set_head_dropout(model, config.head_dropout)
    return model


@contextlib.contextmanager
def _undone_on_error(model: nn.Module):
    """On an error inside, ``model`` as it was before: no PETL modules or hooks, every parameter's
    ``requires_grad`` and tensor (`_upcast_trained` replaces a half-precision body's) as they were."""
    before = [(p, p.requires_grad, p.data) for p in model.parameters()]
    try:
        yield
    except BaseException:
        if isinstance(getattr(model, ROOT, None), PetlRoot):
            remove_petl(model, warn=False)
        for p, trained, data in before:
            p.data = data
            p.requires_grad_(trained)
        raise


def _freeze(model: nn.Module, root: PetlRoot, config: PetlConfig) -> None:
    backbone = {id(p) for p in model.base_model.parameters()} - {id(p) for p in root.parameters()}
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if lm_head is not None:  # a language-model head is pretrained (often tied): it stays frozen
        backbone |= {id(p) for p in lm_head.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) not in backbone)  # PETL and the task head train
    for name, p in model.base_model.named_parameters():
        if id(p) in backbone and config.bitfit and name.endswith("bias"):
            p.requires_grad_(True)
    for p in pooler_parameters(model, root.pooling):  # pooling: pooler_trained
        p.requires_grad_(True)
    if config.train_layernorms:
        for mod in norm_modules(model):
            for p in mod.parameters():
                p.requires_grad_(True)
    _upcast_trained(model, root)


def parameter_families(model: nn.Module) -> dict[int, str]:
    """Each trained parameter's family, by ``id``: its module's form (``lora``, ``adapter``, ...),
    ``prompt``, ``layernorms``, ``bitfit`` (the backbone's other trained biases) or ``head``; what
    `PetlConfig.lr_mult` gives a learning rate of its own."""
    root: PetlRoot = getattr(model, ROOT)
    families: dict[int, str] = {}
    for key, group in root.groups.items():  # "<i>_<key>": module spec i
        form = root.config.modules[int(key.split("_", 1)[0])].form
        families.update((id(p), form) for p in group.parameters())
    if root.prompt is not None:
        families.update((id(p), "prompt") for p in root.prompt.parameters())
    for p in head_parameters(model, root.pooling):
        families.setdefault(id(p), "head")
    for mod in norm_modules(model) if root.config.train_layernorms else ():
        families.update((id(p), "layernorms") for p in mod.parameters() if p.requires_grad)
    for p in model.parameters():
        if p.requires_grad and id(p) not in families:
            families[id(p)] = "bitfit"  # what is left trains because of BitFit
    return families


def norm_modules(model: nn.Module) -> list[nn.Module]:
    """The backbone's LayerNorms (and RMSNorms): what ``train_layernorms`` trains."""
    return [
        mod
        for mod in model.base_model.modules()
        if isinstance(mod, nn.LayerNorm) or type(mod).__name__.endswith(("LayerNorm", "RMSNorm"))
    ]


def _upcast_trained(model: nn.Module, root: PetlRoot) -> None:
    """Trained tensors of a half-precision body (head, BitFit biases, LayerNorms) become fp32 masters.

    The modules that own them read their input in fp32 and hand back the body's dtype, so the model
    also runs outside autocast (under it, each matmul still computes in half precision).
    """
    owners = []
    for mod in model.modules():
        if mod is root:
            continue
        own = [p for p in mod.parameters(recurse=False) if p.requires_grad and p.dtype != master_dtype(p.dtype)]
        for p in own:
            p.data = p.data.to(master_dtype(p.dtype))
        if own:
            owners.append(mod)
    for mod in owners:
        dtype = next(p.dtype for p in mod.parameters(recurse=False) if p.requires_grad)
        root._handles += [
            mod.register_forward_pre_hook(functools.partial(_to_master, dtype)),
            mod.register_forward_hook(_to_body),
        ]


def _to_master(dtype: torch.dtype, m: nn.Module, args):
    m.__dict__["_petl_in_dtype"] = next((a.dtype for a in args if torch.is_tensor(a)), None)
    return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def _to_body(m: nn.Module, args, out):
    body = m.__dict__.pop("_petl_in_dtype", None)
    return out.to(body) if torch.is_tensor(out) and body is not None and out.is_floating_point() else out


def _as_params(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``x`` for ``module``'s parameters (fp32 masters inside a half-precision body; `as_param_dtype`)."""
    return as_param_dtype(x, next(module.parameters()).dtype)


def _install_hooks(model, root, spec: BackboneSpec, layer_lists, sites, captures, head_edits) -> None:
    handles = root._handles
    for name, l, position in sorted(captures):
        # x of the attention sublayer is q's input; x of the FFN is W1's input.
        block = spec.block(name)
        src = block.sites("q")[0] if position == "attn" else block.sites("ffn_in")[0]
        root._inputs[(name, l, position)] = None  # every key from the start: a compiled forward guards on the size
        keep = functools.partial(root.keep_input, (name, l, position))
        handles.append(layer_lists[name][l].get_submodule(src.path).register_forward_pre_hook(keep))

    for (name, l, path), site in sites.items():
        edits = [(kind, mod, extra) for _, kind, mod, extra in sorted(site.edits, key=lambda e: e[0])]
        linear = layer_lists[name][l].get_submodule(path)
        if inputs := [mod for kind, mod, _ in edits if kind == "input"]:
            handles.append(linear.register_forward_pre_hook(functools.partial(_apply_input_edits, root, inputs)))
            root._input_sites.append((linear, inputs))
        if edits := [e for e in edits if e[0] != "input"]:
            handles.append(linear.register_forward_hook(functools.partial(_apply_edits, root, edits, name, l)))
            root._sites.append((linear, edits, handles[-1]))

    for (name, l), edits in head_edits.items():
        attn = layer_lists[name][l].get_submodule(spec.block(name).attention)
        head_attention.attach(attn, edits)
        root._attn_modules.append(attn)
    if head_edits:
        root._previous_attn = model.config._attn_implementation
        model.set_attn_implementation(ATTENTION_NAME)
    _install_input_hooks(model, root, spec)


def site_weight(linear: nn.Module, extra: OutSlice | None = None) -> torch.Tensor:
    """``linear``'s weight as [out, in] (GPT-2's Conv1D keeps [in, out]); ``extra``'s rows of it."""
    weight = linear.weight if isinstance(linear, nn.Linear) else linear.weight.t()
    return weight if extra is None else extra.rows(weight).flatten(0, 1)


def _weight_read(linear: nn.Module, x: torch.Tensor, out: torch.Tensor, extra: OutSlice | None) -> tuple:
    """(W [out, in], x·Wᵀ) of a site for a ``weight`` edit: x·Wᵀ is the linear's own output less its
    bias, computed again only for a slice of a fused projection."""
    weight = site_weight(linear, extra)
    if extra is not None:
        return weight, nn.functional.linear(x, weight)
    return weight, out if linear.bias is None else out - linear.bias


def _apply_edits(root: PetlRoot, edits: list, name: str, l: int, mod, args, out):
    """A modified linear's forward hook: its edits, in order, onto its output."""
    if not root.enabled:
        return None
    x, mask, own = args[0], root._pad_mask, out
    for kind, block, extra in edits:
        if kind == "replace":  # first: the module's own output is dropped
            out = block(_as_params(x, block), mask).to(out.dtype)
            continue
        if kind in ("lora", "weight"):
            if kind == "lora":
                delta = block(_as_params(x, block), mask)
            else:
                weight, base = _weight_read(mod, x, own, extra)
                delta = block(_as_params(x, block), mask, _as_params(weight, block), _as_params(base, block))
            if extra is not None:  # one slice of a fused projection
                delta = extra.pad(delta)
        elif kind == "sequential":
            delta = block(_as_params(out, block), mask)
        else:
            delta = block(_as_params(root._inputs[(name, l, extra)], block), mask)
        out = out + delta.to(out.dtype)  # the body's activations keep its dtype
    return out


def _apply_input_edits(root: PetlRoot, edits: list, mod, args):
    """A module's forward pre-hook: its input rewritten by each ``input`` edit in turn."""
    if not root.enabled:
        return None
    x = args[0]
    for block in edits:
        x = block(_as_params(x, block)).to(args[0].dtype)
    return (x, *args[1:])


def gate_prompt(model: nn.Module, gate) -> None:
    """Put the one-shot supernet's gate on the soft prompt: ``gate()`` returns one value per position.

    A forward inserts only the open positions, and every attention whose keys carry the prompt
    (encoder and cross-attention; a decoder-only model's self-attention) adds log g to their logits
    (`SoftPrompt.key_log_gate`), so a shut position is exactly absent.
    """
    root = petl_root(model, "gate_prompt")
    if root.prompt is None:
        raise ValueError("gate_prompt: the model has no soft prompt (prompt_length 0)")
    if (reason := head_attention_refusal(model.config)) is not None:
        raise ConfigError(f"a gated prompt adds its gates to attention logits: {reason}")
    root.prompt.position_gate = gate
    spec, layer_lists = stacks(model)
    for block in spec.blocks:
        if spec.encoder_decoder and block.name == "decoder":  # its self-attention never sees the prompt
            continue
        for layer in layer_lists[block.name]:
            attn = layer.get_submodule(block.attention)
            edits = head_attention.edits_of(attn)
            if edits is None:
                edits = HeadEdits(is_enabled=root.is_enabled, pad_mask=root.pad_mask)
                head_attention.attach(attn, edits)
                root._attn_modules.append(attn)
            edits.key_gate = root.prompt.key_log_gate
    if root._previous_attn is None:
        root._previous_attn = model.config._attn_implementation
        model.set_attn_implementation(ATTENTION_NAME)


def _install_input_hooks(model, root: PetlRoot, spec: BackboneSpec) -> None:
    """Per forward: recompute reparameterised prefixes; insert prompt tokens where the spec says.

    An encoder-decoder gets the prompt in its encoder (``generate`` calls the encoder on its own),
    and its decoder widens the cross-attention mask to match. A decoder-only model gets it at the
    stack that owns its layers, whose output loses the prompt positions again.
    """
    handles, prompt = root._handles, root.prompt
    root.scales_ids_in_stack = spec.scales_ids_in_stack
    if spec.encoder_decoder:
        base = model.base_model
        encoder = base.get_submodule(spec.block("encoder").stack)
        decoder = base.get_submodule(spec.block("decoder").stack)
        handles.append(model.register_forward_pre_hook(root.clear_caches))
        handles.append(encoder.register_forward_pre_hook(root.begin_forward, with_kwargs=True))
        if prompt is not None:
            handles.append(decoder.register_forward_pre_hook(root.grow_encoder_mask, with_kwargs=True))
    elif spec.decoder_only:
        # The stack that owns the layers, not the base model: OPT's LM head calls its decoder directly.
        stack = model.base_model.get_submodule(spec.block("decoder").stack)
        handles.append(model.register_forward_pre_hook(root.clear_caches))
        handles.append(stack.register_forward_pre_hook(root.begin_forward, with_kwargs=True))
        if prompt is not None:
            handles.append(stack.register_forward_hook(root.end_forward, with_kwargs=True))
    else:
        handles.append(model.register_forward_pre_hook(root.begin_forward, with_kwargs=True))


def remove_petl(model: nn.Module, warn: bool = True) -> nn.Module:
    """Undo `apply_petl`: drop hooks, attention edits and the ``petl`` submodule (weights stay frozen;
    LoRA updates `merge_lora` folded into them stay). The classifier then reads as the architecture's
    own head does, not by the configuration's pooling: when the two differ (mean pooling into BERT's
    [CLS] head), a warning says the outputs change (``warn=False``: not). To keep what was trained,
    `convert.merge_and_unload`."""
    root = petl_root(model, "remove_petl")
    if warn and root.pooling != "native" and stock_head_fields(model, root.pooling) is None:
        warnings.warn(
            f"remove_petl: the classifier was trained reading {root.pooling} pooling, which the stock "
            f"{type(model).__name__} head does not read, so its outputs change (merge_and_unload keeps "
            f"them where it can, or says why not)",
            PetlWarning,
            stacklevel=2,
        )
    for h in root._handles:
        h.remove()
    for attn in root._attn_modules:
        head_attention.detach(attn)
    if root._previous_attn is not None:
        model.set_attn_implementation(root._previous_attn)
    del model._modules[ROOT]
    return model


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRA update without a gate into the weight it updates (W += s·B·A; DoRA's:
    W = m/‖W + s·B·A‖·(W + s·B·A), where no other update shares its weight) and stop
    computing it beside W: the deployed form, as fast as the backbone at those weights. Gated LoRA
    (its update depends on the input), adapters, prefixes and prompts stay as they are. Returns how
    many updates were folded. For inference only: the folded updates no longer take part in a forward
    pass, so they no longer train (their tensors stay, and `save_petl` still saves them), and
    `petl_disabled` cannot take them out of the weights (it warns). `convert.merge_and_unload`
    gives a plain transformers model, or says why it cannot."""
    root = petl_root(model, "merge_lora")
    folded = 0
    with torch.no_grad():
        for linear, edits, hook in root._sites:
            beside = [kind for kind, _, _ in edits if kind in ("lora", "weight")]
            shared = "weight" in beside and len(beside) > 1  # DoRA reads W: fold nothing into it
            for edit in list(edits):
                kind, module, extra = edit
                if kind not in ("lora", "weight") or module.compose.gate is not None or not root.enabled:
                    continue
                if shared:
                    continue
                weight = linear.weight  # GPT-2's Conv1D keeps W as [in, out]
                target = weight if isinstance(linear, nn.Linear) else weight.t()
                delta = module.delta_weight() if kind == "lora" else module.delta_weight(site_weight(linear, extra))
                if extra is not None:  # one slice of a fused projection
                    target, delta = extra.rows(target), delta.unflatten(0, (extra.groups, extra.width))
                target += delta.to(weight.dtype)
                edits.remove(edit)
                if "shared_read" in module.__dict__:  # no longer reads its input
                    module.__dict__["shared_read"].remove(module)
                folded += 1
            if not edits:
                hook.remove()  # nothing left to compute beside W
    root.merged += folded
    return folded


def lora_updates(model: nn.Module) -> list[tuple[str, LoRA, OutSlice | None]]:
    """Each LoRA (or DoRA) update still computed beside its weight: (the name of the linear module it
    updates, relative to ``model``; the LoRA; where its slice of a fused projection sits, or None)."""
    root = petl_root(model, "lora_updates")
    names = {id(m): n for n, m in model.named_modules()}
    return [
        (names[id(linear)], module, extra)
        for linear, edits, _ in root._sites
        for kind, module, extra in edits
        if kind in ("lora", "weight")
    ]


def weight_edits(model: nn.Module) -> list[tuple[str, int, nn.Module, OutSlice | None]]:
    """Each PETL module still computed on a backbone module's input or output (input edits first),
    in the order they apply: (the
    name of the linear module it edits, relative to ``model``; the index of its module spec in the
    configuration, which names its form; the module; where its slice of a fused projection sits, or
    None). What PEFT's tuners are copied from (`deploy.convert`), for any form."""
    root = petl_root(model, "weight_edits")
    names = {id(m): n for n, m in model.named_modules()}
    owner = {id(m): int(key.split("_", 1)[0]) for key, group in root.groups.items() for m in group.modules()}
    rewritten = [
        (names[id(linear)], owner[id(module)], module, None)
        for linear, inputs in root._input_sites
        for module in inputs
    ]
    return rewritten + [
        (names[id(linear)], owner[id(module)], module, extra if isinstance(extra, OutSlice) else None)
        for linear, edits, _ in root._sites
        for kind, module, extra in edits
    ]


def output_edits(model: nn.Module) -> list[tuple[str, str, nn.Module, object]]:
    """Each PETL module that adds to a backbone module's output, in the order they apply: (the name
    of the module it edits, relative to ``model``; its kind: ``lora``, ``weight``, ``sequential``
    (reads the output), ``parallel`` (reads its sublayer's input), ``replace``; the module; its slice
    of a fused projection, or for ``parallel`` its sublayer, ``attn`` or ``ffn``), ``input`` rewrites
    first."""
    root = petl_root(model, "output_edits")
    names = {id(m): n for n, m in model.named_modules()}
    rewritten = [
        (names[id(linear)], "input", module, None) for linear, inputs in root._input_sites for module in inputs
    ]
    return rewritten + [
        (names[id(linear)], kind, module, extra) for linear, edits, _ in root._sites for kind, module, extra in edits
    ]


def attention_edits(model: nn.Module) -> list[tuple[str, HeadEdits]]:
    """Each attention module with head edits (a prefix, a multi-head adapter, a gated prompt's keys):
    (its name relative to ``model``, its `HeadEdits`)."""
    root = petl_root(model, "attention_edits")
    names = {id(m): n for n, m in model.named_modules()}
    return [(names[id(attn)], head_attention.edits_of(attn)) for attn in root._attn_modules]


@contextlib.contextmanager
def petl_disabled(model: nn.Module):
    """Run the backbone without its PETL modules (adapters, LoRA, prefixes, prompts off) inside the
    block. What `apply_petl` trains in the backbone itself stays as trained: BitFit's biases, trained
    LayerNorms, the classifier (which keeps the pooling it was trained with), and LoRA updates
    `merge_lora` folded into the weights (a warning says so)."""
    root = petl_root(model, "petl_disabled")
    if root.merged:
        warnings.warn(
            f"petl_disabled: {root.merged} LoRA update(s) were merged into the weights (merge_lora) "
            f"and stay on; the output is not the bare backbone's",
            PetlWarning,
            stacklevel=3,
        )
    root.enabled = False
    try:
        yield model
    finally:
        root.enabled = True


def petl_config_of(model: nn.Module) -> PetlConfig:
    """The `PetlConfig` applied to ``model``."""
    return petl_root(model, "petl_config_of").config


# ---- save / load -----------------------------------------------------------------------------
def petl_state_dict(model: nn.Module, deploy: bool = True) -> dict[str, torch.Tensor]:
    """Every trainable tensor (PETL, BitFit biases, LayerNorms, head); prefixes flattened if ``deploy``."""
    root = petl_root(model, "petl_state_dict")
    state = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    if deploy:
        for name, enc in root.prefix_encoders():
            if enc.flat is None:
                full = f"{ROOT}.{name}"
                for k in [k for k in state if k.startswith(full + ".")]:
                    del state[k]
                state[f"{full}.flat"] = enc.flattened()
    return {k: v.contiguous() for k, v in state.items()}


def save_petl(model: nn.Module, directory: str | os.PathLike, info: dict | None = None) -> Path:
    """Write ``petl_config.json`` and ``petl_weights.safetensors`` (deployable form) atomically.

    ``info`` (backbone, task, labels, metric, ...) is kept in the config file for loading and prediction.
    """
    directory = Path(directory)
    root = petl_root(model, "save_petl")  # before the folder is made: nothing half-written
    directory.mkdir(parents=True, exist_ok=True)
    config = root.config.to_dict()
    if root.pooling != "native":  # the pooling `auto` resolved to, so a load elsewhere reads the same
        config["pooling"] = root.pooling
    meta = {
        "petl_config": config,
        "model_type": model.config.model_type,
        "num_layers": len(next(iter(stacks(model)[1].values()))),
        "flat_prefix": True,
        "info": info or {},
    }
    atomic_write(directory / WEIGHTS_FILE, lambda p: save_file(petl_state_dict(model), str(p)))
    atomic_write(directory / CONFIG_FILE, lambda p: Path(p).write_text(json.dumps(meta, indent=2), encoding="utf-8"))
    return directory


def load_petl(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Apply the saved config to a fresh backbone and load the saved weights into it."""
    directory = Path(directory)
    if not (directory / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{directory}: no {CONFIG_FILE} here (not a saved PETL directory)")
    meta = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    if meta["model_type"] != model.config.model_type:
        raise ConfigError(f"{directory}: saved for the {meta['model_type']} backbone, got {model.config.model_type}")
    if not (directory / WEIGHTS_FILE).exists():
        raise FileNotFoundError(f"{directory}: no {WEIGHTS_FILE} beside its {CONFIG_FILE} (an incomplete save)")
    saved = dict(meta["petl_config"])
    saved.setdefault("pooling", native_pooling(model))  # saved before the head was configurable
    state = load_file(str(directory / WEIGHTS_FILE), device=str(next(model.parameters()).device))
    with _undone_on_error(model):  # weights that do not fit: the model as it was
        apply_petl(model, PetlConfig.from_dict(saved), flat_prefix=meta.get("flat_prefix", True))
        getattr(model, ROOT).info = meta.get("info", {})
        expected = {n for n, p in model.named_parameters() if p.requires_grad}
        missing, unexpected = expected - set(state), set(state) - expected
        if missing or unexpected:
            raise ConfigError(
                f"{directory}: weights do not match the config "
                f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
            )
        params = dict(model.named_parameters())
        for name, tensor in state.items():
            if params[name].shape != tensor.shape:
                raise ConfigError(
                    f"{directory}: {name} has shape {tuple(tensor.shape)}, the backbone "
                    f"expects {tuple(params[name].shape)}"
                )
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)
    return model


__all__ = [
    "apply_petl",
    "norm_modules",
    "parameter_families",
    "gate_prompt",
    "remove_petl",
    "merge_lora",
    "lora_updates",
    "weight_edits",
    "output_edits",
    "attention_edits",
    "petl_disabled",
    "petl_config_of",
    "petl_state_dict",
    "save_petl",
    "load_petl",
    "PetlRoot",
]
