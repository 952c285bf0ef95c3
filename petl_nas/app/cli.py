"""petl-nas: search the design space of parameter-efficient fine-tuning under a parameter budget.

The ``petl-nas`` command line: ``quickstart``, ``search``, ``dashboard``, ``report``, ``export``, ``train``,
``predict``, ``convert``, ``space``, ``count``, ``presets``, ``doctor``.

Errors print one line, ``petl-nas: error: ...``, and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import statistics
import sys
import warnings
from pathlib import Path

from .. import __version__
from ..console import clear_status
from ..core.config import PetlConfig
from ..deploy.texts import ECHO_CHARS, MAX_TEXT_BYTES
from ..errors import ConfigError, PetlWarning, error_line, read_text, read_yaml
from ..search.interrupts import StoppedBeforeWriting, caused_by_interrupt, exit_status, one_line
from ..study.experiment import Experiment, Fidelity, OneShot
from ..study.header import StudyHeader
from ..study.storage_url import STUDY_FILE, as_url, existing_url
from ..training.compiling import COMPILE_MODES
from .doctor import DEFAULT_STORAGE

EXAMPLES = {
    "search": "petl-nas search --experiment experiments/examples/smoke.yaml --storage runs/smoke/\n"
    "  petl-nas search --experiment experiments/sst2_minilm/v1/experiment.yaml --budget 0.5% --trials 24",
    "space": "petl-nas space show unified --model all-MiniLM-L6-v2\n  petl-nas space validate my_space.yaml",
    "export": "petl-nas export --storage runs/smoke/ -o best.yaml\n"
    "  petl-nas export --storage runs/sst2_minilm/study.db --budget 0.3% "
    "--pick smallest-within=0.5 -o best.yaml --format peft\n"
    "  petl-nas export --storage runs/smoke/ --list\n"
    "  petl-nas export --storage sqlite:///runs/smoke/study.db --preset lora -o lora.yaml",
    "train": "petl-nas train --config best.yaml --seeds 3 -o runs/best",
    "predict": "petl-nas predict --run runs/best/seed_0 --input sentences.txt\n"
    "  petl-nas predict --run runs/best/seed_0 --text 'a gripping film' --text 'dull and long'\n"
    "  cat sentences.txt | petl-nas predict --run runs/best/seed_0",
    "convert": "petl-nas convert --run runs/best/seed_0 -o runs/best/model\n"
    "  petl-nas convert --run runs/best/seed_0 --to peft -o runs/best/peft\n"
    "  petl-nas convert --run runs/best/seed_0 --to merged -o runs/best/merged",
    "count": "petl-nas count --model all-MiniLM-L6-v2 --preset mam\n"
    "  petl-nas count --model ./my-bert --config best.yaml --json",
    "presets": "petl-nas presets --model all-MiniLM-L6-v2\n  petl-nas presets houlsby",
    "dashboard": "petl-nas dashboard --storage runs/smoke/\n"
    "  petl-nas dashboard --storage postgresql+psycopg2://user:pw@host/db --port 8081\n"
    "  ssh -L 8081:127.0.0.1:8081 gpu-box    # on your laptop, for a dashboard on gpu-box: open http://127.0.0.1:8081/",
    "suite": "petl-nas suite --experiment suites/budgets.yaml\n"
    "  petl-nas suite --experiment suites/budgets.yaml --jobs 9 --executor local\n"
    "  petl-nas suite --experiment suites/budgets.yaml --table-only",
    "report": "petl-nas report --storage runs/smoke/ -o runs/smoke/report\n"
    "  petl-nas report --storage runs/sst2_minilm/study.db --study sst2_minilm -o report/",
    "quickstart": "petl-nas quickstart\n"
    "  petl-nas quickstart --data-dir ~/glue_data --trials 12\n"
    "  petl-nas quickstart --demo --trials 4 --k 200 --epochs 1",
    "doctor": "petl-nas doctor\n"
    "  petl-nas doctor --storage postgresql+psycopg2://petl:petl@127.0.0.1:5432/petl_nas --start-ray",
}
STORAGE_FORMS = "a run folder (runs/NAME/), a SQLite file (runs/NAME/study.db) or an SQLAlchemy URL"
TOP_EXAMPLES = """examples:
  petl-nas quickstart                                   a real, small search (MiniLM, SST-2 or a demo task)
  petl-nas search --experiment experiments/examples/smoke.yaml   a search from an experiment file
  petl-nas export --storage runs/smoke/ -o best.yaml
  petl-nas train --config best.yaml -o runs/best
  petl-nas doctor                                       what this environment has and lacks

Each command's --help has its own examples; the user guide is docs/guide.md (an index of reference pages)."""


def _number_or_auto(what: str):
    """An argparse type: a number of ``what``, or ``auto`` (``--epochs``, ``--gpus-per-trial``)."""

    def parse(text: str):
        if text == "auto":
            return text
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of {what} or auto, got {text!r}") from None

    return parse


def _at_least_one(what: str):
    """An argparse type: a whole number of at least 1 (``--jobs``)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{what}: expected a whole number of at least 1, got {text!r}")
        return n

    return parse


def _config_from_args(args, model_config) -> tuple[str, PetlConfig]:
    from ..core.presets import preset

    if bool(args.preset) == bool(args.config):
        raise ConfigError("give exactly one of --preset NAME or --config FILE")
    if args.preset:
        return args.preset, preset(args.preset, model_config)
    return args.config, _read_petl_config(args.config)


def _read_petl_config(path: str) -> PetlConfig:
    """A PetlConfig file, or the configuration inside an export record (``export -o``) or a trained
    model's ``petl_config.json`` (the file or its folder)."""
    from ..core.inject import CONFIG_FILE

    file = Path(path) / CONFIG_FILE if Path(path).is_dir() else Path(path)
    data = read_yaml(read_text(file), file)
    if isinstance(data, dict) and isinstance(data.get("petl_config"), dict):
        try:
            return PetlConfig.from_dict(data["petl_config"])
        except ConfigError as e:
            raise ConfigError(f"{file}: petl_config: {e}") from None
    return PetlConfig.from_yaml(file)


