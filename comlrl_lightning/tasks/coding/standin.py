"""The cooperation bonus's counterfactual: the helper's values replaced by a trusted stand-in.

Whether the entry point *needs* the helper is decided from separate fresh sandbox runs of the
same program, judged by the trusted judge from plain outputs only (nothing the candidate's
process says about itself counts):

- ``real``: the program as written;
- ``perturbed``: every value that leaves ``aux`` (see *sites* below) is replaced by
  :func:`perturbed` of it (same type, another value; only plain values of exact builtin types
  are changed, so no candidate code runs; ``None``, NaN and infinities stay), the same object for
  the same object while its content is unchanged (so ``aux(x) is G`` holds where it held);
- ``first``: ``aux`` runs on (a fresh copy of) the arguments of its first entry-point call
  whenever its arguments differ from those (equal ones are passed as they are): a constant helper
  behaves exactly, identity included, as in the real run, and every value that comes out of it
  (returned, stored, printed, raised) is the first call's, so no channel disagrees with another;
- ``identity``: every value ``aux`` returns is replaced by its first argument as received (a
  helper that does no work: main's ``x = aux(x)`` then passes); what it stores is left alone.

*Sites*: a value leaves ``aux`` by ``return``, by an assignment to a name it declares ``global``
or ``nonlocal``, to an attribute, or to an item of anything but its own local variables (its
parameters count as not its own unless it rebinds them), by ``setattr`` or by a mutating call (``append``, ``extend``,
``insert``, ``add``, ``update``, ``setdefault``, ...) on such an object. All runs load the same
helper code: each site's value ``E`` becomes ``_aux_value(E, site, _aux_value_a)`` in every run
and the parameters are passed through ``_aux_value((p, ...), "enter", None)`` on entry
(``_aux_value_a`` is then the first argument) and the body runs in ``try: ... finally:
_aux_value(None, "exit", None)``; only the top-level ``_aux_value`` differs (identity in the real
run). The value functions look at no frame (an audit hook would see ``sys._getframe``): a depth
count from ``enter``/``exit`` lets values of ``aux`` called by ``aux`` (recursion) pass
unchanged, and the harness calls ``_aux_value(None, "reset", None)`` (the program's own function, restored
if main rebound it) once main has loaded, emptying ``first``'s record, so calls made while main
loads fix nothing. Once every test passes in
the real run, the helper counts when some test fails in each stand-in run. The entry point is a
*wrapper* when every call whose output changed under ``perturbed`` changed to the output a
wrapper would give, up to the encodings in :data:`ENCODINGS` (floats within ``1e-6``). Limits:
``docs/attacks.md``.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Sequence

from comlrl_lightning.tasks.coding.code_text import parse_code
from comlrl_lightning.tasks.coding.standin_values import BODIES, STAND_INS, perturbed  # noqa: F401

MUTATORS = {
    "append": 0,
    "extend": 0,
    "add": 0,
    "update": 0,
    "appendleft": 0,
    "extendleft": 0,
    "put": 0,
    "insert": -1,
    "setdefault": -1,
    "__setitem__": -1,
}
"""Mutating methods whose argument (at this position) a site wraps."""


class _Sites(ast.NodeTransformer):
    """Every value leaving one function's own scope (nested scopes are left alone) -> ``name(E,
    site, name_a)``; ``site`` is ``"return"`` or ``"s:<target>"`` (one ``first`` box per target)."""

    def __init__(self, name: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.name = name
        own = list(_own_nodes(fn))
        self.declared = {n for s in own if isinstance(s, (ast.Global, ast.Nonlocal)) for n in s.names}
        stored = {n.id for n in own if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.local = stored - self.declared  # a parameter rebound (`l = list(l)`) is its own copy

    def _wrap(self, value: ast.expr, site: str) -> ast.Call:
        args = [value, ast.Constant(site), ast.Name(self.name + "_a", ast.Load())]
        return ast.Call(ast.Name(self.name, ast.Load()), args, [])

    def _site(self, target: ast.expr) -> str | None:
        if isinstance(target, ast.Name):
            return f"s:{target.id}" if target.id in self.declared else None
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return None
        root = target
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.local:
            return None
        text = ast.unparse(target.value if isinstance(target, ast.Subscript) else target)
        return "s:" + text[:60] + ("[]" if isinstance(target, ast.Subscript) else "")

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:
        return node  # a nested scope: its values are not the helper's

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_FunctionDef

    def visit_Return(self, node: ast.Return) -> ast.Return:
        if node.value is not None:
            node.value = self._wrap(node.value, "return")
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        sites = [s for s in map(self._site, node.targets) if s is not None]
        if sites:
            node.value = self._wrap(node.value, sites[0])
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        site = self._site(node.target)
        if site is not None and node.value is not None:
            node.value = self._wrap(node.value, site)
        return node

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.stmt:
        site = self._site(node.target)
        if site is None:
            return node
        load = _as_load(node.target)
        return ast.Assign([node.target], self._wrap(ast.BinOp(load, node.op, node.value), site))

    def visit_Expr(self, node: ast.Expr) -> ast.Expr:
        call = node.value
        if not isinstance(call, ast.Call) or not call.args:
            return node
        func = call.func
        if isinstance(func, ast.Name) and func.id == "setattr" and len(call.args) == 3:
            call.args[2] = self._wrap(call.args[2], "s:setattr")
        elif isinstance(func, ast.Attribute) and func.attr in MUTATORS:
            probe = ast.Subscript(func.value, ast.Constant(0), ast.Store())
            site = self._site(probe)
            if site is not None:
                i = MUTATORS[func.attr] % len(call.args)
                call.args[i] = self._wrap(call.args[i], site)
        return node


def _own_nodes(fn: ast.AST):
    """The nodes of a function's own scope (not inside nested functions, classes, comprehensions)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _as_load(target: ast.expr) -> ast.expr:
    node = ast.parse(ast.unparse(target), mode="eval").body
    return node


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + [a.vararg] + a.kwonlyargs + [a.kwarg] if x is not None]


