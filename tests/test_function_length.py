"""No function in the package runs past `LONGEST` lines (issue 89: long functions cut at their
seams), counted from its ``def`` to its last line, docstring included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "petl_nas"
LONGEST = 80


def long_functions(package: Path = PACKAGE, longest: int = LONGEST) -> dict[tuple[str, str], int]:
    """(module path, function name) -> its lines, for every function longer than ``longest``."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > longest:
                    found[(path.relative_to(package).as_posix(), node.name)] = lines
    return found


def test_no_function_is_longer_than_80_lines():
    found = long_functions()
    assert not found, f"functions over {LONGEST} lines (cut them at their seams): {found}"


def test_the_count_reads_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path) == {("m.py", "long"): LONGEST + 1}