def cmd_count(args) -> int:
    from ..core.budget import count_parameters
    from ..core.models import load_model_config

    model_config = load_model_config(args.model, args.num_labels)
    label, config = _config_from_args(args, model_config)
    count = count_parameters(model_config, config)
    if args.json:
        print(
            json.dumps(
                {
                    "config": label,
                    "model": args.model,
                    "trainable": count.trainable,
                    "deployable": count.deployable,
                    "backbone": count.backbone,
                    "head": count.head,
                    "rows": [r.__dict__ for r in count.rows],
                },
                indent=2,
            )
        )
    else:
        print(
            f"{label} on {args.model} ({model_config.model_type}, d={model_config.hidden_size}, "
            f"{model_config.num_hidden_layers} layers)"
        )
        print(count.table())
    return 0


def cmd_presets(args) -> int:
    from ..core.presets import preset, preset_doc, preset_entry, preset_names

    if args.name:
        preset_entry(args.name)  # an unknown name is said before any model is read
    model_config = None
    if args.model:
        from ..core.budget import count_parameters, refusal
        from ..core.models import load_model_config

        model_config = load_model_config(args.model)
    if args.name:
        return _one_preset(args.name, model_config, args.model)
    width = max(map(len, preset_names())) + 2
    if model_config is not None:  # what the two numbers are: the counts of the budget
        print(
            f"{'preset':<{width}}{'deployable':>12}  {'% model':>7}  description (counts on {args.model}, "
            f"head excluded)"
        )
    for name in preset_names():
        line = f"{name:<{width}}"
        if model_config is not None:
            if (why := refusal(model_config, preset(name, model_config))) is not None:
                print(f"{line}{'-':>12}  {'':7}  not for this backbone: {why}")
                continue
            c = count_parameters(model_config, preset(name, model_config))
            line += f"{c.deployable:>12,}  {c.deployable_pct:6.3f}%  "
        doc = " ".join(preset_doc(name).split())
        print(line + (doc if len(doc) <= 90 else doc[:87] + "..."))
    print("\none in full, with its configuration: petl-nas presets NAME")
    return 0


def _one_preset(name: str, model_config, model: str | None) -> int:
    """A preset's whole description, learning rate and configuration (and its counts on ``model``)."""
    import textwrap

    import yaml

    from ..core.budget import count_parameters, refusal
    from ..core.presets import preset, preset_doc, preset_entry, preset_lr

    entry = preset_entry(name)
    print(name)
    print(textwrap.fill(" ".join(preset_doc(name).split()), width=100, initial_indent="  ", subsequent_indent="  "))
    print(f"  learning rate when a study trains it: {preset_lr(name):g}")
    print(
        "  configuration (search_space/presets.yaml; size d/N is the backbone's hidden size // N,\n"
        "  at least 1, rounded up to a multiple of phm_n for compacter):"
    )
    print(textwrap.indent(yaml.safe_dump(entry, sort_keys=False, allow_unicode=True).rstrip(), "    "))
    if model_config is not None:
        config = preset(name, model_config)
        if (why := refusal(model_config, config)) is not None:
            print(f"  on {model}: not for this backbone: {why}")
        else:
            c = count_parameters(model_config, config)
            print(
                f"  on {model}: {c.deployable:,} deployable parameters ({c.deployable_pct:.3f}% of the model, "
                f"head excluded)"
            )
    return 0


