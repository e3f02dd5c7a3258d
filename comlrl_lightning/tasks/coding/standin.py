"""The cooperation bonus's counterfactual: the helper's values replaced by a trusted stand-in.

Whether the entry point *needs* the helper is decided from separate fresh sandbox runs of the
same program, judged by the trusted judge from plain outputs only (nothing the candidate's
process says about itself counts):

- ``real``: the program as written;
- ``perturbed``: every value that leaves ``aux`` (see *sites* below) is replaced by
  :func:`perturbed` of it (same type, another value; only plain values of exact builtin types
  are changed, so no candidate code runs; ``None``, NaN and infinities stay), the same object for
  the same object while its content is unchanged (so ``aux(x) is G`` holds where it held);
- ``first``: every value ``aux`` returns is replaced by the first value it returned in an
  entry-point call, unless it equals that one (then it is returned itself: a constant helper
  behaves exactly, identity included, as in the real run); values stored out of ``aux`` likewise,
  per target;
- ``identity``: every value ``aux`` returns is replaced by its first argument as received (a
  helper that does no work: main's ``x = aux(x)`` then passes); what it stores is left alone.

*Sites*: a value leaves ``aux`` by ``return``, by an assignment to a name it declares ``global``
or ``nonlocal``, to an attribute, or to an item of anything but its own local variables (its
parameters count as not its own), by ``setattr`` or by a mutating call (``append``, ``extend``,
``insert``, ``add``, ``update``, ``setdefault``, ...) on such an object. All runs load the same
helper code: each site's value ``E`` becomes ``_aux_value(E, site, _aux_value_a)`` in every run
(``_aux_value_a`` is the first argument, bound on entry); only the top-level ``_aux_value``
differs (identity in the real run). In the stand-ins a value passes unchanged when ``aux`` was
called by ``aux`` (recursion) or when no entry-point call is running (module load, a thread), so
calls made while the main part loads cannot fix the stand-in's value. Once every test passes in
the real run, the helper counts when some test fails in each stand-in run. The entry point is a
*wrapper* when every call whose output changed under ``perturbed`` changed to the output a
wrapper would give, up to the encodings in :data:`ENCODINGS` (floats within ``1e-6``). Limits:
``docs/attacks.md``.
"""

from __future__ import annotations

import ast
import json
import math
import textwrap
from collections.abc import Sequence

from comlrl_lightning.tasks.coding.code_text import parse_code

DEPTH = 32
"""Deepest plain value the stand-ins look into (deeper values are left as they are)."""
TEXT_CHARS = 1000
"""Longest string the perturbation reads as a literal (``repr``/``str``/JSON of a plain value)."""

_LIB = f"""
def key(v, d=0):
    t = type(v)
    if v is None or t is bool or t is int or t is str:
        return (t.__name__, v)
    if t is float:
        return ("float", v.hex())
    if d >= {DEPTH}:
        return None
    if t is list or t is tuple:
        out = [t.__name__]
        for x in v:
            k = key(x, d + 1)
            if k is None:
                return None
            out.append(k)
        return tuple(out)
    if t is dict:
        out = ["dict"]
        for a, b in v.items():
            ka, kb = key(a, d + 1), key(b, d + 1)
            if ka is None or kb is None:
                return None
            out.append((ka, kb))
        return tuple(out)
    return None


def text(s, d):
    if len(s) <= {TEXT_CHARS} and d < {DEPTH}:
        ast, json = __import__("ast"), __import__("json")
        for load, dump in ((ast.literal_eval, repr), (ast.literal_eval, str), (json.loads, json.dumps)):
            try:
                lit = load(s)
                if dump(lit) == s and key(lit, d + 1) is not None:
                    new = dump(change(lit, d + 1))
                    if type(new) is str and new != s:
                        return new
            except Exception:
                pass
    return s + "0"


def change(v, d=0):
    t = type(v)
    if t is bool:
        return not v
    if t is int:
        return v + 1
    if t is float:
        return v + 1.0 + abs(v) if abs(v) < 1e300 else v
    if t is str:
        return text(v, d)
    if (t is list or t is tuple) and v:
        return v[:-1] + t([change(v[-1], d + 1)])
    if t is dict and v:
        out = dict(v)
        last = list(out)[-1]
        out[last] = change(out[last], d + 1)
        return out
    return v
"""
_PROLOGUE = """
    f = getframe(1)
    if f.f_back is not None and f.f_back.f_code is f.f_code:
        return v
    g = f
    while g.f_back is not None and g.f_back.f_code.co_name != "run_calls":
        g = g.f_back
    if g.f_back is None or g.f_code.co_filename == g.f_back.f_code.co_filename:
        return v
"""
_KIND_BODY = {
    "perturbed": """
    kv = key(v)
    if kv is None:
        return v
    hit = memo.get(id(v))
    if hit is None or hit[0] is not v or hit[1] != kv:
        hit = memo[id(v)] = (v, kv, change(v))
    return hit[2]
""",
    "first": """
    kv = key(v)
    box = boxes.get(site)
    if box is None:
        boxes[site] = (v, kv)
        return v
    if v is box[0] or (kv is not None and kv == box[1]):
        return v
    return box[0]
""",
    "identity": """
    return arg if site == "return" else v
""",
}
_STAND_IN = """
def {name}_make():
    getframe, memo, boxes = __import__("sys")._getframe, {{}}, {{}}
{lib}
    def value(v, site, arg):{body}
    return value


{name} = {name}_make()
del {name}_make
"""
_IDENTITY = """
def {name}(v, site, arg):
    return v
"""


def _stand_in_source(kind: str) -> str:
    body = textwrap.indent((_PROLOGUE + _KIND_BODY[kind]).strip("\n"), "    ")
    return _STAND_IN.replace("{lib}", textwrap.indent(_LIB.strip("\n"), "    ")).replace(
        "{body}", "\n" + body
    )


BODIES = {"real": _IDENTITY, **{k: _stand_in_source(k) for k in _KIND_BODY}}
"""The run kinds and the source of their ``_aux_value`` (``{name}``: its name)."""
STAND_INS = ("perturbed", "first", "identity")
"""The kinds a needed helper makes some test fail under."""

_ns: dict = {}
exec(compile(_LIB, "<perturbed>", "exec"), _ns)  # the code the runs use
perturbed = _ns["change"]
perturbed.__doc__ = (
    "The ``perturbed`` stand-in's value for a plain helper output ``v`` (same type, another value)."
)

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
        params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
        params |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
        stored = {n.id for n in own if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.local = stored - params - self.declared

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
    bind = ast.Assign([ast.Name(name + "_a", ast.Store())], _first_argument(fn))
    fn.body = body[:doc] + [bind] + body[doc:]
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
    raise TypeError("not a number")


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
