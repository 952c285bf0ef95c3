"""Train an exported configuration for real, keep only its PETL weights, and use them.

`train_record` trains a record (from `petl-nas export`) with its full recipe, one run per seed,
on the task's training data (the K rows the study used, or all of them when ``k`` is null: the rows carved
for the search dev too, but never a dev file of its own) and
scores it on the test split (the task's dev set). Each run saves `petl_config.json` and
`petl_weights.safetensors` (deployable form: a few hundred KB, never the backbone), and the output
folder gets `metrics.json`. A run already saved for the same record and seed is kept, not redone,
so an interrupted `petl-nas train` resumes at the first missing seed. `load` puts the modules back
on a fresh backbone; `predict` labels texts, or generates them for a generation task (beam search
with the task's settings for seq2seq, greedy continuation of the prompt for a causal LM).

Example:
    >>> summary = train_record(read_record("best.yaml"), seeds=3, out="out/")    # doctest: +SKIP
    >>> model = load("all-MiniLM-L6-v2", "out/seed_0")                           # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import shutil
import statistics
import warnings
from pathlib import Path

import torch

from ..core.budget import check_positions, count_parameters
from ..core.inject import CONFIG_FILE, load_petl, save_petl
from ..core.models import check_backbone_files
from ..core.precision import autocast_for
from ..errors import ConfigError, PetlWarning, read_text
from ..fileio import atomic_folder, atomic_write
from ..study.experiment import Experiment
from ..tasks import load_splits, recorded_task, resolve_task
from ..tasks.encoding import encode
from ..tasks.glue import label_names
from ..training.loading import TrainData, load_backbone, petl_copy, tiny_model
from ..training.loop import train
from ..training.threads import use_threads
from .record import ExportRecord
from .texts import MAX_TEXT_BYTES, check_size

TOKENIZER_DIR = "tokenizer"


def train_record(
    rec: ExportRecord | dict,
    seeds: int | None = None,
    out: str | Path = "petl_out",
    device: str | None = None,
    progress: bool = True,
    printer=print,
    keep_models: bool = False,
    compile: str | None = None,
    cuda_graphs: bool | None = None,
    overwrite: bool = False,
) -> dict:
    """Train ``rec`` (a record, or a mapping of its keys) once per seed; save each run's PETL weights;
    return (and write) the metrics.
    With ``keep_models`` the trained models come back too, under ``"models"`` (not written).
    ``compile`` overrides the record's ``torch.compile`` mode (`petl_nas.training.compiling`), ``cuda_graphs``
    its CUDA graphs (`petl_nas.training.step_graphs`); they change how the runs compute, not what they train,
    so a run already trained without them is kept. Runs another record left in ``out`` are
    refused before anything trains, or replaced with ``overwrite``."""
    out, rec = Path(out), ExportRecord.of(rec)
    if seeds is not None and seeds < 1:
        raise ConfigError(f"seeds: expected a whole number >= 1, got {seeds}")
    others = runs_of_other_records(out, rec)
    if others and not overwrite:
        raise ConfigError(
            f"output folder {str(out)!r} holds runs of another record ({', '.join(others[:3])}"
            f"{', ...' if len(others) > 3 else ''}); choose another --out, or pass --overwrite "
            f"to replace them"
        )
    created = [p for p in (out, *out.parents) if not p.exists()]  # innermost first
    try:  # before any training: a path that cannot be a folder fails now
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"output folder {str(out)!r} cannot be created ({e.strerror})") from None
    foreign = sorted(p.name for p in out.iterdir() if not (p.name == "metrics.json" or p.name.startswith("seed_")))
    if foreign:  # another tool's folder (a converted model, ...): not ours to mix into
        raise ConfigError(
            f"output folder {str(out)!r} holds other files ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); choose another --out"
        )
    try:
        return _train_seeds(rec, seeds, out, device, progress, printer, keep_models, compile, cuda_graphs)
    except BaseException:  # nothing trained: the folders made for it go too
        for folder in created:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def _train_seeds(
    rec: ExportRecord, seeds, out: Path, device, progress, printer, keep_models, compile, cuda_graphs
) -> dict:
    task, config, base_recipe, model, tok, encoded, deployable = _prepared(
        rec, seeds, out, printer, compile, cuda_graphs
    )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    n = seeds or rec.seeds or 1

    def one(seed: int) -> tuple[dict, object]:
        run_dir = out / f"seed_{seed}"  # one layout whatever the seed count (predict --run OUT/seed_0)
        key = run_key(rec, seed)
        done = _finished_run(run_dir, key)
        if done is not None and not keep_models:
            printer(f"seed {seed}: already trained, test {task.main_metric} {done['last']:.4f} -> {run_dir} (kept)")
            return done, None
        if done is None and (run_dir / CONFIG_FILE).exists():
            printer(
                f"seed {seed}: {run_dir} holds a run of another record (configuration, recipe, backbone or "
                f"data); it is replaced"
            )
        trained = petl_copy(model, config, seed)
        result = train(
            trained,
            TrainData(encoded.train, encoded.test),
            task,
            base_recipe.with_overrides(seed=seed),
            device,
            progress=progress,
        )
        run = {
            "seed": seed,
            "dir": str(run_dir),
            "last": result.last_score,
            "best": result.score,
            "train_s": result.wall_s,  # and every metric of the task at its last evaluation
            "metrics": {m: result.history[-1][m] for m in task.metrics if m in result.history[-1]},
        }
        info = {
            "backbone": rec.backbone,
            "task": rec.task,
            "kind": task.kind,
            "labels": list(task.labels),
            "max_length": base_recipe.max_length,
            "metric": task.main_metric,
            "score": result.last_score,
            "data_dir": rec.data_dir,
            "run_key": key,
            "run": run,
        }
        if isinstance(rec.backbone, dict):  # tiny backbones: keep their tokenizer too
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_folder(run_dir / TOKENIZER_DIR, lambda folder: tok.save_pretrained(str(folder)))
        save_petl(trained.cpu(), run_dir, info=info)  # last: its config file marks the run finished
        printer(
            f"seed {seed}: test {task.main_metric} {result.last_score:.4f} in {result.wall_s:.0f}s "
            f"({result.threads} CPU thread{'s' * (result.threads != 1)}) -> {run_dir}"
        )
        return run, trained

    finished: dict[int, tuple[dict, object]] = {}
    elsewhere = []  # seeds another `train` into this folder is training
    for seed in range(n):
        with claim_seed(out, seed, wait=False) as mine:
            if mine:
                finished[seed] = one(seed)
            else:
                elsewhere.append(seed)
    for seed in elsewhere:  # then each is read as trained (or trained, if it stopped)
        printer(f"seed {seed}: another `petl-nas train` into {out} is training it; waiting for it")
        with claim_seed(out, seed, wait=True):
            finished[seed] = one(seed)
    runs = [finished[seed][0] for seed in range(n)]
    models = [finished[seed][1] for seed in range(n) if finished[seed][1] is not None]
    _remove_other_records(out, rec, n, printer)
    summary = _summary(runs, task, len(encoded.test), base_recipe.eval_rows, deployable, rec.provenance)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "metrics.json", lambda p: Path(p).write_text(json.dumps(summary, indent=2), encoding="utf-8"))
    return {**summary, "models": models} if keep_models else summary


def _prepared(rec: ExportRecord, seeds, out: Path, printer, compile, cuda_graphs):
    """(task, configuration, recipe, backbone, tokenizer, encoded splits, deployable count) of a
    record about to be trained: its data and backbone loaded and checked, the folder's room too."""
    task = resolve_task(rec.task)
    config = rec.config()
    recipe = rec.training_recipe(compile=compile, cuda_graphs=cuda_graphs)
    task.check_max_length(recipe.max_length, "recipe.max_length")
    data_seed = Experiment.data_seed if rec.data_seed is None else rec.data_seed  # a record may leave it out
    splits = load_splits(
        task,
        data_dir=rec.data_dir,
        k=rec.k,
        data_seed=data_seed,
        search_dev_size=1 if rec.k is None else rec.search_dev,
    )
    check_backbone_files(rec.backbone)
    model, tok = load_backbone(rec.backbone, task, splits)
    check_positions(model.config, recipe.max_length, "recipe.max_length")
    counts = count_parameters(model.config, config, task.num_labels)
    _check_room(out, seeds or rec.seeds or 1, counts)
    recorded = (rec.counts or {}).get("deployable")
    if recorded is not None and recorded != counts.deployable:  # a record edited onto another backbone or task
        printer(
            f"note: on this backbone the configuration has {counts.deployable:,} deployable parameters; the "
            f"record's counts say {recorded:,} (it was exported for another backbone or task)"
        )
    if rec.k is None:
        splits = splits.for_final_training()
    encoded = encode(splits, tok, max_length=recipe.max_length)
    return task, config, recipe, model, tok, encoded, counts.deployable