def cmd_search(args) -> int:
    from ..search.interrupts import before_writing, stops_on_signals

    with before_writing():  # a stop while the search loads (torch, its inputs) wrote nothing
        from ..search.driver import run_search
        from ..study.experiment import Experiment
        from ..study.storage import redact

        exp = Experiment.load(args.experiment) if args.experiment else Experiment()
        exp = exp.override(
            name=args.name,
            backbone=args.model,
            task=args.task,
            data_dir=args.data_dir,
            budget=args.budget,
            space=args.space,
            trials=args.trials,
            sampler=args.sampler,
            executor=args.executor,
            ray_address=args.ray_address,
            storage=args.storage,
            study=args.study,
            seed=args.seed,
            cpus_per_trial=args.cpus_per_trial,
            gpus_per_trial=args.gpus_per_trial,
            scheduler=args.scheduler,
            presets=(
                args.presets.split(",") if args.presets and args.presets not in ("auto", "none") else args.presets
            ),
            fidelity_k=args.k,
            fidelity_epochs=args.epochs,
            warm_start=args.warm_start,
            objectives=args.objectives.split(",") if args.objectives is not None else None,
            strategy=args.strategy,
            oneshot_runs=args.oneshot_runs,
        )
    with stops_on_signals():  # Ctrl-C and SIGTERM: running trials failed and queued again
        summary = run_search(exp, force_new_study=args.force_new_study)
    print(summary.table())
    print(f"\nbrowse:  petl-nas dashboard --storage {redact(exp.storage_url)}")
    if not summary.counts.get("complete") and summary.counts.get("failed"):
        print(
            f"petl-nas: error: every trial of the study failed ({summary.counts['failed']}); their reasons are "
            f"above and in {exp.run_dir / 'trials'}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_suite(args) -> int:
    from ..search.interrupts import before_writing, stops_on_signals

    with before_writing():
        from ..suite.config import Suite
        from ..suite.runner import run_suite

        suite = Suite.load(args.experiment)
        if args.executor:
            suite = suite.with_executor(args.executor)
    with stops_on_signals():  # a stopped study is kept: the same command goes on from it
        run_suite(suite, train=not args.table_only, jobs=args.jobs)
    print((suite.run_dir / "suite.md").read_text(encoding="utf-8"))
    print(f"table: {suite.run_dir / 'suite.md'} (and suite.json, suite.png beside it)")
    return 0


def cmd_export(args) -> int:
    from ..deploy.export import front_table, write_record
    from ..study.records import load_study

    _check_export_flags(args)
    url = existing_url(args.storage)
    study = load_study(url, args.study)
    if args.list:
        print(front_table(study))
        return 0
    if not args.output:
        raise ConfigError("give -o FILE (or --list to print the front)")
    rec, budget = _export_record(args, study, url)
    p = rec.provenance
    p["pick"] = f"preset {args.preset}" if args.preset else args.pick  # how it was chosen
    if budget is not None and not args.preset:
        p["pick_budget"] = budget
    what = _exported_what(args, rec)
    if args.format != "petl-nas":
        _write_other_format(args, study, rec, what)
    else:
        write_record(rec, args.output)
    print(f"{what} ({_export_scores(args, p)}{rec.counts['deployable']:,} deployable parameters) -> {args.output}")
    scored = StudyHeader.of(study).fidelity.get("epochs")
    if (
        args.recipe == "final"
        and args.format == "petl-nas"
        and isinstance(scored, (int, float))  # a PEFT or
        and scored != rec.recipe["epochs"]
    ):  # adapters file has no recipe
        trains = rec.recipe["epochs"]
        print(
            f"note: the record trains {trains:g} epoch{'s' * (trains != 1)}, the search scored {scored:g}; "
            f"--recipe search trains at the length its ranking was measured"
        )
    return 0


def _check_export_flags(args) -> None:
    """Refuse flags that contradict each other, one line naming them."""
    choosing = [
        flag
        for flag, given in (
            ("-o", args.output),
            ("--pick", args.pick != "best"),
            ("--preset", args.preset),
            ("--budget", args.budget),
            ("--no-retime", args.no_retime),
            ("--recipe", args.recipe != "final"),
            ("--format", args.format != "petl-nas"),
        )
        if given
    ]
    if args.list and choosing:
        raise ConfigError(
            f"--list prints the whole front and writes nothing; give {', '.join(choosing)} without "
            f"--list (what an export writes)"
        )
    if args.preset and args.pick != "best":
        raise ConfigError("give --pick or --preset, not both (--preset exports that preset, whatever the front holds)")
    if args.preset and args.budget:
        raise ConfigError("give --budget or --preset, not both (--preset exports that preset, whatever its size)")
    if args.no_retime and not args.pick.startswith("fastest"):
        raise ConfigError("--no-retime is for --pick fastest-within=X (the other picks time nothing)")


def _export_record(args, study, url: str):
    """(the record to write, the budget it was chosen under): the preset asked for, or the pick."""
    from ..deploy.export import choose, preset_record, record
    from ..study.experiment import parse_budget

    if args.preset:
        rec = preset_record(study, args.preset, url, args.recipe)
        budget = StudyHeader.of(study).budget
        if budget is not None and rec.counts["deployable"] > budget:
            print(
                f"note: preset {args.preset} takes {rec.counts['deployable']:,} deployable parameters, over the "
                f"study's budget of {budget:,} (exported as asked, as a baseline)"
            )
        return rec, budget
    budget = parse_budget(args.budget, StudyHeader.of(study).backbone_params) if args.budget else None
    retimed: dict[int, float] = {}
    again = _retimer(study, retimed) if args.pick.startswith("fastest") and not args.no_retime else None
    rec = record(study, choose(study, budget, args.pick, retime=again), url, args.recipe)
    if retimed:
        rec.provenance["costs"] = {
            **rec.provenance.get("costs", {}),
            "latency_ms_retimed": retimed[rec.provenance["trial"]],
        }
    return rec, budget


def _exported_what(args, rec) -> str:
    """What was exported, in words: the trial (and its preset), or the preset asked for and its rate."""
    p = rec.provenance
    trial = f"trial {p['trial']}"
    if not args.preset:
        return trial + (f", preset {p['preset']}" if p.get("preset") else "")
    rates = (
        "at the rates the study measured for its families, lr "
        if p.get("rates") == "measured"
        else "at its paper learning rate "
    )
    return (
        f"preset {args.preset} {rates}{rec.recipe['lr']:g} (the study did not train it)"
        if p["trial"] is None
        else f"preset {args.preset} as the study trained it ({trial}, lr {rec.recipe['lr']:g})"
    )


def _write_other_format(args, study, rec, what: str) -> None:
    """The record's configuration as a PEFT or AdapterHub config file; where that library cannot
    express it, one line naming why and the nearest front member that it can."""
    from ..core.config import PetlConfig
    from ..deploy.export import make_parent, nearest_that_exports
    from ..deploy.interop import NotExpressible, to_adapters, to_peft
    from ..fileio import atomic_write

    model_config, task_kind = _backbone_of(study)

    def converted_of(config):
        return (
            to_adapters(config, model_config.hidden_size, model_config.num_hidden_layers, task_kind)
            if args.format == "adapters"
            else to_peft(config, model_config, task_kind)
        )

    def exports(config_dict) -> bool:
        try:
            return bool(converted_of(PetlConfig.from_dict(config_dict)))
        except (NotExpressible, ConfigError):
            return False

    try:
        converted = converted_of(rec.config())
    except NotExpressible as e:
        nearest = nearest_that_exports(study, rec.counts["deployable"], exports)
        raise ConfigError(
            f"{what}: {e}; " + (f"the nearest front member that does: {nearest}" if nearest else "no front member does")
        ) from None
    make_parent(Path(args.output))
    atomic_write(Path(args.output), lambda p: Path(p).write_text(json.dumps(converted, indent=2), encoding="utf-8"))


def _export_scores(args, p: dict) -> str:
    """The exported trial's scores, as the export line says them: search dev (or its confirmation's
    mean), test where re-evaluated, and the latency that decided a fastest pick."""
    from ..deploy.export import LATENCY_TIE
    from ..tasks.significance import mean_std

    at = " at the final recipe" if args.recipe == "search" else ""  # the final re-evaluation measured it
    test = (
        f", test {mean_std(p['test_mean'], p['test_std'], p.get('test_n'))}{at}"
        if p.get("test_mean") is not None
        else ""
    )
    search = f"{p['metric']} {p['search_score']:.4f} on search dev{test}; " if p.get("search_score") is not None else ""
    if p.get("confirmed_scores"):  # what decided: the mean over its seeds, not its first score
        s = p["confirmed_scores"]
        search = (
            f"{p['metric']} {statistics.fmean(s):.4f} on search dev, the mean over {len(s)} seeds "
            f"(final.confirm; its trial scored {s[0]:.4f}){test}; "
        )
    decided = "latency_ms_retimed" if "latency_ms_retimed" in p.get("costs", {}) else "latency_ms"
    if args.pick.startswith("fastest") and not args.preset and decided in p.get("costs", {}):
        search += (
            f"latency {p['costs'][decided]:.2f} ms deployed{' (timed here)' if 'retimed' in decided else ''}, "
            f"the best score of those within {LATENCY_TIE:.0%} of the fastest; "
        )
    return search


def _retimer(study, retimed: dict):
    """`export.choose`'s ``retime``: times the candidates again here (`petl_nas.deploy.retime`), says what it
    measured, and keeps it in ``retimed``."""
    from ..deploy.retime import MAX_CANDIDATES, ROUNDS, retime

    def again(trials):
        retimed.update(retime(study, trials))
        left = len(trials) - len(retimed)
        print(
            f"timed again here, side by side ({ROUNDS} interleaved rounds): "
            + ", ".join(f"trial {n} {ms:.2f} ms" for n, ms in sorted(retimed.items(), key=lambda i: i[1]))
            + (
                f" ({left} more within the margin, timed slowest by the study, left out: at most {MAX_CANDIDATES} "
                f"are timed, as many as copies of the backbone fit in memory)"
                if left
                else ""
            )
        )
        return retimed

    return again


def _backbone_of(study):
    """(transformers config of the study's backbone, task kind), for the AdapterHub/PEFT vocabularies."""
    from ..tasks import resolve_task
    from ..training.loading import model_config_for

    header = StudyHeader.of(study)
    task = resolve_task(header.task_ref)
    return model_config_for(header.backbone_spec, task), task.kind


def cmd_train(args) -> int:
    from ..deploy.export import read_record
    from ..deploy.runs import train_record
    from ..tasks.significance import mean_std

    rec = read_record(args.config)
    summary = train_record(
        rec,
        seeds=args.seeds,
        out=args.output,
        progress=not args.no_progress,
        compile=args.compile,
        cuda_graphs=args.cuda_graphs,
        overwrite=args.overwrite,
    )
    n = len(summary["runs"])
    others = ", ".join(f"{name} {value:.4f}" for name, value in summary["metrics"].items() if name != summary["metric"])
    rows = (
        f" on the first {summary['test_rows']:,} of {summary['test_rows_of']:,} test rows (recipe.eval_rows)"
        if summary["test_rows"] < summary["test_rows_of"]
        else ""
    )
    print(
        f"test {summary['metric']}: {mean_std(summary['mean'], summary['std'], n)}"
        f"{f' over {n} seeds' if n != 1 else ''}{f' ({others})' if others else ''}{rows}; "
        f"PETL weights and metrics.json in {args.output}"
    )
    return 0


def cmd_predict(args) -> int:
    from ..deploy.runs import check_input, load, predict, read_texts
    from ..deploy.texts import echo, given_texts, rows_of
    from ..tasks import recorded_task

    if args.max_text_bytes < 1:
        raise ConfigError(f"--max-text-bytes: expected a whole number >= 1, got {args.max_text_bytes}")
    run = _trained_run(args)
    given, where = _given_texts(args)  # before the model loads
    if given is None:
        check_input(args.input, args.max_text_bytes)
    else:
        given = given_texts(given, where, args.max_text_bytes)
        if not given:
            raise ConfigError(
                "no texts to label: " + ("every --text is blank" if args.text else "standard input is empty")
            )
    backbone = json.loads(args.backbone) if args.backbone and args.backbone.startswith("{") else args.backbone
    model = load(backbone, run)
    task = recorded_task(model.petl.info["task"], model.petl.info.get("labels"))
    rows = (
        read_texts(args.input, task.text_columns, args.max_text_bytes)
        if given is None
        else rows_of(given, task.text_columns, where)
    )
    for row, pred in zip(rows, predict(model, rows)):
        shown = [echo(text) for text in row]  # a long text is shown by its start
        print(json.dumps({"text": shown if len(row) > 1 else shown[0], **pred}, ensure_ascii=False))
    return 0


def _given_texts(args):
    """(texts, where) from ``--text`` or standard input (``--input -``, or neither flag with a stdin
    that is not a terminal); (None, None) for an ``--input`` file."""
    if args.text and args.input:
        raise ConfigError("give --input FILE or --text TEXT, not both")
    if args.text:
        return args.text, lambda i: f"--text {i + 1}"
    if args.input not in (None, "-"):
        return None, None
    if args.input is None and sys.stdin.isatty():
        raise ConfigError("give --input FILE, --text TEXT, or texts on standard input (one per line)")
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"standard input: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") from None
    return text.splitlines(), lambda i: f"standard input, line {i + 1}"


