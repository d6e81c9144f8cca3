"""Small functions: none in ``proxy/`` or ``loadtest/`` is longer than 80 lines (decorators
and docstring included), other than declarative lists."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80

DECLARATIVE = {
    "proxy/__main__.py:parser",  # the command line's flags, one add_argument each
    "proxy/metrics.py:Metrics.__init__",  # the metrics, one declaration each
}
"""Lists written out, one item per statement: longer as the list grows, not as logic does."""


def _functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method of a module."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                assert child.end_lineno is not None
                found.append((name, child.end_lineno - first + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return found


def _long_functions() -> dict[str, int]:
    long: dict[str, int] = {}
    for package in ("proxy", "loadtest"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "k8sbuild" in path.parts:
                continue
            relative = path.relative_to(ROOT).as_posix()
            for name, lines in _functions(path):
                if lines > MAX_LINES:
                    long[f"{relative}:{name}"] = lines
    return long


def test_no_function_is_longer_than_80_lines() -> None:
    long = _long_functions()
    over = {name: lines for name, lines in long.items() if name not in DECLARATIVE}
    assert over == {}


def test_the_exceptions_are_still_long() -> None:
    """An entry that no longer needs its exception is removed from the lists."""
    assert sorted((DECLARATIVE) - set(_long_functions())) == []


def test_a_long_function_is_found(tmp_path: Path) -> None:
    module = tmp_path / "long.py"
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    module.write_text(f"class C:\n    @staticmethod\n    def f() -> None:\n{body}\n")
    assert _functions(module) == [("C.f", MAX_LINES + 2)]
