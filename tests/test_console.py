"""`console`: aligned tables, each line said once and fit to the width, details only with
``--verbose``; a status line rewritten in place on a terminal and a line of its own in a log."""

import io
import sys

from petl_nas.console import CLEAR, WIDTH, SaidOnce, detail, fit, one_line, say, set_verbose, status, table


class Terminal(io.StringIO):
    """Standard output as a terminal sees it: what was written, control sequences included."""

    def isatty(self) -> bool:
        return True


def test_a_table_aligns_its_columns():
    assert table(["family", "score"], [["lora", "0.8"], ["mh_adapter", "0.75"]], right=(1,)) == [
        "  family      score",
        "  lora          0.8",
        "  mh_adapter   0.75",
    ]


def test_a_line_said_before_is_not_said_again():
    said = []
    printer = SaidOnce(said.append)
    printer("warning: the inputs differ")
    printer("warning: the inputs differ\nnew line")
    printer("")
    printer("")  # blank lines separate: always kept
    assert said == ["warning: the inputs differ", "new line", "", ""]
    again = SaidOnce(printer)  # wrapping it again keeps its memory
    again("new line")
    assert said[-1] == "" and again.said is printer.said


def test_the_console_wraps_a_long_line(capsys):
    say("word " * 40 + "\nshort")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(len(line) <= WIDTH for line in lines) and lines[1].startswith("  ")


def test_a_command_or_a_path_is_never_cut():
    command = "  petl-nas export --storage sqlite:///" + "x" * 130
    assert fit(command) == command
    path = "/" + "p" * 130
    assert path in fit(f"see {path} for the rest").split()  # on a line of its own, whole


def test_details_only_with_verbose(monkeypatch):
    monkeypatch.delenv("PETL_NAS_VERBOSE", raising=False)
    said = []
    detail(said.append, "every rate tried")
    set_verbose(True)
    detail(said.append, "every rate tried")
    set_verbose(False)
    detail(said.append, "every rate tried")
    assert said == ["every rate tried"]


def test_a_trial_line_cuts_the_configuration_not_the_line():
    tail = "  0.8200 ± 0.0222  65,608 params | done 4 running 1 | front 3 | ETA 5.0 min"
    name = "Compacter r=24 attn L0,1,5 + adapter r=14 ffn L0,1,5 + BitFit + prompt 4 + prefix 8 q,k,v"
    line = one_line("[4/8] trial 3 ", name, tail)
    assert len(line) == WIDTH and line.endswith(tail) and "…" in line
    short = one_line("[4/8] trial 3 ", "LoRA r=2 q,v", tail)
    assert short == "[4/8] trial 3 LoRA r=2 q,v" + tail


def test_on_a_terminal_a_status_line_is_rewritten_in_place_until_an_event_replaces_it(monkeypatch):
    monkeypatch.setattr(sys, "stdout", Terminal())
    status("  rates: lora at 5.0e-04: running for 0.5 min")
    status("  rates: lora at 5.0e-04: running for 1.0 min")
    say("rates: lora at 5.0e-04: 0.8167")
    assert sys.stdout.getvalue() == (
        CLEAR
        + "  rates: lora at 5.0e-04: running for 0.5 min"
        + CLEAR
        + "  rates: lora at 5.0e-04: running for 1.0 min"
        + CLEAR
        + "rates: lora at 5.0e-04: 0.8167\n"
    )
    say("next")  # nothing left to erase
    assert sys.stdout.getvalue().endswith("0.8167\nnext\n")


def test_in_a_log_a_status_line_is_a_line_of_its_own(capsys):
    printer = SaidOnce(say)
    printer.status("  x: running for 0.5 min")
    printer.status("  x: running for 0.5 min")  # a heartbeat is not a sentence said twice: each says a time
    say("x: done")
    assert capsys.readouterr().out == "  x: running for 0.5 min\n  x: running for 0.5 min\nx: done\n"