def cmd_convert(args) -> int:
    from ..deploy.convert import convert

    backbone = json.loads(args.backbone) if args.backbone and args.backbone.startswith("{") else args.backbone
    done = convert(_trained_run(args), args.output, args.to, backbone=backbone, base_name=args.base_name)
    to, peft_type = done["to"], done.get("peft_config", {}).get("peft_type")
    what = (
        f"a PeftMixedModel's adapters ({', '.join(done['mixed'])}: {done['updates']} weights adapted"
        + (f", the head apart in head.safetensors, read after {done['pooling']} pooling)" if "head" in done else ")")
        if "mixed" in done
        else f"a PEFT prompt-tuning adapter ({done['peft_config']['num_virtual_tokens']} virtual tokens)"
        if peft_type == "PROMPT_TUNING"
        else f"a PEFT {peft_type} adapter ({done['updates']} weights adapted"
        + (f", the head apart in head.safetensors, read after {done['pooling']} pooling)" if "head" in done else ")")
        if to == "peft"
        else f"a sentence-transformers folder ({done['pooling']} pooling, the head as a Dense layer, {done['updates']} "
        f"updates merged)"
        if to == "sentence-transformers"
        else f"a merged transformers model ({done['updates']} updates folded into the weights)"
        if to == "merged"
        else f"a transformers folder with {done['code']} ({done['modules']} modules, {done['pooling']} pooling; "
        f"trust_remote_code=True runs that file)"
    )
    answer = " and its greedy answer to the probe" if done["answer_checked"] else ""
    print(
        f"wrote {what} and the tokenizer to {done['out']}; checked: its outputs equal the trained model's on a "
        f"probe batch (max |difference| {done['max_abs_diff']:.1e}){answer}"
    )
    if "why" in done:
        print(f"chose {to}: {done['why']}")
    print("load it with:\n  " + done["load_with"].replace("\n", "\n  "))
    if to == "peft":
        named = done["base_name"]
        print(
            "adapter_config.json names no base model (the backbone was built in memory)"
            if named is None
            else f"adapter_config.json names its base by a path on this machine, {named}; --base-name NAME writes the "
            f"name to load it by elsewhere"
            if Path(named).is_absolute()
            else f"adapter_config.json names its base {named!r}"
        )
    return 0