def _first_argument(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.expr:
    """The expression of ``fn``'s first argument as received (``None`` for a function without one)."""
    positional = fn.args.posonlyargs + fn.args.args
    if positional:
        return ast.Name(positional[0].arg, ast.Load())
    if fn.args.vararg is not None:
        star = fn.args.vararg.arg
        return ast.parse(f"{star}[0] if {star} else None", mode="eval").body
    return ast.Constant(None)


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
    sites = _Sites(name, fn)
    body = [sites.visit(s) for s in fn.body]
    doc = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    bind = [ast.Assign([ast.Name(name + "_a", ast.Store())], _first_argument(fn))]
    params = _params(fn)  # the arguments as the stand-in has them: the first call's in ``first``
    args = ast.Tuple([ast.Name(p, ast.Load()) for p in params], ast.Load())
    call = ast.Call(ast.Name(name, ast.Load()), [args, ast.Constant("enter"), ast.Constant(None)], [])
    names = ast.Tuple([ast.Name(p, ast.Store()) for p in params], ast.Store())
    bind.insert(0, ast.Assign([names], call) if params else ast.Expr(call))
    leave = ast.Expr(
        ast.Call(
            ast.Name(name, ast.Load()), [ast.Constant(None), ast.Constant("exit"), ast.Constant(None)], []
        )
    )
    fn.body = body[:doc] + bind[:1] + [ast.Try(bind[1:] + body[doc:], [], [], [leave])]
    ast.fix_missing_locations(tree)
    helper_src = ast.unparse(tree)
    out = {}
    for kind, src in BODIES.items():
        parts = (preamble, src.format(name=name).strip("\n"), helper_src)
        out[kind] = "\n\n".join(p for p in parts if p.strip()) + "\n"
    return out


def _negated(v: object) -> object:
    t = type(v)
    if t is bool:
        return not v
    if t is int or t is float:
        return -v
    if t is list or t is tuple:
        return t(_negated(x) for x in v)
    return v  # a string, None, a dict: as it is (numbers inside a mixed tuple are still negated)


def _reversed(v: object) -> object:
    if type(v) is str:  # not lists: main returning ``(aux(x), own value)`` would read as a wrapper
        return v[::-1]
    raise TypeError("not a string")


ENCODINGS = {"identity": lambda v: v, "negation": _negated, "reversal": _reversed}
"""Invertible maps ``e`` (each its own inverse) a wrapper may put between the helper's value and
its output: the entry point is a wrapper when ``output = e(helper value)`` fits every changed
call. Text encodings (``repr``, ``str``, JSON of the answer) need no entry: :func:`perturbed`
changes a string that is such a text to the text of the perturbed value."""


def _key(value: object) -> str:
    from comlrl_lightning.sandbox import plain

    return json.dumps(plain.encode(value), sort_keys=True)


def is_wrapper(real: Sequence[dict | None], pert: Sequence[dict | None]) -> bool:
    """Whether, for one encoding ``e`` of :data:`ENCODINGS`, every call whose plain output changed
    between the ``real`` and the ``perturbed`` run changed to ``e(perturbed(e(real output)))`` (and
    at least one did): the entry point returns what the helper returned, up to ``e``."""
    changed = [
        (a["o"], b["o"])
        for a, b in zip(real, pert)
        if a is not None and b is not None and "o" in a and "o" in b and _key(a["o"]) != _key(b["o"])
    ]
    if not changed:
        return False
    for enc in ENCODINGS.values():
        try:
            if all(_close(enc(perturbed(enc(a))), b) for a, b in changed):
                return True
        except (TypeError, ValueError, OverflowError):
            continue
    return False


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
