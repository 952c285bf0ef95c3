"""Two `petl-nas train` runs of one record into one ``--out`` at once train each seed once: a seed is
claimed (an flock beside its folder) by the process that trains it; the other process trains the
seeds no one holds, then waits for the held ones and reads them as trained."""

from __future__ import annotations

import multiprocessing

from conftest import TINY_BACKBONE

RECORD = {
    "backbone": TINY_BACKBONE,
    "task": "demo_keyword",
    "petl_config": {"modules": [{"form": "lora", "position": "attn", "size": 2}]},
    "recipe": {"lr": 1e-3, "epochs": 1, "batch_size": 16, "max_length": 16},
    "k": 32,
    "search_dev": 16,
}


def _train(out: str, start, lines) -> None:
    """One `train` process; each seed's training takes 2 s more, so the two processes overlap."""
    import time

    from petl_nas.deploy import runs

    real = runs.train

    def slow(*args, **kwargs):
        time.sleep(2)
        return real(*args, **kwargs)

    runs.train = slow
    said = []
    start.wait(120)  # both processes are ready: go at once
    runs.train_record(RECORD, seeds=3, out=out, progress=False, printer=said.append)
    lines.put(said)


def test_two_trains_into_one_folder_train_each_seed_once(tmp_path):
    context = multiprocessing.get_context("spawn")
    start, lines = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_train, args=(str(tmp_path / "out"), start, lines)) for _ in range(2)]
    for w in workers:
        w.start()
    said = [lines.get(timeout=300) for _ in workers]
    for w in workers:
        w.join(30)
    trained = sorted(line.split(":")[0] for both in said for line in both if ": test accuracy" in line)
    assert trained == ["seed 0", "seed 1", "seed 2"]  # each seed trained by one of them
    assert all(len([line for line in one if "test accuracy" in line]) == 3 for one in said)  # each has all 3
    assert not list((tmp_path / "out").glob("*.lock"))  # the claims are gone