def cmd_quickstart(args) -> int:
    from .quickstart import run

    return run(
        data_dir=args.data_dir,
        demo=args.demo,
        name=args.name,
        trials=args.trials,
        k=args.k,
        epochs=args.epochs,
        final_seeds=args.final_seeds,
        storage=args.storage,
        executor=args.executor,
    )


def cmd_doctor(args) -> int:
    from .doctor import run

    return run(storage=as_url(args.storage), start_ray=args.start_ray, data_dir=args.data_dir)


def cmd_dashboard(args) -> int:
    from ..dashboards.launcher import serve

    try:
        serve(
            existing_url(args.storage),
            host=args.host,
            port=args.port,
            allow_writes=args.allow_writes,
            allowed_hosts=args.allowed_host or (),
        )
    except KeyboardInterrupt:  # Ctrl-C before the server was up: stop quietly too
        pass
    return 0


def cmd_report(args) -> int:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            "petl-nas report draws with matplotlib, which is not installed: pip install 'petl-nas[dashboard]'"
        )
    from ..dashboards.report import write_report

    written = write_report(existing_url(args.storage), args.study, args.output)
    print(f"wrote {written[-1]} and {', '.join(p.name for p in written[:-1])}")
    return 0


def cmd_space(args) -> int:
    from ..study.space import SearchSpace

    space = SearchSpace.load(args.file)
    if args.action == "validate":
        print(
            f"{space.source}: ok (space {space.name}, version {space.version}, "
            f"{len([d for d in space.dimensions() if d.kind != 'fixed'])} searched dimensions)"
        )
    else:
        model_config = None
        if args.model:
            from ..core.models import load_model_config

            model_config = load_model_config(args.model)
        print(space.describe(model_config.num_hidden_layers if model_config is not None else None))
        if model_config is not None:
            from ..search.study import unit_costs

            print(f"\nwhat one unit of each size costs on {args.model} (deployable parameters):")
            print("\n".join(unit_costs(space, model_config)))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, as every other error of the command is
    (its subcommands' parsers are of this class too)."""

    def error(self, message: str):
        command = self.prog.removeprefix("petl-nas").strip()
        sys.stderr.write(f"petl-nas: error: {command + ': ' if command else ''}{message} (see {self.prog} --help)\n")
        sys.exit(2)


def _command(sub, name: str, help: str) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with its example (and whose usage errors name it)."""
    parser = sub.add_parser(
        name, help=help, epilog="example:\n  " + EXAMPLES[name], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.set_defaults(command_parser=parser)
    return parser


def _default(cls, name: str) -> str:
    """The default of field ``name`` of the dataclass ``cls`` as ``--help`` shows it (``%`` escaped)."""
    value = getattr(cls, name)
    text = (
        ",".join(map(str, value))
        if isinstance(value, (tuple, list))
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )
    return text.replace("%", "%%")


def _search_command(sub) -> None:
    p = _command(sub, "search", "search the design space under a parameter budget")
    _what_to_search(p)
    _how_to_run(p)
    p.set_defaults(func=cmd_search)


def _with_default(name: str, cls=Experiment) -> str:
    """``(default X)``: an option's default as the experiment's fields keep it."""
    return f"(default {_default(cls, name)})"


def _what_to_search(p) -> None:
    """The search's options that say what is searched: backbone, task, budget, space, trials."""
    default = _with_default
    p.add_argument("--experiment", help="an experiment YAML (flags override it)")
    p.add_argument("--name", help=f"experiment name: the study's name and the runs/NAME folder {default('name')}")
    p.add_argument("--model", help=f"backbone: local directory or hub name {default('backbone')}")
    p.add_argument(
        "--task",
        help="a GLUE task (sst2, cola, ...), xsum, wmt16_en_ro, or a built-in demo: "
        "demo_sentiment, demo_keyword, demo_copy or demo_reverse "
        "(a task over your own files is written in the experiment file: task: {train: ...}) " + default("task"),
    )
    p.add_argument(
        "--data-dir",
        help="the folder of a built-in task's files: GLUE (<dir>/<TASK>/{train,dev}.tsv), "
        "XSum or WMT16 en-ro (docs/generation.md)",
    )
    p.add_argument(
        "--budget",
        help=f"deployable parameters: a share of the backbone such as 0.5%%, or a count like "
        f"120000 {default('budget')}",
    )
    p.add_argument(
        "--space",
        help="a space file or a name from search_space/: unified, unified_short "
        "(shorter trials, for CPUs: the quickstart's), small, mam, unipelt, seq2seq " + default("space"),
    )
    p.add_argument("--trials", type=int, help=f"trained trials the study should hold {default('trials')}")
    p.add_argument("--sampler", help=f"tpe, nsga2, random, gp or presets {default('sampler')}")
    p.add_argument(
        "--strategy",
        choices=["sampler", "oneshot", "both"],
        help="sampler; oneshot: a supernet's proposals; both: those, then the sampler's " + default("strategy"),
    )
    p.add_argument(
        "--oneshot-runs",
        type=int,
        metavar="N",
        help="supernet runs; above 1, Optuna searches the supernet's knobs across them (oneshot.search) "
        + default("runs", OneShot),
    )
    p.add_argument(
        "--presets", help=f"auto (every preset that fits), none, or a comma-separated list {default('presets')}"
    )


def _how_to_run(p) -> None:
    """The search's options that say how it runs: executor, resources, storage, objectives, length."""
    default = _with_default
    p.add_argument(
        "--executor",
        help="ray or local (no Ray: trials in this process; several local "
        f"workers can share one study, docs/cluster.md) {default('executor')}",
    )
    p.add_argument("--scheduler", help=f"asha or fifo {default('scheduler')}")
    p.add_argument("--ray-address", help="an existing Ray cluster (default: a local Ray instance)")
    p.add_argument(
        "--cpus-per-trial", type=float, help=f"CPU cores Ray reserves for each trial {default('cpus_per_trial')}"
    )
    p.add_argument(
        "--gpus-per-trial",
        type=_number_or_auto("GPUs"),
        help="a share of a GPU per trial (fractions share a card), or auto: none without GPUs, else as "
        f"many trials per GPU as the first one's memory allows {default('gpus_per_trial')}",
    )
    p.add_argument("--storage", help=f"{STORAGE_FORMS} (default runs/NAME/{STUDY_FILE})")
    p.add_argument("--study", help="study name (default: the experiment name)")
    p.add_argument(
        "--warm-start",
        metavar="URL[#STUDY]",
        help="enqueue an earlier study's front first (another task or backbone), re-counted and filtered",
    )
    p.add_argument(
        "--objectives",
        help="score,params, then any of step_time, memory, latency "
        f"(measured costs, minimised too) {default('objectives')}",
    )
    p.add_argument(
        "--force-new-study",
        action="store_true",
        help="replace a study made with another space or other scoring settings (task, budget, K, ...)",
    )
    p.add_argument(
        "--k", type=int, help=f"training examples per trial (low-resource protocol) {default('k', Fidelity)}"
    )
    p.add_argument(
        "--epochs",
        type=_number_or_auto("epochs"),
        help="epochs per search trial, or auto (calibrated before the search) " + default("epochs", Fidelity),
    )
    p.add_argument("--seed", type=int, help=f"the seed of the sampler and of each trial's training {default('seed')}")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="print the details too (every rate tried, why scales are rates); the report has them all",
    )


