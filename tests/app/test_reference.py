"""docs/experiment-file.md and the JSON Schemas beside it are what `petl_nas.app.reference` writes
from the keys' declarations; a key declared without its meaning is refused; the schemas accept
every experiment and suite file in the repository and refuse an unknown key or a wrong type."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from petl_nas.app import reference
from petl_nas.rules import option, whole

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


@pytest.mark.parametrize("name", sorted(reference.FILES))
def test_the_committed_file_is_what_the_generator_writes(name):
    committed = (DOCS / name).read_text(encoding="utf-8")
    assert committed == reference.FILES[name](), f"docs/{name} is stale: run python -m petl_nas.app.reference"


def test_a_key_without_a_meaning_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Section:
        known: int = option(1, "a key with its meaning", whole(1))
        added: int = 2

    with pytest.raises(reference.UndocumentedKey, match="Section.added: no one-line meaning"):
        reference.table(Section)


def test_a_key_without_a_schema_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Section:
        odd: int = option(1, "checked by a rule that says nothing of its schema", ((lambda v: True), "anything"))

    with pytest.raises(reference.UndocumentedKey, match="Section.odd: no JSON Schema"):
        reference.properties(Section)


def kind_of(data) -> str | None:
    if not isinstance(data, dict) or "petl_config" in data or "slots" in data:
        return None  # an exported record or a space: not ours
    return "suite" if "tasks" in data and "budgets" in data else "experiment"


FILES = sorted([*(ROOT / "experiments").rglob("*.yaml"), *(ROOT / "suites").glob("*.yaml")])


def validator(kind: str):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((DOCS / f"{kind}.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_schemas_accept_every_experiment_and_suite_file_in_the_repository():
    checked = {"experiment": 0, "suite": 0}
    for path in FILES:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        kind = kind_of(data)
        if kind is None:
            continue
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(kind).iter_errors(data)]
        assert not errors, f"{path.relative_to(ROOT)}: {errors[:3]}"
        checked[kind] += 1
    assert checked["experiment"] >= 20 and checked["suite"] >= 5, checked


@pytest.mark.parametrize(
    "kind, data",
    [
        ("experiment", {"trials": 8, "trails": 8}),
        ("experiment", {"fidelity": {"k": 500, "epoch": 3}}),
        ("experiment", {"trials": "many"}),
        ("experiment", {"fidelity": {"precision": "fp16"}}),
        ("experiment", {"final": {"baselines": "yes"}}),
        ("experiment", {"budget": "half"}),
        ("suite", {"name": "s", "tasks": ["sst2"], "budgets": ["0.5%"], "colour": "red"}),
        ("suite", {"name": "s", "tasks": ["sst2"], "budgets": ["0.5%"], "study": {"task": "cola"}}),
        ("suite", {"name": "s", "tasks": ["sst2"], "budgets": ["0.5%"], "study": {"trials": "many"}}),
        ("suite", {"name": "s", "tasks": "sst2", "budgets": ["0.5%"]}),
        ("suite", {"tasks": ["sst2"], "budgets": ["0.5%"]}),
    ],
    ids=[
        "unknown key",
        "unknown section key",
        "wrong type",
        "not allowed",
        "not a bool",
        "not a budget",
        "suite unknown key",
        "suite protocol gives the task",
        "suite protocol wrong type",
        "tasks not a list",
        "suite without a name",
    ],
)
def test_the_schemas_refuse_an_unknown_key_or_a_wrong_type(kind, data):
    assert not validator(kind).is_valid(data)


def test_the_schema_accepts_the_shorthands_and_yamls_bare_off():
    ok = validator("experiment")
    for data in (
        {"fidelity": "auto"},
        {"rates": "off"},
        {"rates": False},
        {"fidelity": {"compile": False}},
        {"objectives": ["score", "params", "latency"]},
        {"budget": 120000},
        {"budget": "1.2e5"},
    ):
        assert ok.is_valid(data), data
