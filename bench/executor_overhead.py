"""Per-trial time outside the training loop: the local executor against Ray, side by side.

Issue 17 asks for per-trial overhead as a row of the benchmark. A trial's own record says how long
it trained (`train_s`) and how long its worker spent on it (`wall_s`: set-up, training, scoring, the
deployed-latency measurement); what the executor adds around it (Ray's scheduling, the result's
round trip, the study's writes) shows only in the time between trials. This benchmark runs the
same search twice, one trial at a time (`concurrent: 1`, FIFO, the random sampler with one seed,
so both run the same configurations), once with ``--executor local`` and once with
``--executor ray``, and prints per layout: the search's wall time, the mean time from one trial's
end to the next's (`between`), the trials' own wall time split into set-up (model copy, and in a
fresh process the backbone's load and the tokenising), training, and what follows training
(scoring's last pieces, the GPU footprint, the deployed-latency measurement), and the difference
between `between` and a trial's own wall time: the executor's share. The default search is
`experiments/examples/smoke.yaml` (a tiny random BERT: trials of about a second, so the overhead is what is
measured), with its finals off; arguments after ``--`` go to both searches (``--model DIR
--data-dir DIR`` for a real backbone).

    python bench/executor_overhead.py [--experiment FILE] [--trials 12] [--out results.md] [-- SEARCH FLAGS]
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
from pathlib import Path

import yaml
from search_runs import run_search

ROOT = Path(__file__).resolve().parents[1]


def one_at_a_time(experiment: Path, work: Path) -> Path:
    """A copy of the experiment that trains one trial at a time, FIFO, random sampler, no finals."""
    data = yaml.safe_load(experiment.read_text())
    data.update(concurrent=1, sampler="random", scheduler="fifo", final={"seeds": 0, "baselines": False})
    out = work / experiment.name
    out.write_text(yaml.safe_dump(data))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default=str(ROOT / "experiments" / "smoke.yaml"))
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--out", help="also write the table to this markdown file")
    ap.add_argument("--executors", default="local,ray", help="which executors, in order (default local,ray)")
    ap.add_argument("search_flags", nargs="*", help="after --: more flags for both searches")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        experiment = one_at_a_time(Path(args.experiment).resolve(), work)
        for executor in args.executors.split(","):
            flags = [
                "--experiment",
                str(experiment),
                "--executor",
                executor,
                "--trials",
                str(args.trials),
                *args.search_flags,
            ]
            rows.append(run_search(executor, flags, work))
    lines = [
        f"# Per-trial time outside the training loop: local executor against Ray ({datetime.date.today()})",
        "",
        f"{Path(args.experiment).name}, one trial at a time, FIFO, random sampler, {args.trials} trials.",
        "",
        "Times per trial are means over the trials after the first (the first loads the backbone, "
        "tokenises, and on a GPU starts CUDA).",
        "",
        "| executor | trials | search wall (s) | between trial ends (s) | trial's own wall (s) "
        "| set-up: first / later trials (s) | training (s) | after training (s) | executor's share per trial (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        share = r["between_s"] - r["later_wall_s"]
        after = r["later_wall_s"] - r["later_setup_s"] - r["later_train_s"]
        lines.append(
            f"| {r['label']} | {r['trials']} | {r['wall_s']:.1f} | {r['between_s']:.2f} | "
            f"{r['later_wall_s']:.2f} | {r['first_setup_s']:.2f} / {r['later_setup_s']:.2f} | "
            f"{r['later_train_s']:.2f} | {after:.2f} | {share:+.2f} |"
        )
    if len(rows) == 2:
        same = sum(a == b for a, b in zip(rows[0]["scores"], rows[1]["scores"]))
        lines += [
            "",
            f"{rows[1]['label']} against {rows[0]['label']}: **{rows[1]['between_s'] - rows[0]['between_s']:+.2f} s "
            f"per trial** between trial ends, of which training {rows[1]['later_train_s'] - rows[0]['later_train_s']:+.2f} s, "
            f"and {rows[1]['wall_s'] - rows[0]['wall_s']:+.1f} s on the whole search. "
            f"{same} of {min(len(rows[0]['scores']), len(rows[1]['scores']))} trials scored the same in both.",
        ]
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