def _suite_command(sub) -> None:
    p = _command(
        sub,
        "suite",
        "run one protocol over several tasks and budgets; table the pick against the best baseline at each budget",
    )
    p.add_argument("--experiment", required=True, help="a suite YAML: name, tasks, budgets, study (the protocol)")
    p.add_argument(
        "--table-only", action="store_true", help="train nothing: write the table from the studies as they are"
    )
    p.add_argument(
        "--jobs",
        type=_at_least_one("--jobs"),
        default=1,
        help="run up to N studies side by side, each in a process of its own (default 1: one "
        "after another); for a GPU or many cores that one study leaves idle",
    )
    p.add_argument(
        "--executor",
        choices=["ray", "local"],
        help="how every study runs its trials, in place of the suite file's: ray (Ray Tune) or "
        "local (no Ray: one after another in the study's process)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="print the details too (every rate tried, why scales are rates); the report has them all",
    )
    p.set_defaults(func=cmd_suite)


def _export_command(sub) -> None:
    p = _command(sub, "export", "choose a configuration from a study's Pareto front and write it")
    p.add_argument("--storage", required=True, help="the study: " + STORAGE_FORMS)
    p.add_argument("--study", help="study name (may be left out when the storage holds one study)")
    p.add_argument("--budget", help="only front members at or under this budget (0.3%% or a count)")
    p.add_argument(
        "--pick",
        default="best",
        help="best (default: with final.confirm, a searched configuration "
        "that beats the best baseline beyond noise, else that "
        "baseline), best-mean or smallest-within-noise (over "
        "final.confirm's paired seeds), smallest-within=X or fastest-within=X "
        "(X metric points; fastest: the deployed form's latency, "
        "the candidates timed again here side by side)",
    )
    p.add_argument(
        "--no-retime",
        action="store_true",
        help="fastest-within: rank by the latencies the trials measured, without timing the candidates again here",
    )
    p.add_argument(
        "--format",
        default="petl-nas",
        choices=["petl-nas", "adapters", "peft"],
        help="petl-nas record (default), AdapterHub ConfigUnion JSON or a PEFT config JSON",
    )
    p.add_argument("-o", "--output", help="the file to write")
    p.add_argument("--list", action="store_true", help="print the front instead")
    p.add_argument(
        "--preset",
        help="write this preset on the study's backbone, task and final recipe "
        "instead (the baseline to train beside the exported trial)",
    )
    p.add_argument(
        "--recipe",
        default="final",
        choices=["final", "search"],
        help="train with the study's final recipe (default) or with the length and data the "
        "search scored the trial at, where its ranking was measured",
    )
    p.set_defaults(func=cmd_export)