def _summary(runs: list[dict], task, n_test: int, eval_rows, deployable: int, provenance) -> dict:
    """metrics.json: the test metric's mean and std over the seeds, each run, every metric's mean."""
    last = [r["last"] for r in runs]
    scored = [r["metrics"] for r in runs if "metrics" in r]  # (runs an earlier petl-nas saved lack them)
    return {
        "metric": task.main_metric,
        "split": "test",
        "mean": statistics.fmean(last),
        "std": statistics.stdev(last) if len(last) > 1 else None,
        "runs": runs,
        "metrics": ({m: statistics.fmean(r[m] for r in scored) for m in scored[0]} if len(scored) == len(runs) else {}),
        "test_rows": n_test if eval_rows is None else min(n_test, eval_rows),
        "test_rows_of": n_test,
        "deployable": deployable,
        "provenance": provenance,
    }


@contextlib.contextmanager
def claim_seed(out: Path, seed: int, wait: bool):
    """True while this process holds seed ``seed`` of ``out`` (an flock on ``seed_<seed>.lock``
    there, removed after), so two `train` runs into one folder never train one seed twice; False
    at once when another holds it and ``wait`` is False."""
    path = out / f"seed_{seed}.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            path.unlink(missing_ok=True)
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove_other_records(out: Path, rec: ExportRecord, n: int, printer) -> None:
    """Remove the runs beyond seed ``n - 1`` that another record left in ``out`` (a folder reused
    for another configuration), so that every run in it is one that its metrics.json describes or a
    further seed of the same record."""
    for run_dir in sorted(out.glob("seed_*")):
        seed = run_dir.name.removeprefix("seed_")
        if not seed.isdigit() or int(seed) < n or not run_dir.is_dir():
            continue
        if _finished_run(run_dir, run_key(rec, int(seed))) is None:
            shutil.rmtree(run_dir)
            printer(f"{run_dir}: a run of another record (or an unfinished one); removed")


