"""Every ``petl-nas`` subcommand's --help, and the top-level one, ends with a runnable example."""

import argparse
import shlex

import pytest

from petl_nas.app.cli import build_parser


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv + ["--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_has_examples(capsys):
    out = _help([], capsys)
    assert "examples:" in out
    assert "petl-nas quickstart" in out and "petl-nas doctor" in out


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_subcommand_help_has_an_example_that_parses(name, capsys):
    out = _help([name], capsys)
    assert "example" in out.lower()
    examples = [line.strip() for line in out.split("example")[-1].splitlines() if line.strip().startswith("petl-nas ")]
    assert examples, f"{name} --help shows no `petl-nas {name} ...` line"
    for line in examples:
        argv = shlex.split(line)[1:]
        assert argv[0] == name
        build_parser().parse_args(argv)  # raises SystemExit if a flag is wrong


def test_the_new_subcommands_are_there():
    names = set(_subcommands())
    assert {"quickstart", "doctor", "search", "export", "train", "dashboard", "report"} <= names


def test_presets_list_every_name_apart_from_its_description(capsys):
    """The longest name (parallel_adapter, 16 letters) once ran into its description."""
    from petl_nas.app.cli import main
    from petl_nas.core.presets import preset_names

    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == ["", "one in full, with its configuration: petl-nas presets NAME"]
    assert [line.split()[0] for line in lines[:-2]] == preset_names()
    assert all(line[len(name)] == " " for line, name in zip(lines, preset_names()))


@pytest.mark.parametrize("name", ["houlsby", "unipelt_apl", "compacter"])
def test_one_preset_shows_its_whole_description_and_the_configuration_it_builds(name, capsys, tmp_path):
    """The list cuts descriptions at 90 characters; `presets NAME` prints the whole one, the
    learning rate, and the configuration as the presets file writes it: read back, with d/N
    resolved as `preset` does, it is the preset's PetlConfig. With --model, its counts there."""
    import re
    import textwrap

    import yaml
    from conftest import tiny_config

    from petl_nas.app.cli import main
    from petl_nas.core.budget import count_parameters
    from petl_nas.core.config import PetlConfig
    from petl_nas.core.models import load_model_config
    from petl_nas.core.presets import preset, preset_doc, preset_lr

    model = tmp_path / "tiny"
    tiny_config(hidden_size=64).save_pretrained(model)
    assert main(["presets", name, "--model", str(model)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == name
    doc_end = lines.index(f"  learning rate when a study trains it: {preset_lr(name):g}")
    assert " ".join(" ".join(lines[1:doc_end]).split()) == " ".join(preset_doc(name).split())
    block = lines[lines.index("  at least 1, rounded up to a multiple of phm_n for compacter):") + 1 : -1]
    entry = yaml.safe_load(textwrap.dedent("\n".join(block)))
    for m in entry["modules"]:
        if ratio := re.fullmatch(r"d/(\d+)", str(m.get("size"))):
            m["size"] = 64 // int(ratio.group(1))
            m["size"] = (
                -(-m["size"] // m.get("phm_n", 4)) * m.get("phm_n", 4) if m["form"] == "compacter" else m["size"]
            )
    config = load_model_config(str(model))
    assert PetlConfig.from_dict(entry) == preset(name, config)
    assert lines[-1] == (
        f"  on {model}: {count_parameters(config, preset(name, config)).deployable:,} deployable "
        f"parameters ({count_parameters(config, preset(name, config)).deployable_pct:.3f}% of the "
        f"model, head excluded)"
    )


def test_an_unknown_preset_is_one_line(capsys):
    from petl_nas.app.cli import main

    assert main(["presets", "hulsby"]) == 2
    assert capsys.readouterr().err.startswith(
        "petl-nas: error: preset: unknown name 'hulsby' (did you mean 'houlsby'?)"
    )


def test_petl_nas_warnings_are_one_line_and_others_are_left_as_they_are(monkeypatch, capsys):
    import warnings

    from petl_nas.app import cli
    from petl_nas.errors import PetlWarning

    def noisy(args):
        warnings.warn("bert: the frozen pooler looks untrained", PetlWarning)
        warnings.warn("a library's own notice", FutureWarning)
        return 0

    monkeypatch.setattr(cli, "cmd_presets", noisy)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert cli.main(["presets"]) == 0
    err = capsys.readouterr().err
    assert "petl-nas: warning: bert: the frozen pooler looks untrained\n" in err
    assert "a library's own notice" not in err  # left to Python (here: pytest's recorder)
    assert warnings.showwarning.__name__ != "show"  # put back


def test_an_error_raised_while_ctrl_c_unwinds_is_reported_as_the_interrupt(monkeypatch, capsys):
    """Ctrl-C during Ray's start-up once ended as "petl-nas: error: [Errno 2] No such file or
    directory" (a clean-up failing on the way out): an error raised while an interrupt unwinds is the
    interrupt, exit 130; the same error on its own is still an error, exit 2."""
    from petl_nas.app import cli

    def cut_short(args):
        try:
            raise KeyboardInterrupt
        finally:
            raise FileNotFoundError(2, "No such file or directory")

    def broken(args):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(cli, "cmd_search", cut_short)
    assert cli.main(["search", "--experiment", "e.yaml"]) == 130
    assert capsys.readouterr().err == (
        "petl-nas: warning: stopping raised FileNotFoundError: [Errno 2] No such file "
        "or directory\npetl-nas: interrupted; the study is kept: run the same command "
        "again to go on\n"
    )
    monkeypatch.setattr(cli, "cmd_search", broken)
    assert cli.main(["search", "--experiment", "e.yaml"]) == 2
    assert capsys.readouterr().err == "petl-nas: error: [Errno 2] No such file or directory\n"


def test_a_reader_that_stops_early_ends_the_listing_quietly():
    """`petl-nas presets | head -1` once ended in "petl-nas: error: [Errno 32] Broken pipe". With the
    pipe's reader gone before the first line, nothing goes to stderr and the exit is 128 + SIGPIPE,
    as a C tool's; a reader that stays gets the whole list."""
    import os
    import subprocess
    import sys

    gone, stdout = os.pipe()
    os.close(gone)
    run = subprocess.run([sys.executable, "-m", "petl_nas.app.cli", "presets"], stdout=stdout, stderr=subprocess.PIPE)
    os.close(stdout)
    assert (run.returncode, run.stderr) == (141, b"")
    kept = subprocess.run([sys.executable, "-m", "petl_nas.app.cli", "presets"], capture_output=True)
    assert kept.returncode == 0 and kept.stderr == b"" and b"houlsby" in kept.stdout
