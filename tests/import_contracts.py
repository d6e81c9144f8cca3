"""import-linter contract types of our own (``[tool.importlinter] contract_types``).

import-linter sees an external package only whole (``aiohttp``, never ``aiohttp.web``), so its
``forbidden`` contract cannot keep one submodule of it out of a layer. ``forbidden_submodule``
reads each module's own import statements instead: a module of ``source_modules`` that
imports ``forbidden_modules`` (or anything inside them) breaks it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class ForbiddenSubmoduleContract(Contract):
    source_modules = fields.ListField(subfield=fields.StringField())
    forbidden_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        violations: list[str] = []
        for source in self.source_modules:  # type: ignore[attr-defined]
            for module in sorted({source} | graph.find_descendants(source)):
                for line, imported in _imports(module):
                    if any(
                        imported == forbidden or imported.startswith(f"{forbidden}.")
                        for forbidden in self.forbidden_modules  # type: ignore[attr-defined]
                    ):
                        violations.append(f"{module}:{line} imports {imported}")
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for violation in check.metadata["violations"]:
            output.print_error(f"-   {violation}", bold=False)


def _imports(module: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``module``'s source; ``from a import b`` names
    both ``a`` and ``a.b`` (``b`` may be a submodule)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return []
    tree = ast.parse(Path(spec.origin).read_text(), filename=spec.origin)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found