def _train_command(sub) -> None:
    p = _command(sub, "train", "train an exported configuration; save only its PETL weights")
    p.add_argument("--config", required=True, help="a record written by petl-nas export")
    p.add_argument("--seeds", type=int, help="runs with seeds 0..N-1 (default: the record's, at least 1)")
    p.add_argument(
        "-o",
        "--output",
        "--out",
        dest="output",
        default="petl_out",
        help="output folder: seed_N/ per run, and metrics.json (default %(default)s; --out is its former name)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the runs another record left in -o (without it they are kept and the "
        "command refuses; the same record's runs are always kept and resumed)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        help="torch.compile the runs in this mode (default: the record's, else off); "
        "reduce-overhead pays on a GPU for runs of thousands of steps",
    )
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on a GPU, replay each training step as a CUDA graph (default: the record's, else off)",
    )
    p.set_defaults(func=cmd_train)


def _predict_command(sub) -> None:
    p = _command(sub, "predict", "label texts with a trained PETL directory (one JSON line per text)")
    _run_argument(p)
    p.add_argument(
        "--input",
        help=".txt (one text per line) or .csv/.tsv/.jsonl with the task's columns, or - for "
        "standard input (one text per line; read too when neither --input nor --text "
        "is given and it is not a terminal)",
    )
    p.add_argument(
        "--text",
        action="append",
        metavar="TEXT",
        help="a text to label (repeat for several; a task of text pairs takes them tab-separated)",
    )
    p.add_argument("--backbone", help="override the recorded backbone (name, path)")
    p.add_argument(
        "--max-text-bytes",
        type=int,
        default=MAX_TEXT_BYTES,
        help=f"refuse a text (line or cell) longer than this many bytes (default {MAX_TEXT_BYTES:,}); "
        f"the model reads the run's max_length tokens of each, and answers show its first "
        f"{ECHO_CHARS} characters",
    )
    p.set_defaults(func=cmd_predict)


def _convert_command(sub) -> None:
    p = _command(
        sub,
        "convert",
        "write a trained directory as a HF PEFT adapter, a sentence-transformers folder, a merged transformers "
        "model or a transformers folder with its own modeling code",
    )
    _run_argument(p)
    p.add_argument(
        "--to",
        choices=["peft", "sentence-transformers", "merged", "transformers-remote-code"],
        help="peft: a PEFT adapter folder (PeftModel.from_pretrained; a head its model cannot read as "
        "trained, e.g. after mean pooling, saved beside it); sentence-transformers: a folder "
        "SentenceTransformer(path) loads, pooling and head included (mean- or cls-pooled "
        "classifiers); merged: a plain transformers model with the updates folded into its weights "
        "(AutoModelFor...from_pretrained); transformers-remote-code: a folder with modeling_petl.py "
        "(AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True) runs it) for "
        "adapters, Compacter, prefix, gates, prompts. Default: the first of these that represents the run "
        "exactly, sentence-transformers first for a pooling the stock head does not read",
    )
    p.add_argument("-o", "--output", required=True, help="a new (or empty) folder to write")
    p.add_argument("--backbone", help="override the recorded backbone (name, path)")
    p.add_argument(
        "--base-name",
        help="with --to peft: the base model's name to write in adapter_config.json "
        "(default: the backbone's hub name, or its path when the run was given a folder)",
    )
    p.set_defaults(func=cmd_convert)


def _run_argument(p) -> None:
    """``--run``: a trained run (``--model``, its former name, still read, with a line saying so)."""
    p.add_argument("--run", metavar="DIR", help="a directory written by petl-nas train (e.g. runs/best/seed_0)")
    p.add_argument("--model", dest="model_renamed", help=argparse.SUPPRESS)


def _trained_run(args) -> str:
    """The run ``--run`` (or the former ``--model``) names; one line on stderr for ``--model``."""
    if args.run and args.model_renamed:
        raise ConfigError("give --run DIR only (--model is its former name)")
    if args.model_renamed:
        print("petl-nas: warning: --model is renamed --run here (--model still works, for now)", file=sys.stderr)
        return args.model_renamed
    if not args.run:
        raise ConfigError("give --run DIR: a directory written by petl-nas train (e.g. runs/best/seed_0)")
    return args.run


def _space_command(sub) -> None:
    p = _command(sub, "space", "validate or show a search space file")
    p.add_argument("action", choices=["validate", "show"])
    p.add_argument("file", help="a space YAML or a name from search_space/")
    p.add_argument(
        "--model", help="show: this backbone's per-layer parameters, and what one unit of each size costs on it"
    )
    p.set_defaults(func=cmd_space)


def _count_command(sub) -> None:
    p = _command(sub, "count", "exact trainable and deployable parameter counts")
    p.add_argument("--model", required=True, help="local transformers directory or hub name")
    p.add_argument("--preset", help="a named preset (see `petl-nas presets`)")
    p.add_argument(
        "--config",
        help="a PetlConfig YAML or JSON file, an export record (export -o), or a "
        "trained model's folder or petl_config.json",
    )
    p.add_argument(
        "--num-labels", type=int, default=2, help="size of the task head (1 = regression; default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_count)


def _presets_command(sub) -> None:
    p = _command(sub, "presets", "list the named presets (with counts if --model is given), or show one")
    p.add_argument("name", nargs="?", help="one preset in full: description, learning rate, configuration")
    p.add_argument("--model", help="local transformers directory or hub name")
    p.set_defaults(func=cmd_presets)


def _dashboard_command(sub) -> None:
    p = _command(sub, "dashboard", "browse a study in optuna-dashboard, read-only (until Ctrl-C)")
    p.add_argument("--storage", required=True, help="the study: " + STORAGE_FORMS)
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0 picks a free one)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only). The dashboard has no "
        "authentication: from another machine, forward the port over SSH rather than listen "
        "on a public address",
    )
    p.add_argument(
        "--allow-writes",
        action="store_true",
        help="let the dashboard change the study as optuna-dashboard itself does (delete or rename "
        "studies, write notes, tell trials); by default it is read-only",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a host name that reaches this machine, accepted in requests beside localhost and IP "
        "addresses (others are refused against DNS rebinding); repeat for several",
    )
    p.set_defaults(func=cmd_dashboard)


