"""The package's folders are layers: each module imports only from its own layer and the layers
below it, so a newcomer can read the tree top-down (docs/architecture.md).

The imports are read from the source (every ``import`` and ``from ... import``, those inside
functions too), so a lazy import that runs upwards is caught as well as a top-level one."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "petl_nas"
# Lowest first. A module may import its own layer and any layer before it.
LAYERS = ("base", "core", "tasks", "training", "study", "search", "deploy", "dashboards", "suite", "app")
BASE = ("errors", "rules", "fileio", "places", "console")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # petl_nas itself: the public API, imports lazily
    return "base" if parts[1] in BASE else parts[1]


def imports(path: Path, modules: set[str], top_level_only: bool = False) -> set[str]:
    """The package's modules ``path`` imports (a ``from X import name`` of a submodule counts as it);
    with ``top_level_only``, those its module body imports, not its functions."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


GRAPH = graph()


def test_every_module_is_in_a_layer():
    unplaced = [m for m in GRAPH if m != "petl_nas" and layer_of(m) not in LAYERS]
    assert not unplaced, f"modules outside the layers {LAYERS}: {unplaced}"


def test_imports_only_go_down():
    upward = sorted(
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if layer_of(m) and layer_of(t) and LAYERS.index(layer_of(t)) > LAYERS.index(layer_of(m))
    )
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_cycle_between_modules():
    """Imports at module level only (a function's lazy import runs after both modules loaded)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    top = {
        module_name(p): {t for t in imports(p, modules, top_level_only=True) if not t.startswith(module_name(p) + ".")}
        for p in paths
    }  # a package importing its own submodules is no cycle
    done, cycles = set(), []

    def visit(m, path):
        for t in sorted(top[m]):
            if t in path:
                cycles.append(path[path.index(t) :] + [t])
            elif t not in done:
                visit(t, path + [t])
        done.add(m)

    for m in sorted(top):
        if m not in done:
            visit(m, [m])
    assert not cycles, f"import cycles: {cycles[:3]}"


@pytest.mark.parametrize(
    "importer, imported, why",
    [
        ("petl_nas.search.", "petl_nas.deploy.", "search-time code reads studies through study.records, not export"),
        ("petl_nas.dashboards.", "petl_nas.deploy.", "the dashboards read studies through study.records"),
        ("petl_nas.deploy.", "petl_nas.search.", "deploy reads studies through study/, without the engine"),
        ("petl_nas.dashboards.", "petl_nas.search.", "the dashboards read studies through study/, without the engine"),
        ("petl_nas.app.doctor", "petl_nas.app.quickstart", "doctor finds GLUE and the hub through places"),
    ],
)
def test_the_seams_that_ran_the_wrong_way_stay_cut(importer, imported, why):
    found = sorted(
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        if m.startswith(importer)
        for t in targets
        if t.startswith(imported)
    )
    assert not found, f"{why}: {found}"


# Trials' own attributes may be read outside study/ (the knob search's supernet runs, a cell's trial
# wall time); a study's are read through `study.header.StudyHeader` and `study.records`. Each module
# below still reads its study's attributes by name, for the reason given.
STUDY_ATTRS_READ_HERE = {
    "petl_nas.search.claims": "a claim's protocol: reads and writes the attribute it is given, fresh under the lock",
    "petl_nas.search.study": "open_study compares the stored settings whole with the new ones before writing them",
}
TRIAL_NAMES = {"t", "trial", "best"}  # what a trial is called where its attributes are read


def test_no_module_outside_the_study_reads_a_studys_attributes_by_name():
    """A study's settings have one typed reader (`StudyHeader.of`): a ``user_attrs`` read outside
    ``study/`` is a trial's (named ``t``, ``trial`` or ``best``), never a study's, by subscript,
    ``.get``, ``in`` or a whole-dict alias."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if layer_of(module) == "study" or module in STUDY_ATTRS_READ_HERE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "user_attrs":
                owner = ast.unparse(node.value)
                if owner not in TRIAL_NAMES:
                    found.append(f"{module}:{node.lineno}: {owner}.user_attrs")
    assert not found, "read the study through StudyHeader.of(study) or study.records:\n" + "\n".join(found)


def test_errors_and_file_writes_have_their_own_modules():
    """ConfigError and atomic_write come from errors and fileio, not from the genotype or injection."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(("config", "inject")):
                names = {a.name for a in node.names} & {"ConfigError", "PetlWarning", "read_yaml", "atomic_write"}
                if names:
                    wrong.append(f"{module_name(path)}: {sorted(names)} from {node.module}")
    assert not wrong, wrong


def test_the_core_imports_neither_optuna_nor_ray():
    """DESIGN.md: the design space applied to a model runs without the search's libraries."""
    heavy = sorted(
        f"{m}: {n}"
        for m in GRAPH
        if layer_of(m) in ("base", "core")
        for n in _third_party(m)
        if n.split(".")[0] in ("optuna", "ray")
    )
    assert not heavy, heavy


def _third_party(module: str) -> set[str]:
    path = PACKAGE.parent.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


def test_the_layers_are_the_folders_the_guide_names():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS[1:]), folders
    layers = defaultdict(list)
    for m in GRAPH:
        layers[layer_of(m)].append(m)
    assert all(layers[name] for name in LAYERS), {name: len(layers[name]) for name in LAYERS}
