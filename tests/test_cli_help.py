"""Every ``petl-nas`` subcommand's --help, and the top-level one, ends with a runnable example."""

import argparse
import shlex

import pytest

from petl_nas.cli import build_parser


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
        build_parser().parse_args(argv)           # raises SystemExit if a flag is wrong


def test_the_new_subcommands_are_there():
    names = set(_subcommands())
    assert {"quickstart", "doctor", "search", "export", "train", "dashboard", "report"} <= names


def test_presets_list_every_name_apart_from_its_description(capsys):
    """The longest name (parallel_adapter, 16 letters) once ran into its description."""
    from petl_nas.cli import main
    from petl_nas.presets import preset_names

    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == preset_names()
    assert all(line[len(name)] == " " for line, name in zip(lines, preset_names()))


def test_petl_nas_warnings_are_one_line_and_others_are_left_as_they_are(monkeypatch, capsys):
    import warnings

    from petl_nas import cli
    from petl_nas.config import PetlWarning

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
    assert "a library's own notice" not in err          # left to Python (here: pytest's recorder)
    assert warnings.showwarning.__name__ != "show"          # put back


def test_an_error_raised_while_ctrl_c_unwinds_is_reported_as_the_interrupt(monkeypatch, capsys):
    """Ctrl-C during Ray's start-up once ended as "petl-nas: error: [Errno 2] No such file or
    directory" (a clean-up failing on the way out): an error raised while an interrupt unwinds is the
    interrupt, exit 130; the same error on its own is still an error, exit 2."""
    from petl_nas import cli

    def cut_short(args):
        try:
            raise KeyboardInterrupt
        finally:
            raise FileNotFoundError(2, "No such file or directory")

    def broken(args):
        raise FileNotFoundError(2, "No such file or directory")
    monkeypatch.setattr(cli, "cmd_search", cut_short)
    assert cli.main(["search", "--experiment", "e.yaml"]) == 130
    assert capsys.readouterr().err == "petl-nas: interrupted; the study is kept: run the same command again to go on\n"
    monkeypatch.setattr(cli, "cmd_search", broken)
    assert cli.main(["search", "--experiment", "e.yaml"]) == 2
    assert capsys.readouterr().err == "petl-nas: error: [Errno 2] No such file or directory\n"
