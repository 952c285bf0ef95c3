"""Trials per hour on one GPU: one trial at a time against `gpus_per_trial: auto`, side by side.

A MiniLM trial leaves an H100 mostly idle (bound by Python and kernel launches), so the Ray
executor packs trials onto a card by the first trial's measured memory (`petl_nas/search/packing.py`).
This benchmark runs the same search twice through the product's own command, one layout after the
other in one process: ``--gpus-per-trial 1`` (one trial at a time) and ``--gpus-per-trial auto``.
The random sampler with one seed proposes the same configurations in the same order in both, so
the first trials of the two studies are the same trials. It prints, per layout: trials, the
search's wall time (Ray start-up and the first, measuring trial included), trials per hour, where a
trial's time goes (training; setup in the worker: the model, the data, the warm-up; its whole time
in the worker; and its time outside it: from its creation in the study to its end, less its time in
the worker: waiting for a slot, a new worker process's start and imports, reporting back), the GPU
share Ray granted, the card's utilisation and memory (sampled with nvidia-smi), and the
packed/alone ratio of trials per hour.

Throughput does not depend on the weights' values: ``--random-init DIR`` writes a randomly
initialised copy of a checkpoint's architecture (config, tokenizer, pooling) and searches with it,
for a machine that has the code but not the pretrained weights. Scores are then meaningless.

    python bench/gpu_packing.py --model all-MiniLM-L6-v2 --alone 6 --packed 16 --out bench/results/gpu_packing.md
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import statistics
import subprocess
import tempfile
import threading
from pathlib import Path

from search_runs import run_search

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "bench" / "gpu_packing.yaml"


def random_copy(source: str, target: Path) -> str:
    """A randomly initialised model with ``source``'s architecture, tokenizer and pooling files."""
    import torch
    from transformers import AutoConfig, AutoModel

    from petl_nas.core.models import resolve_model

    src = Path(resolve_model(source))
    target.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.suffix in (".safetensors", ".bin", ".pt", ".h5", ".onnx") or item.name in ("onnx", "openvino"):
            continue
        if item.is_dir():  # a second run into the same folder overwrites it
            shutil.copytree(item, target / item.name, dirs_exist_ok=True)
        else:
            shutil.copy(item, target / item.name)
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(src)).save_pretrained(target)
    return str(target)


