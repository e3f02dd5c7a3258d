"""The house rules the code's shape must keep, read from the source with ``ast`` (``make lint`` runs
this file): no import circle in ``comlrl_lightning/``, ``callbacks/``, ``datamodules/`` and
``benchmarks/``. Files are cut by concept, not by length (no line cap).

Every import counts: module-level ones, those inside functions, classes, ``try`` / ``if`` / ``with``
blocks, a package ``__init__``'s re-exports, ``__import__("x")`` / ``importlib.import_module("x")``
with a literal name, and the body of ``if TYPE_CHECKING:`` too (a circle that only type checkers see
is still two concepts that each need the other: move the shared type, or read it through a Protocol).
A module's implicit import of its parent packages is not drawn (``import a.b.c`` is an edge to
``a.b.c`` only).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "comlrl_lightning": "comlrl_lightning",
    "callbacks": "comlrl_lightning.callbacks",
    "datamodules": "comlrl_lightning.datamodules",
    "benchmarks": "",
}
"""Source folder -> the package it is installed as (pyproject's package-dir); ``""``: the scripts in
``benchmarks/<concern>/`` import each other as top-level modules (``benchmarks/lib/bench_paths.py`` puts
every folder on ``sys.path``)."""


def sources() -> dict[str, Path]:
    """Dotted module name -> file, for every checked file."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if not package:  # a benchmark script is imported by its name, whichever folder holds it
                parts = parts[-1:]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(p for p in [package, *parts] if p)] = path
    return out


def _dynamic_import(node: ast.Call) -> str | None:
    """The module named by ``__import__("x")`` or ``importlib.import_module("x")``, else None."""
    f = node.func
    named = (isinstance(f, ast.Name) and f.id in ("__import__", "import_module")) or (
        isinstance(f, ast.Attribute) and f.attr == "import_module"
    )
    if named and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom | str]:
    """Every import statement below ``node`` (any depth, ``if TYPE_CHECKING:`` included), and every
    literal dynamic import's module name."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.Call) and (name := _dynamic_import(child)):
            yield name
        yield from _imports(child)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the checked modules it imports, anywhere in its file (see the module docstring)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, str):
                targets = [node]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*kept, base]).strip(".")
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


def test_no_import_circle_counting_every_import():
    found = cycles(import_graph(sources()))
    assert not found, f"import circles (TYPE_CHECKING imports count): {found}"


def test_the_checker_finds_a_circle_and_counts_type_checking_imports(tmp_path):
    a, b, c = (tmp_path / f"{m}.py" for m in "abc")
    a.write_text("from comlrl_lightning.b import x\n")
    b.write_text("import comlrl_lightning.a\n")
    c.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from comlrl_lightning.a import y\n"
        "else:\n    import comlrl_lightning.b\n"
    )
    graph = import_graph({"comlrl_lightning.a": a, "comlrl_lightning.b": b, "comlrl_lightning.c": c})
    assert graph["comlrl_lightning.c"] == {"comlrl_lightning.a", "comlrl_lightning.b"}  # both branches
    assert cycles(graph) == [["comlrl_lightning.a", "comlrl_lightning.b"]]
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import comlrl_lightning.c\n")
    graph = import_graph({"comlrl_lightning.a": a, "comlrl_lightning.b": b, "comlrl_lightning.c": c})
    assert cycles(graph) == [["comlrl_lightning.a", "comlrl_lightning.b", "comlrl_lightning.c"]]


def test_the_checker_counts_imports_inside_functions_classes_and_dynamic_ones(tmp_path):
    """A circle closed only by a function-local import, a method's, or ``__import__("x")`` is a circle."""
    files = {
        "comlrl_lightning.a": "from comlrl_lightning import b\n",
        "comlrl_lightning.b": "def f():\n    from comlrl_lightning.a import z\n",
        "comlrl_lightning.c": "import comlrl_lightning.d\n",
        "comlrl_lightning.d": "class D:\n    def m(self):\n        if True:\n            import comlrl_lightning.c\n",
        "e": "import f\n",
        "f": 'def g():\n    return __import__("e").x\n',
        "g": 'import importlib\nimportlib.import_module("e")\n',
    }
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(text)
    graph = import_graph(paths)
    assert graph["comlrl_lightning.b"] == {"comlrl_lightning.a"} and graph["g"] == {"e"}
    assert cycles(graph) == [
        ["comlrl_lightning.a", "comlrl_lightning.b"],
        ["comlrl_lightning.c", "comlrl_lightning.d"],
        ["e", "f"],
    ]


def test_a_package_init_re_export_counts(tmp_path):
    """``pkg/__init__.py`` importing a module that imports ``pkg`` back is a circle (relative imports too)."""
    init, mod = tmp_path / "__init__.py", tmp_path / "m.py"
    init.write_text("from .m import x\n")
    mod.write_text("from comlrl_lightning.pkg import y\n")
    graph = import_graph({"comlrl_lightning.pkg": init, "comlrl_lightning.pkg.m": mod})
    assert cycles(graph) == [["comlrl_lightning.pkg", "comlrl_lightning.pkg.m"]]


FAMILIES = {
    "preference": ("comlrl_lightning.preference",),
    "coordinator": ("comlrl_lightning.coordinator",),
    "coding": ("comlrl_lightning.coding",),
}
"""The opt-in families, one subpackage each (a package prefix); everything else in ``comlrl_lightning`` is the
core (the Dec-POMDP protocol, team and agent kinds, generation, rollout, advantages, loss, the MAGRPO
family, actor-critic, callbacks)."""
FRONT_DOOR = (
    "comlrl_lightning",
    "comlrl_lightning.cli",
    "comlrl_lightning.choice_docs",
    "comlrl_lightning.datamodules",
)
"""The modules that gather every family for the user (the package's exports, the CLI's subcommands, the
generated choice lists, the DataModule registry): they may import a family; no other core module may."""


def family_of(module: str) -> str | None:
    for family, prefixes in FAMILIES.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return family
    return None


def core_to_family_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Edges from a core module of the package (not the front door) into a family."""
    return sorted(
        (a, b)
        for a, targets in graph.items()
        if a.startswith("comlrl_lightning") and family_of(a) is None and a not in FRONT_DOOR
        for b in targets
        if family_of(b) is not None
    )


def test_the_core_imports_no_family():
    found = core_to_family_imports(import_graph(sources()))
    assert not found, (
        f"core -> family imports (move the shared piece into the core, or the caller into the family): {found}"
    )


def test_the_family_rule_flags_a_core_module_that_imports_a_family():
    graph = {"comlrl_lightning.core.loss": {"comlrl_lightning.preference.dpo"},
             "comlrl_lightning.preference.dpo": {"comlrl_lightning.core.loss"},
             "comlrl_lightning.cli": {"comlrl_lightning.coordinator.cli"},
             "comlrl_lightning.coding.sandbox.api": {"comlrl_lightning.core.loss"}}  # fmt: skip
    assert core_to_family_imports(graph) == [
        ("comlrl_lightning.core.loss", "comlrl_lightning.preference.dpo")
    ]
    assert (
        family_of("comlrl_lightning.preference.comparator.config") == "preference"
        and family_of("comlrl_lightning.core") is None
    )


def test_benchmark_scripts_have_one_name_each():
    """``bench_paths`` puts every ``benchmarks/<concern>/`` on ``sys.path``: two files of one name would
    shadow each other."""
    names = [p.stem for p in (ROOT / "benchmarks").rglob("*.py")]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
