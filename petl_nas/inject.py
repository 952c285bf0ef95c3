"""Apply a `PetlConfig` to a transformers model, freeze the rest, and save/load the PETL weights.

Every PETL parameter lives under one submodule, ``model.petl`` (so its names all start with
``petl.``); BitFit biases, LayerNorms and the task head are the only other trainable tensors.
Edits reach the backbone in two ways, both named by the backbone spec, never by model class:
- one forward hook per modified linear (q/k/v/o, W1/W2) applies its edits in a fixed order:
  LoRA updates first, then adapters (sequential ones read the updated output);
- head-attention edits (prefix, multi-head adapter) ride on the ``petl`` attention function.

Example:
    >>> model = AutoModelForSequenceClassification.from_pretrained(path)   # doctest: +SKIP
    >>> apply_petl(model, preset("mam", model.config))                     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.initialization import no_init_weights

from .backbones import BackboneSpec, layer_list
from .config import ConfigError, PetlConfig
from .modules import (ATTENTION_NAME, Bottleneck, CompacterAdapter, Composition, HeadEdits, LoRA,
                      MultiHeadAdapter, PrefixEncoder, SharedRule, SoftPrompt)
from .modules import head_attention

ROOT = "petl"
CONFIG_FILE = "petl_config.json"
WEIGHTS_FILE = "petl_weights.safetensors"


class PetlRoot(nn.Module):
    """Owns the PETL parameters (``groups``: one per module spec), the hooks and the on/off switch."""

    def __init__(self, config: PetlConfig, flat_prefix: bool):
        super().__init__()
        self.config = config
        self.flat_prefix = flat_prefix
        self.enabled = True
        self.groups = nn.ModuleDict()
        self.prompt: SoftPrompt | None = None
        self._handles: list = []
        self._attn_modules: list[nn.Module] = []
        self._inputs: dict[tuple[int, str], torch.Tensor] = {}
        self._previous_attn: str | None = None

    def prefix_encoders(self) -> list[tuple[str, PrefixEncoder]]:
        return [(n, m) for n, m in self.named_modules() if isinstance(m, PrefixEncoder)]


def _dims(config) -> tuple[int, int, int, int]:
    d = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return d, heads, head_dim, kv_heads


class _Site:
    """The ordered edits on one linear's output; ``capture`` holds a sublayer input x when needed."""

    def __init__(self):
        self.edits: list[tuple[int, str, nn.Module, str | None]] = []  # (order, kind, module, x source)

    def add(self, kind: str, module: nn.Module, source: str | None = None):
        self.edits.append((0 if kind == "lora" else 1, kind, module, source))


def apply_petl(model: nn.Module, config: PetlConfig, *, flat_prefix: bool = False) -> nn.Module:
    """Insert the configured modules into ``model`` in place, freeze everything else, and return it.

    Args:
        model: a transformers model whose ``config.model_type`` has a backbone spec.
        config: the design to apply.
        flat_prefix: build prefixes in their deployable (flattened) form, as ``load_petl`` does.
    """
    if hasattr(model, ROOT):
        raise ConfigError("model already has PETL modules; apply a config to a fresh backbone")
    spec, layers = layer_list(model)
    config.check_depth(len(layers))
    d, heads, head_dim, kv_heads = _dims(model.config)
    ref = next(model.parameters())
    root = PetlRoot(config, flat_prefix)
    sites: dict[tuple[int, str], _Site] = defaultdict(_Site)
    captures: set[tuple[int, str]] = set()    # (layer, 'attn'|'ffn') whose input x must be kept
    head_edits: dict[int, HeadEdits] = {}
    is_on = lambda: root.enabled  # noqa: E731

    # On the meta device (parameter counting) weights have no values: skip their initialisation.
    skip_init = no_init_weights() if ref.device.type == "meta" else contextlib.nullcontext()
    with torch.device(ref.device), skip_init:
        for i, m in enumerate(config.modules):
            group = nn.ModuleDict()
            root.groups[f"{i}_{m.key}"] = group
            covered = config.layers_of(m, len(layers))
            if m.form in ("adapter", "compacter"):
                rule = SharedRule(m.phm_n) if m.form == "compacter" else None
                if rule is not None:
                    group["rule"] = rule
                for l in covered:
                    block = Bottleneck(m, d) if rule is None else CompacterAdapter(m, d, rule)
                    group[str(l)] = block
                    out_site = "o" if m.position == "attn" else "ffn_out"
                    if m.insertion == "parallel":
                        captures.add((l, m.position))
                        sites[(l, out_site)].add("parallel", block, m.position)
                    else:
                        sites[(l, out_site)].add("sequential", block)
            elif m.form == "lora":
                for l in covered:
                    for t in m.targets:
                        linear = layers[l].get_submodule(spec.site(t))
                        lora = LoRA(m, linear.in_features, linear.out_features)
                        group[f"{l}_{t}"] = lora
                        sites[(l, t)].add("lora", lora)
            elif m.form == "prefix":
                enc = PrefixEncoder(len(covered), kv_heads, head_dim, m.size, m.reparam, d, flat=flat_prefix)
                group["encoder"] = enc
                for slot, l in enumerate(covered):
                    comp = None
                    if m.gate or m.composition == "scaled":
                        comp = group[str(l)] = Composition(m, heads * head_dim)
                    e = head_edits.setdefault(l, HeadEdits(is_enabled=is_on))
                    e.prefix, e.prefix_index, e.prefix_composition, e.prefix_compose = enc, slot, m.composition, comp
            elif m.form == "mh_adapter":
                for l in covered:
                    mh = group[str(l)] = MultiHeadAdapter(m, heads, head_dim)
                    head_edits.setdefault(l, HeadEdits(is_enabled=is_on)).mh = mh
        if config.prompt_length:
            root.prompt = SoftPrompt(config.prompt_length, d)
    root.to(ref.dtype)

    model.add_module(ROOT, root)
    _freeze(model, root, config)
    _install_hooks(model, root, spec, layers, sites, captures, head_edits)
    return model