def _report_command(sub) -> None:
    p = _command(sub, "report", "write a study's Pareto plot, hypervolume, importances and front table (HTML + PNG)")
    p.add_argument("--storage", required=True, help="the study: " + STORAGE_FORMS)
    p.add_argument("--study", help="study name (may be left out when the storage holds one study)")
    p.add_argument("-o", "--output", required=True, help="folder for report.html and the PNGs")
    p.set_defaults(func=cmd_report)


def _quickstart_command(sub) -> None:
    p = _command(
        sub,
        "quickstart",
        "a real, small search on this machine: MiniLM, SST-2 if found (else a demo task), 2-9 min on 2 CPU cores",
    )
    p.add_argument("--data-dir", help="a GLUE directory with SST-2/{train,dev}.tsv (default: look in the usual places)")
    p.add_argument("--demo", action="store_true", help="search the built-in demo task even when SST-2 is there")
    p.add_argument("--name", help="run name: runs/NAME and the study (default quickstart, or quickstart_demo)")
    p.add_argument("--trials", type=int, help="trained trials the study should hold (default 8)")
    p.add_argument("--k", type=int, help="training examples per trial (default 500)")
    p.add_argument("--epochs", type=float, help="epochs per trial (default 3)")
    p.add_argument("--final-seeds", type=int, help="seeds of the front's final re-evaluation (default 2; 0 skips it)")
    p.add_argument("--storage", help=f"{STORAGE_FORMS} (default runs/NAME/{STUDY_FILE})")
    p.add_argument("--executor", help="ray (default: local Ray) or local (no Ray)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="print the details too (every rate tried, why scales are rates); the report has them all",
    )
    p.set_defaults(func=cmd_quickstart)


def _doctor_command(sub) -> None:
    p = _command(sub, "doctor", "check this environment: versions, GPUs, Ray, storage, extras, data, hub")
    p.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        help=f"the storage to check: {STORAGE_FORMS} (default {DEFAULT_STORAGE}, the quickstart's)",
    )
    p.add_argument("--start-ray", action="store_true", help="also start a local Ray instance and run a task")
    p.add_argument("--data-dir", help="a GLUE directory to check instead of the usual places")
    p.set_defaults(func=cmd_doctor)


def build_parser() -> argparse.ArgumentParser:
    """The petl-nas command line: each subcommand's arguments are its own `_<name>_command`."""
    parser = _Parser(
        prog="petl-nas",
        description=__doc__.splitlines()[0],
        epilog=TOP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"petl-nas {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    for add in (
        _search_command,
        _suite_command,
        _export_command,
        _train_command,
        _predict_command,
        _convert_command,
        _space_command,
        _count_command,
        _presets_command,
        _dashboard_command,
        _report_command,
        _quickstart_command,
        _doctor_command,
    ):
        add(sub)
    return parser


@contextlib.contextmanager
def _own_warnings_as_lines():
    """petl-nas's own warnings (`PetlWarning`) as one ``petl-nas: warning: ...`` line each; other
    libraries' as Python shows them."""
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        clear_status()  # a heartbeat standing on the terminal would run into it
        if issubclass(category, PetlWarning):
            print(f"petl-nas: warning: {message}", file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = default


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand's parser: "see petl-nas search --help"
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if hasattr(args, "verbose"):  # search, suite, quickstart: the details, here and in the processes they start
        from ..console import set_verbose

        set_verbose(args.verbose)
    try:
        with _own_warnings_as_lines():
            return args.func(args)
    except KeyboardInterrupt as e:  # Ctrl-C: a search has failed its running trials, to be retried first
        return _interrupted(args, e)
    except Exception as e:
        if caused_by_interrupt(e):  # an error while the interrupt unwound: the interrupt, and that error
            print(f"petl-nas: warning: stopping raised {one_line(e)}", file=sys.stderr)
            return _interrupted(args, e)
        if isinstance(e, BrokenPipeError) and _stdout_closed():  # `petl-nas presets | head`: the reader has
            return 141  # what it wanted; quiet, and 128 + SIGPIPE as C tools
        if not isinstance(e, (ConfigError, OSError)):  # OSError: a path that cannot be read or written
            raise
        print(f"petl-nas: error: {error_line(e)}", file=sys.stderr)
        return 2


def _stdout_closed() -> bool:
    """Whether standard output's reader is gone (a pipe's reader has closed it); if so, what is left
    to write goes nowhere, else Python fails again flushing it on the way out."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file: captured, replaced
        return False
    if not hasattr(select, "poll"):  # Windows: no poll; the error is said as any other
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    if not any(events & select.POLLERR for _, events in poller.poll(0)):
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return True


def _interrupted(args, stop: BaseException) -> int:
    cause = stop.__cause__ if isinstance(stop, StoppedBeforeWriting) else None
    if cause is not None and not isinstance(cause, KeyboardInterrupt):  # an error while the stop unwound
        print(f"petl-nas: warning: stopping raised {one_line(cause)}", file=sys.stderr)
    if isinstance(stop, StoppedBeforeWriting):
        after = " before the study was made: nothing was written" if args.func is cmd_search else ""
    else:
        after = (
            "; the study is kept: run the same command again to go on"
            if args.func is cmd_search
            else "; the suite's studies are kept: run the same command again to go on"
            if args.func is cmd_suite
            else ""
        )
    print("petl-nas: interrupted" + after, file=sys.stderr)
    return exit_status(stop)


if __name__ == "__main__":
    sys.exit(main())
