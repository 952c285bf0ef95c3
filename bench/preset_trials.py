"""What the trial benchmarks share: their command line, the preset trials they train, one trial run.

`trial_throughput.py` and `threads_per_trial.py` train the same presets × seeds at one fidelity
(MiniLM on SST-2 by default) in pools of worker processes; this module builds those trial specs
from the command line, runs one in a worker and writes the resulting table.
"""

from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def add_arguments(p, epochs: float, seeds: int) -> None:
    """The fidelity and the presets, with this benchmark's default length and seed count."""
    p.add_argument("--task", default="sst2")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--configs", default="lora,compacter_pp,parallel_adapter,bitfit")
    p.add_argument("--seeds", type=int, default=seeds)
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--epochs", type=float, default=epochs)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--search-dev", type=int, default=1000)
    p.add_argument("--out", help="also write the table to this markdown file")


def preset_jobs(args) -> list[dict]:
    """One job per (preset, seed): its name, seed and trial spec (the recipe without path settings)."""
    from petl_nas.search.study import preset_in_space
    from petl_nas.study.space import SearchSpace
    from petl_nas.tasks import get_task
    from petl_nas.training.loading import model_config_for

    task = get_task(args.task)
    model_config = model_config_for(args.model, task)
    space = SearchSpace.load("unified")
    out = []
    for name in args.configs.split(","):
        config, lr = preset_in_space(space, name, model_config, model_config.num_hidden_layers)
        for seed in range(args.seeds):
            recipe = {
                "lr": lr,
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "max_length": args.max_length,
                "seed": seed,
            }
            spec = {
                "backbone": args.model,
                "task": args.task,
                "config": config.to_dict(),
                "recipe": recipe,
                "data_dir": args.data_dir,
                "k": args.k,
                "data_seed": 111,
                "search_dev": args.search_dev,
            }
            out.append({"config": name, "seed": seed, "spec": spec})
    return out


def run_job(job: dict) -> dict:
    """Train one job's trial in this worker: the job's labels with its score and times."""
    from petl_nas.search.worker import TrialSpec, run_trial

    start = time.perf_counter()
    r = run_trial(TrialSpec(**job["spec"]))
    return {
        **{k: v for k, v in job.items() if k != "spec"},
        "score": r.score,
        "se": r.score_se,
        "wall_s": time.perf_counter() - start,
        "train_s": r.train_s,
        "setup_s": r.setup_s,
        "step_ms": r.train_step_ms,
        "evals": len(r.history),
        "steps": r.steps,
        "graphs": r.graphs,
    }


def emit(text: str, out: str | None) -> None:
    """Print the table, and write it to ``out`` when given."""
    print(text)
    if out:
        Path(out).write_text(text)