def _freeze(model: nn.Module, root: PetlRoot, config: PetlConfig) -> None:
    backbone = {id(p) for p in model.base_model.parameters()} - {id(p) for p in root.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) not in backbone)            # PETL and the task head train
    for name, p in model.base_model.named_parameters():
        if id(p) in backbone and config.bitfit and name.endswith("bias"):
            p.requires_grad_(True)
    if config.train_layernorms:
        for mod in model.base_model.modules():
            if isinstance(mod, nn.LayerNorm) or type(mod).__name__.endswith(("LayerNorm", "RMSNorm")):
                for p in mod.parameters():
                    p.requires_grad_(True)


def _install_hooks(model, root, spec: BackboneSpec, layers, sites, captures, head_edits) -> None:
    handles = root._handles
    slot = root._inputs
    for l, position in sorted(captures):
        # x of the attention sublayer is q's input; x of the FFN is W1's input.
        src = layers[l].get_submodule(spec.q if position == "attn" else spec.ffn_in)

        def keep(mod, args, key=(l, position), slot=slot):
            slot[key] = args[0]
        handles.append(src.register_forward_pre_hook(keep))

    for (l, site_name), site in sites.items():
        edits = [(kind, mod, src) for _, kind, mod, src in sorted(site.edits, key=lambda e: e[0])]
        linear = layers[l].get_submodule(spec.site(site_name))

        def apply_edits(mod, args, out, edits=edits, l=l):
            if not root.enabled:
                return None
            x = args[0]
            for kind, block, src in edits:
                if kind == "lora":
                    out = out + block(x)
                elif kind == "sequential":
                    out = out + block(out)
                else:
                    out = out + block(root._inputs.pop((l, src)))
            return out
        handles.append(linear.register_forward_hook(apply_edits))

    for l, edits in head_edits.items():
        attn = layers[l].get_submodule(spec.attention)
        head_attention.attach(attn, edits)
        root._attn_modules.append(attn)
    if head_edits:
        root._previous_attn = model.config._attn_implementation
        model.set_attn_implementation(ATTENTION_NAME)

    def begin_forward(mod, args, kwargs):
        for _, enc in root.prefix_encoders():
            enc.clear()
        if root.prompt is not None and root.enabled:
            return root.prompt.rewrite_inputs(mod, args, kwargs)
        return None
    handles.append(model.register_forward_pre_hook(begin_forward, with_kwargs=True))


def remove_petl(model: nn.Module) -> nn.Module:
    """Undo `apply_petl`: drop hooks, attention edits and the ``petl`` submodule (weights stay frozen)."""
    root: PetlRoot = getattr(model, ROOT)
    for h in root._handles:
        h.remove()
    for attn in root._attn_modules:
        head_attention.detach(attn)
    if root._previous_attn is not None:
        model.set_attn_implementation(root._previous_attn)
    del model._modules[ROOT]
    return model


@contextlib.contextmanager
def petl_disabled(model: nn.Module):
    """Run the bare backbone (every PETL edit off) inside the block."""
    root: PetlRoot = getattr(model, ROOT)
    root.enabled = False
    try:
        yield model
    finally:
        root.enabled = True


def petl_config_of(model: nn.Module) -> PetlConfig:
    return getattr(model, ROOT).config


# ---- save / load -----------------------------------------------------------------------------
def petl_state_dict(model: nn.Module, deploy: bool = True) -> dict[str, torch.Tensor]:
    """Every trainable tensor (PETL, BitFit biases, LayerNorms, head); prefixes flattened if ``deploy``."""
    root: PetlRoot = getattr(model, ROOT)
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
    directory.mkdir(parents=True, exist_ok=True)
    root: PetlRoot = getattr(model, ROOT)
    meta = {"petl_config": root.config.to_dict(), "model_type": model.config.model_type,
            "num_layers": len(layer_list(model)[1]), "flat_prefix": True, "info": info or {}}
    _atomic_write(directory / WEIGHTS_FILE, lambda p: save_file(petl_state_dict(model), str(p)))
    _atomic_write(directory / CONFIG_FILE, lambda p: Path(p).write_text(json.dumps(meta, indent=2)))
    return directory


def load_petl(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Apply the saved config to a fresh backbone and load the saved weights into it."""
    directory = Path(directory)
    if not (directory / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{directory}: no {CONFIG_FILE} here (not a saved PETL directory)")
    meta = json.loads((directory / CONFIG_FILE).read_text())
    if meta["model_type"] != model.config.model_type:
        raise ConfigError(f"{directory}: saved for a {meta['model_type']} backbone, "
                          f"got {model.config.model_type}")
    apply_petl(model, PetlConfig.from_dict(meta["petl_config"]), flat_prefix=meta.get("flat_prefix", True))
    getattr(model, ROOT).info = meta.get("info", {})
    state = load_file(str(directory / WEIGHTS_FILE), device=str(next(model.parameters()).device))
    expected = {n for n, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ConfigError(f"{directory}: weights do not match the config "
                          f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in state.items():
            if params[name].shape != tensor.shape:
                raise ConfigError(f"{directory}: {name} has shape {tuple(tensor.shape)}, the backbone "
                                  f"expects {tuple(params[name].shape)}")
            params[name].copy_(tensor)
    return model


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask)            # mkstemp makes 0600; keep the usual file mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


__all__ = ["apply_petl", "remove_petl", "petl_disabled", "petl_config_of", "petl_state_dict",
           "save_petl", "load_petl", "PetlRoot"]
