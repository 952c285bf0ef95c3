"""Hand a trained run (a `petl-nas train` folder) to tools that do not know petl-nas.

- ``peft``: a HF PEFT adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) for a
  design PEFT expresses (`interop.peft_configs`): each form's trained tensors copied into PEFT's tuner
  by the form's own hooks (`Form.peft_weights`), the trained biases under BitFit (``bias="all"``) and
  the trained head (``modules_to_save``); for a pooling the stock head cannot read (mean pooling into
  BERT's head), an adapter for the base model with the head apart (`pooled.write_head`); or a
  decoder-only language model's soft prompt, as PEFT's prompt tuning. Its ``base_model_name_or_path``
  is the backbone's hub name when the run named one, its local path when the run was given a
  folder, or the name the user passes (``base_name``).
- ``sentence-transformers``: a folder ``SentenceTransformer(path)`` loads, the encoder merged, its
  pooling and the head as a Dense layer (`pooled.write_sentence_transformers`).
- ``merged``: a plain transformers model folder with every update folded into its weight (petl-nas
  folds LoRA; PEFT folds the other forms it expresses), BitFit biases, trained LayerNorms and the
  head in place: ``AutoModelFor...from_pretrained(folder)``. Adapters, prefixes, prompts and gated
  LoRA compute beside the weights.
- ``transformers-remote-code``: for what none of these holds (adapters, Compacter, prefix, gates, a
  prompt after [CLS]), a transformers folder with its own modeling file
  (``from_pretrained(folder, trust_remote_code=True)``, `remote_code`).

No target named: the first that represents the run exactly (`_first_that_fits`). Each conversion is
checked before it is published: the written folder is loaded back the way a user would load it, and
its outputs on a probe batch (and, for a language model, the logits of each step of its greedy
answer to the probe, generated with its cache) must equal the trained model's, or nothing is
written.

Example:
    >>> convert("runs/best/seed_0", "runs/best/model")                  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from ..core.forms import form_named
from ..core.head import native_pooling, stock_head_fields
from ..core.inject import lora_updates, merge_lora, petl_config_of, remove_petl, weight_edits
from ..core.models import (
    DEMO_NAMES,
    auto_class_name,
    hub_options,
    load_for_task,
    load_model_config,
    resolve_model,
    transformers_quiet,
)
from ..errors import ConfigError
from ..tasks import recorded_task
from .interop import MIXABLE, NotExpressible, peft_configs
from .pooled import (
    HEAD_FILE,
    HeadApart,
    SentenceLogits,
    check_sentence_transformers,
    head_apart,
    head_load_lines,
    linear_head,
    write_head,
    write_sentence_transformers,
)
from .remote_code import TARGET as REMOTE_CODE
from .remote_code import reload_remote_code, remote_code_load_lines, write_remote_code
from .runs import fresh_backbone, load

TARGETS = ("peft", "sentence-transformers", "merged", REMOTE_CODE)
_PROBE = ("a short probe", "a longer probe sentence, to check that the converted model is the trained one")


def _check_target(to: str, base_name: str | None, out) -> None:
    """Refuse a target, a base name or an output folder ``convert`` cannot take, one line each."""
    if to not in TARGETS:
        raise ConfigError(f"convert: --to {to!r}: expected one of {', '.join(TARGETS)}")
    if base_name is not None and to != "peft":
        raise ConfigError(
            "convert: --base-name names the base model of a PEFT adapter; a merged model has no "
            "separate base (use it with --to peft)"
        )
    if base_name is not None and not base_name.strip():
        raise ConfigError("convert: --base-name is empty; give the base model's hub name or path")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"output {str(out)!r} exists and is not an empty folder; choose another -o")


def convert(
    directory: str | Path, out: str | Path, to: str | None = None, backbone=None, base_name: str | None = None
) -> dict:
    """Write the trained run ``directory`` as ``to`` (one of `TARGETS`; None: the first of them that
    represents it exactly, `_first_that_fits`) into the new folder ``out``; returns what was written,
    why that target, and the largest output difference the check measured. ``base_name``: what a PEFT
    adapter names as its base (a hub name, for a run trained on a local copy)."""
    if to is None:
        return _first_that_fits(directory, out, backbone, base_name)
    _check_target(to, base_name, out)
    directory, out = Path(directory), Path(out)
    model = load(backbone, directory)
    task = recorded_task(model.petl.info["task"], model.petl.info.get("labels"))  # its files may be gone
    probe = _probe(model.petl_tokenizer, task)
    max_length = model.petl.info.get("max_length", 128)
    expected = _outputs(model, probe)
    with transformers_quiet():
        answer = _greedy(model, probe) if task.kind == "causal_lm" else None
    prompt = petl_config_of(model).prompt_length if to == "peft" else 0  # PEFT's logits begin with the prompt's
    backbone_name = backbone if backbone is not None else model.petl.info.get("backbone")
    named = base_name if base_name is not None else _base_name(backbone_name)
    write, reload = {
        "peft": (_write_peft, _reload_peft),
        "merged": (_write_merged, _reload_merged),
        "sentence-transformers": (_write_sentence, _reload_sentence),
        REMOTE_CODE: (write_remote_code, reload_remote_code),
    }[to]
    overrides = _base_overrides(model, backbone_name)
    created = [p for p in out.parents if not p.exists()]  # innermost first: removed again if refused
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:  # name the folder asked for, not a temporary one
        raise ConfigError(f"output {str(out)!r} cannot be created ({e.strerror})") from None
    written = False
    try:
        with transformers_quiet(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            what = write(model, directory, task, staging, named)  # (transformers' save reads a property it deprecated)
            model.petl_tokenizer.save_pretrained(str(staging))
            reloaded = reload(staging, directory, backbone_name, task, overrides)
            got = _outputs(reloaded, probe)[:, prompt:]
            generated = _greedy(reloaded, probe) if answer is not None else None
        diff = _gap(got, expected)
        if not _close(got, expected):
            raise ConfigError(
                f"convert: the {to} model's outputs differ from the trained model's by up to "
                f"{diff:.2e}; nothing written"
            )
        if answer is not None and not _close(generated, answer):
            raise ConfigError(
                f"convert: the {to} model's outputs equal the trained model's, but its own generate() "
                f"answers otherwise (step logits differ by up to {_gap(generated, answer):.2e}"
                f"{_PEFT_PROMPT_GENERATION if prompt else ''}); nothing written (petl-nas predict "
                f"--run {directory} generates with it)"
            )
        _usual_modes(staging)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
        written = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in [] if written else created:  # nothing written: nothing left behind
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    return {
        "to": to,
        "out": str(out),
        "max_abs_diff": diff,
        "answer_checked": answer is not None,
        **what,
        "load_with": _load_with(to, task, str(out), backbone_name, overrides, max_length),
    }


def _first_that_fits(directory, out, backbone, base_name) -> dict:
    """The most standard target that represents the run exactly: a PEFT adapter with its head
    (``modules_to_save``) where the stock head reads the run's pooling, else a sentence-transformers
    folder (its Pooling and the head as a Dense layer load in one line), then the others in turn,
    last the folder with its own modeling code (the least standard: its loader runs that file)."""
    model = load(backbone, Path(directory))
    task = recorded_task(model.petl.info["task"], model.petl.info.get("labels"))
    apart = head_apart(model, task)
    order = ("sentence-transformers", "peft", "merged") if apart else ("peft", "merged")
    order += (REMOTE_CODE,)
    why = (
        f"pooling {model.petl.pooling}, which the stock {type(model).__name__} head does not read: "
        f"a sentence-transformers folder holds the pooling and the head"
        if apart
        else "a PEFT adapter with the trained head as modules_to_save: what PEFT users load"
    )
    refused = []
    for to in order:
        try:
            done = convert(directory, out, to, backbone, base_name if to == "peft" else None)
        except ConfigError as e:
            refused.append(f"{to}: {str(e).removeprefix(f'{directory}: ')}")
            continue
        if to == REMOTE_CODE:  # each refusal's first reason: one line
            blocks = "; ".join(r.split("; ")[0] for r in refused)
            why = f"no standard library holds it ({blocks}): {REMOTE_CODE} rebuilds it exactly"
        return {
            **done,
            "why": why if not refused or to == REMOTE_CODE else "; ".join(refused) + f"; {to} represents it",
        }
    raise ConfigError(f"convert: no target represents {directory} exactly: " + "; ".join(refused))


def _base_name(backbone) -> str | None:
    """What a PEFT adapter names as its base when the user does not say: the hub name of the
    backbone the run named (the demo package is a copy of the hub's all-MiniLM-L6-v2), the absolute
    path of a folder, nothing for a tiny backbone built in memory."""
    if not isinstance(backbone, str):
        return None
    if Path(backbone).is_dir():
        return str(Path(backbone).resolve())
    return DEMO_NAMES[-1] if backbone in DEMO_NAMES else backbone


def _gap(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max()) if got.shape == expected.shape else float("inf")


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return _gap(got, expected) <= 1e-4 * (1.0 + float(expected.abs().max()))


# peft 0.21.2 with transformers 5.24: PEFT's generation looks for the cache under its old name,
# past_key_values (peft_model.py), where transformers' generate() now keeps it as cache
# (generation/utils.py); its prompt-tuning answers then differ from its own forward pass (measured).
_PEFT_PROMPT_GENERATION = (
    "; PEFT's prompt tuning generates from its cache under the name past_key_values, which transformers 5.24 renamed"
)


def _greedy(model, batch: dict, new_tokens: int = 6) -> torch.Tensor:
    """The logits of each step of the greedy continuation of the probe's first row (its real tokens),
    generated with the model's cache: [steps, vocabulary]."""
    real = batch["attention_mask"][0].bool()
    ids = batch["input_ids"][:1, real].to(next(model.parameters()).device)
    with torch.no_grad():
        out = model.eval().generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return torch.cat(out.logits).float().cpu()


def _usual_modes(folder: Path) -> None:
    """The folder and its files readable as any other (mkdtemp makes the folder 0700, and transformers'
    save_pretrained writes its weights 0600): a serving account must be able to read them."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for path in folder.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _base_overrides(model, backbone) -> dict:
    """Config values the trained model runs with that its checkpoint lacks, which a PEFT user must
    pass when loading the base: the pad token petl-nas gave a decoder without one (its end token);
    without it the stock head refuses any batch of more than one row."""
    if not isinstance(backbone, str) or model.config.pad_token_id is None:
        return {}
    return {"pad_token_id": model.config.pad_token_id} if load_model_config(backbone).pad_token_id is None else {}


def _base_arguments(task, overrides: dict) -> dict:
    return {**({"num_labels": task.num_labels} if not task.generative else {}), **overrides}


def _load_with(to: str, task, out: str, backbone, overrides: dict, max_length: int) -> str:
    """The line of Python that loads what was written."""
    if to == REMOTE_CODE:
        return remote_code_load_lines(out, max_length)
    if to == "merged":
        return f"{auto_class_name(task)}.from_pretrained({out!r})"
    if to == "sentence-transformers":
        return (
            "from sentence_transformers import SentenceTransformer\n"
            f"logits = SentenceTransformer({out!r}).encode(texts)"
        )
    base = repr(resolve_model(backbone)) if isinstance(backbone, str) else "BACKBONE"
    if names := mixed_adapters(Path(out)):
        return "\n".join(_mixed_lines(base, out, names, task, overrides, max_length))
    if (Path(out) / HEAD_FILE).exists():
        return "\n".join(head_load_lines(base, out))
    arguments = "".join(f", {k}={v!r}" for k, v in _base_arguments(task, overrides).items())
    return f"PeftModel.from_pretrained({auto_class_name(task)}.from_pretrained({base}{arguments}), {out!r})"


def _mixed_lines(base: str, out: str, names: list[str], task, overrides: dict, max_length: int) -> list[str]:
    """The lines that join the adapters of a mix in a PeftMixedModel (and pool and apply a head
    written apart) and give the logits of ``texts``."""
    apart = (Path(out) / HEAD_FILE).exists()
    auto = "AutoModel" if apart else auto_class_name(task)
    arguments = "" if apart else "".join(f", {k}={v!r}" for k, v in _base_arguments(task, overrides).items())
    join = (
        f"mixed = PeftMixedModel.from_pretrained({auto}.from_pretrained({base}{arguments}), "
        f"{f'{out}/{names[0]}'!r}, adapter_name={names[0]!r}); "
        + "".join(f"mixed.load_adapter({f'{out}/{n}'!r}, adapter_name={n!r}); " for n in names[1:])
        + f"mixed.set_adapter({names!r})"
    )
    if apart:
        lines = head_load_lines(base, out)
        loaded = f"PeftModel.from_pretrained(AutoModel.from_pretrained({base}), {out!r})"
        return [lines[0].replace("PeftModel", "PeftMixedModel"), join, lines[1].replace(loaded, "mixed"), *lines[2:]]
    return [
        f"from peft import PeftMixedModel; from transformers import {auto}, AutoTokenizer",
        join,
        f"tok = AutoTokenizer.from_pretrained({out!r})",
        f"logits = mixed.eval()(**tok(texts, padding=True, truncation=True, max_length={max_length}, "
        "return_tensors='pt')).logits",
    ]


def _probe(tok, task) -> dict:
    """A padded batch of two texts (pairs for a sentence-pair task), as the model reads its rows."""
    columns = [list(_PROBE)] * (1 if task.generative else max(1, len(task.text_columns)))
    batch = dict(tok(*columns, padding=True, truncation=True, max_length=32, return_tensors="pt"))
    if task.kind == "seq2seq":
        batch["decoder_input_ids"] = batch["input_ids"][:, :4]
    return batch


def _outputs(model, batch: dict) -> torch.Tensor:
    device = next(model.parameters()).device
    with torch.no_grad():
        return model.eval()(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()


# ---- PEFT -----------------------------------------------------------------------------------------
def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("convert --to peft needs the peft package: pip install peft") from None
    return peft


class MixedTuners(ConfigError):
    """The run mixes PEFT tuner types: one PEFT model cannot hold it (`_write_peft_mixed` writes it)."""


def _peft_model(model, directory: Path, task, apart: bool):
    """``model`` (petl-nas applied) as a PEFT model of its backbone, in place, every tuner's weights
    copied from the PETL module on the same weight through its form (`Form.peft_weights`): the base
    model alone when the head is written apart, else the classifier with its head as
    ``modules_to_save``. (model, its PEFT configs)."""
    peft = _peft()
    config = petl_config_of(model)
    edits = [(model.get_submodule(path), config.modules[i], module) for path, i, module, _ in weight_edits(model)]
    prompt = model.petl.prompt.embeddings.detach().clone() if model.petl.prompt is not None else None
    try:  # before anything changes: a refusal leaves the model as it was
        configs = peft_configs(config, model.config, task.kind, head_apart=apart)
    except NotExpressible as e:
        raise ConfigError(f"{directory}: {e}") from None
    if len(configs) > 1:
        raise MixedTuners(
            f"{directory}: a mix of PEFT tuners ({' + '.join(configs)}): a PeftMixedModel of adapters "
            f"saved apart, which convert --to peft writes"
        )
    base = remove_petl(model, warn=False)  # the backbone with its trained head and biases in place
    ((adapter, exported),) = configs.items()
    wrapped = peft.get_peft_model(base.base_model if apart else base, peft.get_peft_config(exported))
    with torch.no_grad():
        _copy_tuners(peft, wrapped, edits, adapter)
        if prompt is not None:  # a decoder's prompt: PEFT's prompt tuning, prepended alike
            wrapped.prompt_encoder[adapter].embedding.weight.copy_(prompt)
    return wrapped, exported, len(edits)


def _copy_tuners(peft, wrapped, edits: list, adapter: str, peft_type: str | None = None) -> int:
    """Copy each edit's trained tensors (of PEFT type ``peft_type``, None: all) into the tuner layer of
    ``wrapped`` on the same weight; how many."""
    layers = {
        id(layer.get_base_layer()): layer
        for layer in wrapped.modules()
        if isinstance(layer, peft.tuners.tuners_utils.BaseTunerLayer)
    }
    copied = [
        (linear, spec, module) for linear, spec, module in edits if peft_type in (None, form_named(spec.form).peft_type)
    ]
    for linear, spec, module in copied:
        form_named(spec.form).peft_weights(module, layers[id(linear)], adapter)
    return len(copied)


def _write_peft_mixed(model, directory: Path, task, staging: Path, base_name: str | None, apart: bool) -> dict:
    """A mix of tuner types `peft.PeftMixedModel` holds (LoRA, LoHa, LoKr, ...), which peft 0.21
    cannot save as one: each type as its own PEFT adapter folder, ``staging/mixed_<type>``, written from one
    `PeftModel` at a time on the same base; `PeftMixedModel.from_pretrained` and ``load_adapter``
    join them again (`_reload_peft`)."""
    peft = _peft()
    config = petl_config_of(model)
    edits = [(model.get_submodule(path), config.modules[i], module) for path, i, module, _ in weight_edits(model)]
    configs = peft_configs(config, model.config, task.kind, head_apart=apart)
    bad = [c["peft_type"] for c in configs.values() if c["peft_type"] not in MIXABLE]
    if bad or model.petl.prompt is not None:
        raise ConfigError(f"{directory}: PeftMixedModel mixes {', '.join(MIXABLE)}, not {', '.join(bad) or 'a prompt'}")
    base = remove_petl(model, warn=False)
    base = base.base_model if apart else base
    n = 0
    configs = {f"mixed_{name}": c for name, c in configs.items()}  # PEFT warns of 'lora' within its 'lora_' prefix
    for name, exported in configs.items():
        wrapped = peft.get_peft_model(base, peft.get_peft_config(exported), adapter_name=name)
        with torch.no_grad():
            n += _copy_tuners(peft, wrapped, edits, name, exported["peft_type"])
        wrapped.peft_config[name].base_model_name_or_path = base_name
        wrapped.save_pretrained(str(staging), save_embedding_layers=False)  # a named adapter: into staging/name
        base = wrapped.unload()
    return {"updates": n, "peft_config": configs, "mixed": sorted(configs), "base_name": base_name}


def mixed_adapters(folder: Path) -> list[str]:
    """The adapters of a PeftMixedModel written apart (`_write_peft_mixed`), or [] for one adapter."""
    return sorted(p.name for p in Path(folder).iterdir() if (p / "adapter_config.json").is_file())


def _write_peft(model, directory: Path, task, staging: Path, base_name: str | None = None) -> dict:
    apart = head_apart(model, task)
    head = write_head(model, staging, model.petl.info.get("labels"), f"{directory}") if apart else {}
    try:
        wrapped, exported, n = _peft_model(model, directory, task, apart)
    except MixedTuners:
        return {**_write_peft_mixed(model, directory, task, staging, base_name, apart), **head}
    wrapped.peft_config["default"].base_model_name_or_path = base_name  # PEFT's would be the path loaded here
    wrapped.save_pretrained(str(staging), save_embedding_layers=False)  # nothing trains them; and PEFT would ask
    # the hub about the base named above
    return {"updates": n, "peft_config": exported, "base_name": base_name, **head}


def _reload_peft(staging: Path, directory: Path, backbone, task, overrides: dict):
    """As the printed line loads it: the checkpoint by transformers alone (a tiny backbone, which has
    no checkpoint, as petl-nas builds it), then the adapter by PEFT."""
    if isinstance(backbone, str):
        import transformers

        path = resolve_model(backbone)
        apart = (staging / HEAD_FILE).exists()
        auto = "AutoModel" if apart else auto_class_name(task)
        base = getattr(transformers, auto).from_pretrained(
            path, **({} if apart else _base_arguments(task, overrides)), **hub_options(path)
        )
    else:
        base, _, _ = fresh_backbone(directory, backbone)
        base = base.base_model if (staging / HEAD_FILE).exists() else base
    if names := mixed_adapters(staging):
        model = _peft().PeftMixedModel.from_pretrained(base, str(staging / names[0]), adapter_name=names[0])
        for name in names[1:]:
            model.load_adapter(str(staging / name), adapter_name=name)
        model.set_adapter(names)
    else:
        model = _peft().PeftModel.from_pretrained(base, str(staging))
    return HeadApart(model, staging) if (staging / HEAD_FILE).exists() else model


# ---- merged ---------------------------------------------------------------------------------------
def _same_weight(a, b) -> bool:
    """Do modules ``a`` and ``b`` update one weight somewhere (a target, a layer and a block in common)?"""

    def overlap(x, y):
        return x is None or y is None or bool(set(x) & set(y))

    return (
        a.position == b.position
        and bool(set(a.targets) & set(b.targets))
        and overlap(a.layers, b.layers)
        and overlap(a.blocks, b.blocks)
    )


def _fold_refusals(model) -> list[str]:
    """What does not fold into the backbone's weights (`merge_lora`)."""
    config = petl_config_of(model)
    reasons = []
    for i, m in enumerate(config.modules):
        where = f"modules[{i}] ({m.form} at {m.position})"
        if m.form != "lora":
            reasons.append(f"{where} computes beside the weights")
        elif m.gate:
            reasons.append(f"{where}: its gate depends on the input")
        elif m.dora and any(_same_weight(m, n) for n in config.modules if n is not m and n.form == "lora"):
            reasons.append(f"{where}: DoRA reads a weight another LoRA also updates")
    if config.prompt_length:
        reasons.append("a soft prompt computes beside the weights")
    return reasons


def _merge_refusals(model) -> list[str]:
    reasons = _fold_refusals(model)
    if stock_head_fields(model, model.petl.pooling) is None:
        native = native_pooling(model)
        reasons.append(
            f"pooling: {model.petl.pooling} (the stock {type(model).__name__} head reads "
            f"{'[CLS] through the pooler' if native == 'pooler' else native}; trained with pooling: "
            f"{'pooler_trained' if native == 'pooler' else native}, it merges; convert --to sentence-transformers "
            f"writes this pooling and head)"
        )
    return reasons


def merge_and_unload(model):
    """``model`` (a transformers model with petl-nas applied) as a plain transformers model, in place,
    as PEFT's ``merge_and_unload``: every LoRA update folded into the weight it updates, the PETL
    edits removed, the head's config set to read as the configuration's pooling did (ModernBERT's
    ``classifier_pooling``); trained biases, LayerNorms and the head stay. What does not fold is a
    `ConfigError` naming each part, and the model is left as it was: adapters, Compacters, prefixes,
    prompts and gated LoRA compute beside the weights, and a pooling the architecture's own head cannot
    read (mean pooling into BERT's [CLS] head) would change the outputs.

    Example:
        >>> plain = merge_and_unload(model); plain.save_pretrained("merged")   # doctest: +SKIP
    """
    if reasons := _merge_refusals(model):
        raise ConfigError("cannot be merged into a plain transformers model: " + "; ".join(reasons))
    fields = stock_head_fields(model, model.petl.pooling)
    merge_lora(model)
    remove_petl(model)
    for name, value in fields.items():
        setattr(model.config, name, value)
    return model


def _write_merged(model, directory: Path, task, staging: Path, base_name: None = None) -> dict:
    labels = model.petl.info.get("labels") or []
    folded = len(lora_updates(model))
    try:
        merge_and_unload(model)
    except ConfigError as e:
        refused = ConfigError(f"{directory}: {e} (petl-nas predict --run reads it as it is)")
        if stock_head_fields(model, model.petl.pooling) != {}:
            raise refused from None
        try:  # a form PEFT expresses and merges (each form's own hooks)
            wrapped, _, folded = _peft_model(model, directory, task, apart=False)
        except ConfigError:
            raise refused from None
        try:  # a soft prompt: PEFT's prompt tuning has nothing to merge
            model = wrapped.merge_and_unload()
        except (ValueError, NotImplementedError, AttributeError):
            raise refused from None
    if task.kind == "classification" and labels:
        model.config.id2label = dict(enumerate(labels))
        model.config.label2id = {label: i for i, label in enumerate(labels)}
    if task.kind == "seq2seq":  # a plain generate() decodes as petl-nas predict does
        for key, value in task.seq2seq.generate_kwargs().items():
            setattr(model.generation_config, key, value)
    model.save_pretrained(str(staging))
    return {"updates": folded}


# ---- sentence-transformers ------------------------------------------------------------------------
def _write_sentence(model, directory: Path, task, staging: Path, base_name: None = None) -> dict:
    check_sentence_transformers(model, task, str(directory))
    _, head = linear_head(model, str(directory))
    pooling, max_length = model.petl.pooling, model.petl.info.get("max_length", 128)
    if not _fold_refusals(model):  # petl-nas folds it: LoRA, BitFit, LayerNorms
        updates = merge_lora(model)
        encoder = remove_petl(model, warn=False).base_model
    else:  # a form PEFT expresses: PEFT folds it
        wrapped, _, updates = _peft_model(model, directory, task, apart=True)
        try:
            encoder = wrapped.merge_and_unload()
        except (ValueError, NotImplementedError, AttributeError) as e:
            raise ConfigError(
                f"{directory}: PEFT cannot merge it ({e}); convert --to peft writes the adapter"
            ) from None
    written = write_sentence_transformers(encoder, head, pooling, model.petl_tokenizer, max_length, staging)
    return {"updates": updates, **written}


def _reload_sentence(staging: Path, directory: Path, backbone, task, overrides: dict):
    return SentenceLogits(staging)


def _reload_merged(staging: Path, directory: Path, backbone, task, overrides: dict):
    return load_for_task(str(staging), task)


__all__ = ["convert", "merge_and_unload", "TARGETS"]
