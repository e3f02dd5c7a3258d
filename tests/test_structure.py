"""The house rules the code's shape must keep, read from the source with ``ast`` (``make lint`` runs
this file): no runtime import circle and no file over 400 lines in ``comlrl_lightning/``,
``callbacks/`` and ``datamodules/``.

A runtime import is a module-level ``import`` / ``from ... import`` (also inside a module-level
``try`` or ``if``), except under ``if TYPE_CHECKING:``; imports inside functions run late and do not
count, nor do a package ``__init__``'s re-exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "comlrl_lightning": "comlrl_lightning",
    "callbacks": "comlrl_lightning.callbacks",
    "datamodules": "comlrl_lightning.datamodules",
}
"""Source folder -> the package it is installed as (pyproject's package-dir)."""
MAX_LINES = 400


def sources() -> dict[str, Path]:
    """Dotted module name -> file, for every checked file."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _runtime_imports(node.body)
            yield from _runtime_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _runtime_imports(block)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the checked modules it imports at runtime (package ``__init__`` files import nothing here)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        if path.name == "__init__.py":
            continue
        package = name.rsplit(".", 1)[0]
        for node in _runtime_imports(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + [base]
                    ).strip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_runtime_import_circle():
    found = cycles(import_graph(sources()))
    assert not found, f"runtime import circles (break one edge, or import under TYPE_CHECKING): {found}"


def test_no_file_over_400_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in sources().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_the_checker_finds_a_circle_and_ignores_type_checking_imports(tmp_path):
    a, b, c = (tmp_path / f"{m}.py" for m in "abc")
    a.write_text("from comlrl_lightning.b import x\n")
    b.write_text("import comlrl_lightning.a\n")
    c.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from comlrl_lightning.a import y\n"
        "def f():\n    from comlrl_lightning.a import z\n"
    )
    graph = import_graph({"comlrl_lightning.a": a, "comlrl_lightning.b": b, "comlrl_lightning.c": c})
    assert graph["comlrl_lightning.c"] == set()
    assert cycles(graph) == [["comlrl_lightning.a", "comlrl_lightning.b"]]