RUN_FILES_BYTES = 64 * 1024  # a run's config file, its tokenizer when tiny, and metrics.json, with room


def _check_room(out: Path, n: int, counts) -> None:
    """Refuse before training when ``out``'s disk cannot hold ``n`` runs' weights (fp32, PETL and
    head) and files: a full disk found after the training would waste it."""
    need = n * (4 * (counts.deployable + counts.head) + RUN_FILES_BYTES)
    free = shutil.disk_usage(out).free
    if free < need:
        raise ConfigError(
            f"output folder {str(out)!r}: {free / 1024:,.0f} KiB free on its disk, and {n} "
            f"run{'s' if n > 1 else ''} need about {need / 1024:,.0f} KiB; free some space or "
            f"choose another --out"
        )


def runs_of_other_records(out: Path, rec: ExportRecord) -> list[str]:
    """The finished runs in ``out`` that another record (configuration, recipe, backbone, data)
    trained; a run of ``rec`` itself, of any seed, is not one."""
    others = []
    for run_dir in sorted(Path(out).glob("seed_*")) if Path(out).is_dir() else ():
        seed = run_dir.name.removeprefix("seed_")
        if not (seed.isdigit() and (run_dir / CONFIG_FILE).is_file()):
            continue  # an unfinished run: ours to train again
        try:
            key = _info(run_dir).get("run_key")
        except (ConfigError, ValueError):
            key = None
        if key != run_key(rec, int(seed)):
            others.append(run_dir.name)
    return others