class GpuSampler:
    """nvidia-smi every second in the background: mean utilisation and the peak memory in use."""

    def __init__(self):
        self.util, self.mem, self._stop = [], [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout.split(",")
                self.util.append(float(out[0]))
                self.mem.append(float(out[1]))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                pass
            self._stop.wait(1.0)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_layout(label: str, gpus: str, trials: int, args, work: Path, limit_s: float | None = None) -> dict:
    """One search with ``--gpus-per-trial gpus`` (stopped after ``limit_s``); what it trained, how
    fast, and the GPU's load."""
    flags = [
        "--experiment",
        str(args.experiment),
        "--model",
        args.model,
        "--data-dir",
        args.data_dir,
        "--trials",
        str(trials),
        "--gpus-per-trial",
        gpus,
        "--cpus-per-trial",
        str(args.cpus_per_trial),
    ]
    gpu = GpuSampler()
    r = run_search(label, flags, work, during=gpu, limit_s=limit_s)
    shares = {t.user_attrs.get("gpu_share") for t in r["done"]} - {None}
    return {
        **r,
        "gpus": gpus,
        "shares": sorted(shares),
        "util": statistics.mean(gpu.util) if gpu.util else None,
        "mem_gb": max(gpu.mem) / 1024 if gpu.mem else None,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| layout | --gpus-per-trial | trials | wall (s) | trials per hour | after the first trial "
        "| second half of the completions | mean training s per trial | mean setup s | mean s in the worker "
        "| mean s outside it | GPU share granted | mean GPU util | peak GPU memory |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        fmt = lambda v, f: f.format(v) if v is not None else "-"  # noqa: E731
        label = f"{r['label']} (cut at {r['wall_s']:.0f} s)" if r["cut"] else r["label"]
        lines.append(
            f"| {label} | {r['gpus']} | {r['trials']} | {r['wall_s']:.0f} | {r['per_hour']:.0f} | "
            f"{fmt(r['steady'], '{:.0f}')} | {fmt(r['late'], '{:.0f}')} | "
            f"{fmt(r['train_s'], '{:.1f}')} | {fmt(r['setup_s'], '{:.1f}')} | "
            f"{fmt(r['trial_wall_s'], '{:.1f}')} | {fmt(r['outside_s'], '{:.1f}')} | "
            f"{', '.join(f'{s:g}' for s in r['shares']) or '-'} | "
            f"{fmt(r['util'], '{:.0f}%')} | {fmt(r['mem_gb'], '{:.1f} GiB')} |"
        )
    return "\n".join(lines)


def timeline(r: dict) -> str:
    """Each trial of a layout in the order they ended: when (from the first trial's creation), its
    number, setup (a worker's first trial loads the backbone and the data), training and wall seconds."""
    fmt = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
    return f"{r['label']}: " + "; ".join(
        f"{end:.0f}s #{n} ({fmt(setup)}+{fmt(train)}/{fmt(wall)})" for end, n, setup, train, wall in r["timeline"]
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default=str(EXPERIMENT))
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--random-init", metavar="DIR", help="search with a random copy of --model written here")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    ap.add_argument("--alone", type=int, default=6, help="trials with one trial per GPU")
    ap.add_argument("--packed", type=int, default=16, help="trials with gpus_per_trial auto")
    ap.add_argument("--cpus-per-trial", type=float, default=1.0)
    ap.add_argument("--alone-limit-s", type=float, help="stop the one-at-a-time search after this long")
    ap.add_argument("--packed-limit-s", type=float, help="stop the packed search after this long")
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    args.data_dir = str(Path(args.data_dir).resolve())
    if args.random_init:
        args.model = random_copy(args.model, Path(args.random_init).resolve())

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_packing: no CUDA device is visible to torch; this benchmark measures GPU packing")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            run_layout("alone", "1", args.alone, args, Path(tmp), args.alone_limit_s),
            run_layout("packed", "auto", args.packed, args, Path(tmp), args.packed_limit_s),
        ]
    ratio = rows[1]["per_hour"] / rows[0]["per_hour"]
    steady = rows[1]["steady"] / rows[0]["steady"] if rows[0]["steady"] and rows[1]["steady"] else None
    late = rows[1]["late"] / rows[0]["late"] if rows[0]["late"] and rows[1]["late"] else None
    common = min(len(rows[0]["scores"]), len(rows[1]["scores"]))
    same = [a for a, b in zip(rows[0]["scores"][:common], rows[1]["scores"][:common]) if a == b]
    report = "\n".join(
        [
            "# Trials per hour on one GPU: one at a time against gpus_per_trial auto",
            "",
            f"{datetime.datetime.now().isoformat(timespec='seconds')} | {torch.cuda.get_device_name()} | "
            f"torch {torch.__version__} | experiment {Path(args.experiment).name} | model "
            f"{'random init of ' if args.random_init else ''}{Path(args.model).name}",
            "",
            table(rows),
            "",
            f"**{ratio:.2f}x trials per hour** packed against one trial at a time over the whole search (Ray's "
            f"start and the first, measuring trial included)"
            + (
                f"; **{steady:.2f}x** from the first trial's end "
                "to the last (trials completed after the first, over that time)"
                if steady
                else ""
            )
            + (f"; **{late:.2f}x** over the second half of each search's completions." if late else "."),
            f"The first {common} trials of both studies: {len(same)} of {common} scored the same.",
            f"Scores (trial, search score): alone {rows[0]['scores']}; packed {rows[1]['scores']}",
            "",
            "Timeline (end from the first trial's creation, trial, setup s + training s / wall s in the worker):",
            "",
            *(timeline(r) + "\n" for r in rows),
        ]
    )
    print("\n" + report)
    if args.out:
        Path(args.out).write_text(report + "\n")


if __name__ == "__main__":
    main()
