"""The cooperation bonus's counterfactual: the helper's values replaced by a trusted stand-in.

Whether the entry point *needs* the helper is decided from separate fresh sandbox runs of the
same program, judged by the trusted judge from plain outputs only (nothing the candidate's
process says about itself counts):

- ``real``: the program as written;
- ``perturbed``: every value ``aux`` returns to its caller (not to itself, when it recurses) is
  replaced by :func:`perturbed` of it (same type,
  another value: ``not`` a bool, ``+1`` an int, one more character on a str, the last item of a
  list/tuple/dict perturbed, ``None`` stays ``None``), so an ``is None`` / type check or a
  truthiness gate on an int cannot tell it from the real helper;
- ``first``: every value ``aux`` returns is replaced by (a fresh copy of) the first value it
  returned in the run, so a helper whose output does not vary (a constant used as a gate) behaves
  exactly as in the real run.

All three runs load the same helper code: its own ``return E`` statements become
``return _aux_value(E)`` in each of them, and only the body of the top-level ``_aux_value``
differs (identity in the real run). Once every test passes in the real run, the helper counts
when some test fails in each stand-in run (judged from plain outputs). The entry point is a *wrapper* of the helper when every call whose
output changed under ``perturbed`` changed to :func:`perturbed` of its real output (floats within
``1e-6``: the wrapper's output is the helper's output). Limits (a main that reads the stand-in's code, or a
helper/main pair pre-arranged to check each other's exact values): ``docs/attacks.md``.
"""

from __future__ import annotations

import ast
import json
import math
import textwrap
from collections.abc import Sequence

from comlrl_lightning.tasks.coding.code_text import parse_code

_CHANGE = """
def {change}(v):
    t = type(v)
    if t is bool:
        return not v
    if t is int:
        return v + 1
    if t is float:
        return v + 1.0 + abs(v) if abs(v) < 1e300 else 0.5
    if t is str:
        return v + "0"
    if (t is list or t is tuple) and v:
        return v[:-1] + t([{change}(v[-1])])
    if t is dict and v:
        out = dict(v)
        last = list(out)[-1]
        out[last] = {change}(out[last])
        return out
    return v
"""
_GUARD = """
    f = __import__("sys")._getframe(1)
    if f.f_back is not None and f.f_back.f_code is f.f_code:
        return v  # aux called by aux: only what aux returns to its caller is replaced
"""
_PERTURBED = (
    "\ndef {name}(v):"
    + _GUARD
    + textwrap.indent(_CHANGE.format(change="change").strip("\n"), "    ")
    + "\n    return change(v)\n"
)
_FIRST = (
    "\ndef {name}(v):"
    + _GUARD
    + """    box = {name}.__dict__.setdefault("first", [])
    if not box:
        box.append(v)
    try:
        return __import__("copy").deepcopy(box[0])
    except Exception:
        return box[0]
"""
)
_IDENTITY = """
def {name}(v):
    return v
"""
BODIES = {"real": _IDENTITY, "perturbed": _PERTURBED, "first": _FIRST}
"""The stand-in kinds and the source of their ``_aux_value``."""
STAND_INS = ("perturbed", "first")
"""The kinds a needed test must fail under."""

_ns: dict = {}
exec(compile(_CHANGE.format(change="perturbed"), "<perturbed>", "exec"), _ns)  # the code the runs use
perturbed = _ns["perturbed"]
perturbed.__doc__ = "The ``perturbed`` stand-in's value for a helper output ``v`` (same type, another value)."


class _Returns(ast.NodeTransformer):
    """``return E`` -> ``return name(E)`` in one function's own scope (not in nested scopes)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:
        return node  # a nested scope: its returns are not the helper's

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def visit_Return(self, node: ast.Return) -> ast.Return:
        if node.value is not None:
            node.value = ast.Call(ast.Name(self.name, ast.Load()), [node.value], [])
        return node


def value_name(preamble: str, helper: str) -> str:
    """The name of the value function in the programs of :func:`stand_in_programs` (``_aux_value``,
    with ``_`` appended until the text does not contain it): a name the main part may not bind."""
    name, source = "_aux_value", preamble + "\n" + helper
    while name in source:
        name += "_"
    return name


def stand_in_programs(preamble: str, helper: str, aux: str = "aux") -> dict[str, str] | None:
    """The run programs (``preamble + helper``) of every kind in :data:`BODIES`, keyed by kind;
    ``None`` when the helper has no top-level ``def aux`` to rewrite (no bonus then)."""
    tree = parse_code(helper)
    if tree is None:
        return None
    target = [
        n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == aux
    ]
    if not target:
        return None
    name = value_name(preamble, helper)
    fn = target[-1]
    fn.body = [_Returns(name).visit(s) for s in fn.body]
    ast.fix_missing_locations(tree)
    helper_src = ast.unparse(tree)
    out = {}
    for kind, body in BODIES.items():
        parts = (preamble, body.format(name=name).strip("\n"), helper_src)
        out[kind] = "\n\n".join(p for p in parts if p.strip()) + "\n"
    return out


def _key(value: object) -> str:
    from comlrl_lightning.sandbox import plain

    return json.dumps(plain.encode(value), sort_keys=True)


def is_wrapper(real: Sequence[dict | None], pert: Sequence[dict | None]) -> bool:
    """Whether every call whose plain output changed between the ``real`` and the ``perturbed`` run
    changed to :func:`perturbed` of the real output (and at least one did): the entry point
    returns what the helper returned."""
    changed = [
        (a["o"], b["o"])
        for a, b in zip(real, pert)
        if a is not None and b is not None and "o" in a and "o" in b and _key(a["o"]) != _key(b["o"])
    ]
    return bool(changed) and all(_close(perturbed(a), b) for a, b in changed)


def _close(a: object, b: object) -> bool:
    """Plain values equal, floats within ``1e-6`` (relative or absolute, HumanEval's usual
    tolerance), so a wrapper that rounds the helper's float finely is still a wrapper."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6) or a != a and b != b
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(_close(a[k], b[k]) for k in a)
    return a == b