def run_key(rec: ExportRecord, seed: int) -> str:
    """What makes two runs the same: configuration, recipe, backbone, data and seed (a field the record
    leaves out as None, as the runs of earlier versions were keyed)."""
    what = {k: getattr(rec, k) for k in ("backbone", "task", "data_dir", "data_seed", "k", "petl_config", "recipe")}
    return hashlib.sha256(json.dumps({**what, "seed": seed}, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _finished_run(run_dir: Path, key: str) -> dict | None:
    """The saved result of the run ``key`` in ``run_dir``, or None when it is missing or another run's."""
    try:
        info = _info(run_dir)
    except (ConfigError, ValueError):
        return None
    if info.get("run_key") != key or not (run_dir / "petl_weights.safetensors").exists():
        return None
    return info.get("run")


def _info(directory: Path) -> dict:
    directory = Path(directory)
    path = directory / CONFIG_FILE
    if not path.exists():
        if directory.is_file():  # an export record, say: train it first
            raise ConfigError(
                f"{directory}: a file, not a trained run's folder (petl-nas train --config FILE "
                f"--out DIR trains an exported record; then pass DIR/seed_0)"
            )
        if not directory.is_dir():
            raise ConfigError(f"{directory}: no such directory")
        runs = sorted(p.parent.name for p in directory.glob(f"seed_*/{CONFIG_FILE}"))
        if runs:  # the folder `train --out` wrote: one run per seed inside
            raise ConfigError(
                f"{directory}: a `petl-nas train` output folder; pass one of its runs: "
                f"{directory / runs[0]}" + (f" (or {', '.join(runs[1:])})" if runs[1:] else "")
            )
        raise ConfigError(f"{directory}: no {CONFIG_FILE} here (not a trained PETL directory)")
    return check_run(directory)


def check_run(directory: Path) -> dict:
    """The ``info`` of the trained run ``directory``; one line naming its damaged file otherwise
    (a config that is not the JSON `save_petl` writes, weights cut short: headers only are read)."""
    from ..core.inject import WEIGHTS_FILE
    from ..core.models import safetensors_damage

    path = directory / CONFIG_FILE
    try:
        meta = json.loads(read_text(path))
        why = None if isinstance(meta, dict) and isinstance(meta.get("petl_config"), dict) else "no petl_config in it"
    except ValueError as e:
        why = f"not JSON: {str(e).splitlines()[0]}"
    if why:
        raise ConfigError(f"{path}: damaged ({why}); copy or train the run again")
    weights = directory / WEIGHTS_FILE
    why = safetensors_damage(weights) if weights.is_file() else None
    if why:
        raise ConfigError(f"{weights}: damaged ({why}); copy or train the run again")
    info = meta.get("info", {})
    return info if isinstance(info, dict) else {}


def fresh_backbone(directory: str | Path, backbone=None):
    """(model, tokenizer, info) for the trained directory: a fresh copy of its backbone (or
    ``backbone``: name, path, ``{"tiny": ...}``) with the task's head, without PETL."""
    directory = Path(directory)
    info = _info(directory)
    backbone = backbone if backbone is not None else info.get("backbone")
    if backbone is None:
        raise ConfigError(f"{directory}: the backbone is not recorded; pass it")
    task = recorded_task(info["task"], info.get("labels"))  # a file task's files may be gone
    if isinstance(backbone, dict):
        from transformers import AutoTokenizer

        if not (directory / TOKENIZER_DIR).is_dir():  # else transformers would ask the hub for it
            raise ConfigError(
                f"{directory}: a run on a tiny backbone keeps its tokenizer in {TOKENIZER_DIR}/, "
                f"and it is missing; copy the run's folder whole"
            )
        tok = AutoTokenizer.from_pretrained(str(directory / TOKENIZER_DIR))
        return tiny_model(backbone, task, tok), tok, info
    check_backbone_files(backbone)  # a damaged folder (--backbone DIR): one line naming the file
    model, tok = load_backbone(backbone, task)  # a name or path that is no model: one line, as count says it
    return copy.deepcopy(model), tok, info


def load(backbone, directory: str | Path):
    """A fresh ``backbone`` (name, path, ``{"tiny": ...}``, or None for the one it was trained on)
    with the trained PETL modules of ``directory``, in eval mode; ``.petl_tokenizer`` is attached."""
    model, tok, _ = fresh_backbone(directory, backbone)
    model = load_petl(model, directory).eval()
    model.petl_tokenizer = tok
    return model


def check_input(path: str | Path, max_bytes: int = MAX_TEXT_BYTES) -> Path:
    """``path`` if it is a file `read_texts` can read (checked before a model is loaded)."""
    path = _input_path(path)
    if path.suffix.lower() == ".txt":
        _text_lines(path, say_skipped=False, max_bytes=max_bytes)  # said once, when `read_texts` reads them
    return path


def _input_path(path: str | Path) -> Path:
    from ..tasks.files import FORMATS

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"input {str(path)!r}: no such file")
    if path.is_dir() or path.suffix.lower() not in (".txt", *FORMATS):
        raise ConfigError(f"input {str(path)!r}: expected a file ending in {', '.join(('.txt', *FORMATS))}")
    return path


def _text_lines(path: Path, say_skipped: bool = True, max_bytes: int = MAX_TEXT_BYTES) -> list[str]:
    """The texts of a .txt input, one per line (UTF-8; a byte-order mark is not text), each at most
    ``max_bytes``. Blank lines are not texts: skipped, and said once (each answer carries its text,
    so none shifts)."""
    lines = read_text(path).splitlines()
    for i, line in enumerate(lines):
        check_size(line, f"input '{path}', line {i + 1}", max_bytes)
    texts = [line for line in lines if line.strip()]
    if not texts:
        raise ConfigError(f"input '{path}': no texts in it")
    last = max(i for i, line in enumerate(lines) if line.strip())
    blank = [i + 1 for i, line in enumerate(lines[:last]) if not line.strip()]  # trailing ones: nothing to say
    if blank and say_skipped:
        warnings.warn(
            f"input '{path}': {len(blank)} blank line{'s' if len(blank) > 1 else ''} skipped (line "
            f"{', '.join(map(str, blank[:5]))}{', ...' if len(blank) > 5 else ''})",
            PetlWarning,
            stacklevel=2,
        )
    return texts


def read_texts(path: str | Path, text_columns, max_bytes: int = MAX_TEXT_BYTES) -> list[tuple[str, ...]]:
    """Texts to label: a .txt file (one per line) or a .csv/.tsv/.json/.jsonl file with the task's
    columns; each text at most ``max_bytes``."""
    from ..tasks.files import read_table
    from ..tasks.registry import checked_texts

    path = _input_path(path)  # its lines are read once, below
    text_columns = list(text_columns)
    if path.suffix.lower() == ".txt":
        if len(text_columns) > 1:
            raise ConfigError(
                f"input '{path}': the model reads {len(text_columns)} texts a row "
                f"({', '.join(text_columns)}); give a .csv, .tsv, .json or .jsonl file with those columns"
            )
        return [(line,) for line in _text_lines(path, max_bytes=max_bytes)]
    table = read_table(str(path), text_columns)
    rows = list(zip(*[checked_texts(c, table[c], lambda i: f"{path}, row {i + 1}") for c in text_columns]))
    for i, row in enumerate(rows):
        for column, text in zip(text_columns, row):
            check_size(text, f"input '{path}', row {i + 1}, column {column!r}", max_bytes)
    return rows


def predict(model, rows: list[tuple[str, ...]], batch_size: int = 64) -> list[dict]:
    """Label each row: {"label", "label_id", "probabilities": {label: p}} (classification: the label's name,
    GLUE's for its numbered labels, and its index in the task's labels), {"score"} (regression), or
    {"generated"} (text of a seq2seq or causal-LM task, from the row's source or prompt)."""
    info = getattr(model.petl, "info", {}) or {}
    tok = model.petl_tokenizer
    if info.get("kind") in ("seq2seq", "causal_lm"):
        return [{"generated": text} for text in _generate(model, [r[0] if r else "" for r in rows], info, batch_size)]
    out = []
    device = next(model.parameters()).device
    use_threads()
    with torch.no_grad(), autocast_for(model, device):
        for i in range(0, len(rows), batch_size):
            chunk = rows[i : i + batch_size]
            enc = tok(
                *[list(col) for col in zip(*chunk)],
                truncation=True,
                padding=True,
                max_length=info.get("max_length", 128),
                return_tensors="pt",
            ).to(device)
            logits = model(**enc).logits.float().cpu()
            if logits.shape[-1] == 1:
                out += [{"score": float(v)} for v in logits[:, 0]]
            else:
                probs = logits.softmax(-1)
                names = label_names(info.get("task"), info.get("labels") or [str(j) for j in range(probs.shape[-1])])
                out += [
                    {
                        "label": names[int(p.argmax())],
                        "label_id": int(p.argmax()),
                        "probabilities": {name: round(float(x), 6) for name, x in zip(names, p)},
                    }
                    for p in probs
                ]
    return out


def _generate(model, sources: list[str], info: dict, batch_size: int) -> list[str]:
    task, tok = recorded_task(info["task"]), model.petl_tokenizer
    max_length = info.get("max_length", 128)
    if task.kind == "causal_lm":
        from ..tasks.causal_lm import generate_responses

        with autocast_for(model, next(model.parameters()).device):
            return generate_responses(model, tok, sources, max_length, batch_size)
    from ..tasks.decode import generate_ids

    ids = tok(sources, truncation=True, max_length=max_length)["input_ids"]
    with autocast_for(model, next(model.parameters()).device):
        out = generate_ids(model, ids, tok, task.seq2seq, batch_size, next(model.parameters()).device)
    return [t.strip() for t in tok.batch_decode(out, skip_special_tokens=True)]


__all__ = ["train_record", "check_run", "fresh_backbone", "load", "predict", "check_input", "read_texts"]
