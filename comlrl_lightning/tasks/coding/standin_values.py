"""The stand-in runs' value functions (source text run inside the sandbox) and :func:`perturbed`.

Every kind's ``_aux_value(v, site, arg)`` is built from the same library (``key``: the content of
a plain value, ``None`` for anything else; ``clone``: a fresh copy of plain containers;
``change``: the perturbation), all nested inside one factory so no helper name is added to the
program's namespace. Only exact builtin types are inspected, so no candidate code (``__hash__``,
``__eq__``, ``__deepcopy__``, ...) runs in them; see :mod:`comlrl_lightning.tasks.coding.standin`.
"""

from __future__ import annotations

import ast
import json
import textwrap

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


def clone(v, d=0):
    t = type(v)
    if d < {DEPTH} and (t is list or t is tuple):
        return t([clone(x, d + 1) for x in v])
    if d < {DEPTH} and t is dict and all(key(a, d + 1) is not None for a in v):
        return dict((a, clone(b, d + 1)) for a, b in v.items())
    return v


def text(s, d):
    if len(s) <= {TEXT_CHARS} and d < {DEPTH}:
        for load, dump in ((literal, repr), (literal, str), (loads, dumps)):
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
    if site == "exit":
        depth[0] -= 1
        return v
    if site == "reset":
        boxes.clear()
        return v
    if site == "enter":
        depth[0] += 1
    if depth[0] > 1:
        return v
"""
_KIND_BODY = {
    "perturbed": """
    if site == "enter":
        return v
    kv = key(v)
    if kv is None:
        return v
    hit = memo.get(id(v))
    if hit is None or hit[0] is not v or hit[1] != kv:
        hit = memo[id(v)] = (v, kv, change(v))
    return hit[2]
""",
    "first": """
    if site != "enter":
        return v
    kv = key(v)
    if not boxes:
        boxes["in"] = (kv, clone(v))
        return v
    if kv is not None and kv == boxes["in"][0]:
        return v
    return clone(boxes["in"][1])
""",
    "identity": """
    return arg if site == "return" else v
""",
}
_STAND_IN = """
def {name}_make():
    memo, boxes, depth = {{}}, {{}}, [0]
    literal, loads, dumps = __import__("ast").literal_eval, __import__("json").loads, __import__("json").dumps
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

_ns: dict = {"literal": ast.literal_eval, "loads": json.loads, "dumps": json.dumps}
exec(compile(_LIB, "<perturbed>", "exec"), _ns)  # the code the runs use
perturbed = _ns["change"]
perturbed.__doc__ = (
    "The ``perturbed`` stand-in's value for a plain helper output ``v`` (same type, another value)."
)
