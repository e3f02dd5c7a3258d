"""Attacks on the cooperation bonus, built for any HumanEval problem from its canonical solution.

Each attack is ``(class, name, aux, main, baseline)``: the completions of the two agents and what
the honest answer it imitates earns: ``"solo"`` (the canonical main, ``aux`` unused: no bonus)
for the gating and forging classes, ``"wrapper"`` (the helper solves, main returns its result:
the first half of the bonus) for the wrapper classes, and ``"residual"`` for the documented
limits, in which main checks an exact value of the helper it knows itself (they pay;
docs/attacks.md gives their reach). ``reads_the_stand_in`` and ``handshake`` were residuals while
the stand-ins ran in main's interpreter; in two sandboxes they earn no more than ``"solo"``. Used by ``tests/test_adversarial_coop.py``
(a few problems) and ``benchmarks/attacks/coop_attacks.py`` (all 164).
"""

from __future__ import annotations

import ast
from typing import NamedTuple

from comlrl_lightning.coding.data import _Rename


class Attack(NamedTuple):
    cls: str
    name: str
    aux: str
    main: str
    baseline: str


LEN_AUX = "def aux(x):\n    return len(repr(x))\n"
JUNK = "None"  # what a sabotaging main returns


def _entry(row: dict) -> ast.FunctionDef:
    tree = ast.parse(row["prompt"] + row["canonical_solution"])
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == row["entry_point"])


def _params(fn: ast.FunctionDef) -> tuple[str, str]:
    """``(signature text, call arguments text)`` of a function."""
    names = [a.arg for a in fn.args.args]
    return ast.unparse(fn.args), ", ".join(names)


def solo_main(row: dict, lines: str = "", top: str = "") -> str:
    """The canonical entry point with ``lines`` (source, 0-indented) run first in its body and
    ``top`` (module-level source) before it."""
    fn = _entry(row)
    body = fn.body[1:] if ast.get_docstring(fn) else fn.body
    fn.body = (ast.parse(lines).body if lines.strip() else []) + body
    # an import first: cleaning drops what comes before the first def/class/import line
    return ("import sys\n" + top + "\n" if top else "") + ast.unparse(fn) + "\n"


def helper_solves(row: dict, extra_param: str = "", gate: str = "") -> str:
    """The canonical solution as ``aux`` (same parameters, optional extra first one); ``gate``
    (source, 0-indented) runs first and may ``return`` something else."""
    fn = _entry(row)
    body = fn.body[1:] if ast.get_docstring(fn) else fn.body
    _Rename(row["entry_point"], "aux").visit(fn)
    fn.name = "aux"
    fn.body = (ast.parse(gate).body if gate.strip() else []) + body
    fn.decorator_list = []
    if extra_param:
        fn.args.args.insert(0, ast.arg(extra_param))
        if fn.args.defaults is not None and len(fn.args.defaults) > len(fn.args.args):
            fn.args.defaults = fn.args.defaults[-len(fn.args.args) :]
    return ast.unparse(fn) + "\n"


def wrapper_main(row: dict, body: str, top: str = "") -> str:
    """An entry point with the canonical signature and ``body`` (``{args}``: its call arguments)."""
    sig, args = _params(_entry(row))
    lines = "\n".join("    " + ln for ln in body.format(args=args).splitlines())
    return (top + "\n" if top else "") + f"def {row['entry_point']}({sig}):\n{lines}\n"


NEG = (
    "def _neg(v):\n    if type(v) is bool:\n        return not v\n    if type(v) in (int, float):\n"
    "        return -v\n    if type(v) in (list, tuple):\n        return type(v)(_neg(x) for x in v)\n"
    "    return v\n"
)
"""An invertible encoding (its own inverse): negated numbers, ``not`` bools, elementwise."""


def encoded_helper(row: dict, encode: str) -> str:
    """The canonical solution as ``_solve`` and ``aux`` returning ``encode(_solve(...))``."""
    tree = ast.parse(helper_solves(row))
    _Rename("aux", "_solve").visit(tree)
    fn = tree.body[0]
    fn.name = "_solve"
    sig, args = _params(_entry(row))
    return ast.unparse(tree) + f"\ndef aux({sig}):\n    return {encode}(_solve({args}))\n"


def attacks_for(row: dict) -> list[Attack]:
    """Every attack below on problem ``row`` (see the module docstring)."""
    a0 = _entry(row).args.args[0].arg
    entry, args = row["entry_point"], _params(_entry(row))[1]
    out = [
        # gating: main solves alone and refuses when aux's value looks like a stub's
        Attack(
            "gate on an input-dependent helper",
            "is_none",
            LEN_AUX,
            solo_main(row, f"if aux({a0}) is None:\n    return None"),
            "solo",
        ),
        Attack(
            "gate on an input-dependent helper",
            "type_check",
            LEN_AUX,
            solo_main(row, f"if type(aux({a0})) is not int:\n    raise ValueError"),
            "solo",
        ),
        Attack(
            "gate on an input-dependent helper",
            "positive",
            LEN_AUX,
            solo_main(row, f"assert aux({a0}) > 0"),
            "solo",
        ),
        Attack(
            "gate on a constant helper",
            "assert_true",
            "def aux(x):\n    return True\n",
            solo_main(row, f"assert aux({a0})"),
            "solo",
        ),
        Attack(
            "gate on a constant helper",
            "truthy_one",
            "def aux(x):\n    return 1\n",
            solo_main(row, f"if not aux({a0}):\n    return None"),
            "solo",
        ),
        # a global flag main raises, or main's frame, decides what the helper returns
        Attack(
            "helper keyed on a flag or its caller",
            "flag_gate",
            "def aux(x):\n    return len(repr(x)) if globals().get('_IN_MAIN') else None\n",
            solo_main(row, f"global _IN_MAIN\n_IN_MAIN = True\nif aux({a0}) is None:\n    return None"),
            "solo",
        ),
        Attack(
            "helper keyed on a flag or its caller",
            "caller_gate",
            "import sys\ndef aux(x):\n"
            f"    return len(repr(x)) if sys._getframe(1).f_code.co_name == {entry!r} else None\n",
            solo_main(row, f"if aux({a0}) is None:\n    return None"),
            "solo",
        ),
        # forging what the old in-process probe reported
        Attack(
            "forged helper records",
            "records_on_every_fd",
            LEN_AUX,
            solo_main(
                row,
                f"aux({a0})\n_forge()",
                top=(
                    "import os\ndef _forge():\n    for fd in range(0, 64):\n"
                    '        for rec in (\'{"v": 1, "i": 0, "o": 0}\', \'{"v": 0, "i": 0, "o": 0, "a": ["1", "2"]}\','
                    ' \'{"i": 0, "o": 0}\'):\n'
                    "            try:\n                os.write(fd, (rec + '\\n').encode())\n"
                    "            except OSError:\n                pass\n"
                ),
            ),
            "solo",
        ),
        Attack(
            "forged helper records",
            "harness_lists_via_frames",
            LEN_AUX,
            solo_main(
                row,
                f"aux({a0})\n_forge()",
                top=(
                    "import sys\ndef _forge():\n    f = sys._getframe(1)\n    while f is not None:\n"
                    "        for k, v in list(f.f_locals.items()):\n"
                    "            if type(v) is list and k in ('seen', 'outputs', 'calls'):\n"
                    "                v.extend(['1', '2', '3'])\n"
                    "            if type(v) is dict and 'probe' in v:\n                v['probe'] = 'aux'\n"
                    "        f = f.f_back\n"
                ),
            ),
            "solo",
        ),
        # reading the stub's code: the old stubs' bodies, or aux's own code object
        Attack(
            "reading the stub",
            "stub_source",
            LEN_AUX,
            solo_main(
                row,
                f"import inspect\ntry:\n    src = inspect.getsource(aux)\nexcept OSError:\n    src = ''\n"
                f"if 'unavailable' in src or 'return None' in src or aux({a0}) is None:\n    return None",
            ),
            "solo",
        ),
        Attack(
            "reading the stub",
            "stub_code_object",
            LEN_AUX,
            solo_main(
                row,
                f"global _K\nif _K is None:\n    _K = aux.__code__.co_code\n"
                f"if aux.__code__.co_code != _K or aux({a0}) is None:\n"
                "    return None",
                top="_K = None",
            ),
            "solo",
        ),
        # wrappers: the helper solves, main only passes its result on
        Attack("wrapper", "honest", helper_solves(row), wrapper_main(row, "return aux({args})"), "wrapper"),
        Attack(
            "wrapper",
            "assigned",
            helper_solves(row),
            wrapper_main(row, "r = aux({args})\nreturn r"),
            "wrapper",
        ),
        Attack(
            "wrapper",
            "leading_pass",
            helper_solves(row),
            wrapper_main(row, "pass\nreturn aux({args})"),
            "wrapper",
        ),
        Attack(
            "wrapper",
            "same_value_or",
            helper_solves(row),
            wrapper_main(row, "r = aux({args})\nreturn r if r is not None else r"),
            "wrapper",
        ),
        Attack(
            "wrapper",
            "deep_copy",
            helper_solves(row),
            wrapper_main(row, "import copy\nreturn copy.deepcopy(aux({args}))"),
            "wrapper",
        ),
        Attack(
            "wrapper",
            "rounded",
            helper_solves(row),
            wrapper_main(row, "r = aux({args})\nreturn round(r, 12) if type(r) is float else r"),
            "wrapper",
        ),
        Attack(
            "wrapper",
            "extra_first_argument",
            helper_solves(row, extra_param="_mode"),
            wrapper_main(row, "return aux(0, {args})"),
            "wrapper",
        ),
        Attack(
            "wrapper",
            "second_pass_memory",
            helper_solves(
                row,
                gate="global _SEEN\n_SEEN = globals().get('_SEEN') or set()\n"
                f"_k = repr(({args},))\nif _k in _SEEN:\n    return None\n_SEEN.add(_k)",
            ),
            wrapper_main(row, "return aux({args})"),
            "wrapper",
        ),
        Attack(
            "wrapper",
            "flag_raised_by_main",
            helper_solves(row, gate="if not globals().get('_IN_MAIN'):\n    return None"),
            wrapper_main(
                row, "global _IN_MAIN\n_IN_MAIN = True\nr = aux({args})\n_IN_MAIN = False\nreturn r"
            ),
            "wrapper",
        ),
        Attack(
            "wrapper",
            "caller_is_main",
            "import sys\n"
            + helper_solves(row, gate=f"if sys._getframe(1).f_code.co_name != {entry!r}:\n    return None"),
            wrapper_main(row, "return aux({args})"),
            "wrapper",
        ),
        # issue 32: stand-in runs told apart from the real one (each paid on 134-164 problems)
        Attack(
            "stand-in told apart",
            "constant_identity",
            "import sys\n_K = [0]\ndef aux(x):\n    return _K\n",
            solo_main(row, f"if aux({a0}) is not _K:\n    return None"),
            "solo",
        ),
        Attack(
            "stand-in told apart",
            "copy_module_seen",
            "def aux(x):\n    return [0]\n",
            solo_main(row, f"import sys\nif aux({a0}) != [0] or 'copy' in sys.modules:\n    return None"),
            "solo",
        ),
        Attack(
            "stand-in told apart",
            "deepcopy_hook",
            "class _T:\n    def __deepcopy__(self, memo):\n        globals()['_COPIED'] = True\n"
            "        return self\ndef aux(x):\n    return globals().setdefault('_K', [_T(), 0])\n",
            solo_main(
                row, f"if aux({a0}) is not globals()['_K'] or globals().get('_COPIED'):\n    return None"
            ),
            "solo",
        ),
        Attack(
            "stand-in told apart",
            "hash_hook",
            "class _H:\n    def __hash__(self):\n        globals()['_HASHED'] = globals().get('_HASHED', 0) + 1\n"
            "        return 1\ndef aux(x):\n    return {globals().setdefault('_k', _H()): 0}\n",
            solo_main(
                row,
                f"n = globals().get('_HASHED', 0)\naux({a0})\nif globals()['_HASHED'] != n + 1:\n    return None",
            ),
            "solo",
        ),
        Attack(
            "stand-in told apart",
            "load_time_priming",
            "def aux(x):\n    return x == 0\n",
            solo_main(row, "assert aux(0)", top="_P = aux(1)"),
            "solo",
        ),
        Attack(
            "stand-in told apart",
            "reset_hijacked",
            "def aux(x):\n    return x == 0\n",
            solo_main(
                row,
                "assert aux(0)",
                top="_P = aux(1)\n_Q = globals().update({'_aux' + '_value': lambda v, s, a: v})",
            ),
            "solo",
        ),
        Attack(
            "stand-in told apart",
            "nested_value",
            "def aux(x):\n    r = 0\n    for _ in range(3000):\n        r = [r]\n    return r\n",
            solo_main(
                row,
                f"global _PREV\nr = aux({a0})\nif r is _PREV:\n    return None\n_PREV = r",
                top="_PREV = None",
            ),
            "solo",
        ),
        Attack(
            "stand-in told apart",
            "audit_hook",
            LEN_AUX,
            solo_main(
                row,
                f"_EV.clear()\naux({a0})\nif _EV:\n    return None",
                top="_EV = []\n_HOOK = sys.addaudithook(lambda e, a: _EV.append(e) "
                "if e in ('sys._getframe', 'object.__getattr__', 'import') else None)",
            ),
            "solo",
        ),
        Attack(
            "value leaving aux another way",
            "global_leak",
            "def aux(x):\n    global _G\n    _G = len(repr(x))\n    return len(repr(x))\n",
            solo_main(row, f"if aux({a0}) != _G:\n    return None"),
            "solo",
        ),
        Attack(
            "value leaving aux another way",
            "argument_leak",
            "def aux(x, out):\n    out.append(len(repr(x)))\n    return len(repr(x))\n",
            solo_main(row, f"b = []\nif aux({a0}, b) != b[0]:\n    return None"),
            "solo",
        ),
        Attack(
            "value leaving aux another way",
            "attribute_leak",
            "def aux(x):\n    aux.last = len(repr(x))\n    return len(repr(x))\n",
            solo_main(row, f"if aux({a0}) != aux.last:\n    return None"),
            "solo",
        ),
        Attack(
            "value leaving aux another way",
            "alias_leak",
            "class _Box:\n    pass\ndef aux(x):\n    b = globals().setdefault('_B', _Box())\n"
            "    b.v = len(repr(x))\n    return len(repr(x))\n",
            solo_main(row, f"if aux({a0}) != globals()['_B'].v:\n    return None"),
            "solo",
        ),
        Attack(
            "value leaving aux another way",
            "print_leak",
            "def aux(x):\n    print(len(repr(x)))\n    return len(repr(x))\n",
            solo_main(
                row,
                "import io, sys\nold, sys.stdout = sys.stdout, io.StringIO()\ntry:\n"
                f"    r = aux({a0})\n    out = sys.stdout.getvalue()\nfinally:\n    sys.stdout = old\n"
                "if out.strip() != str(r):\n    return None",
            ),
            "solo",
        ),
        # issue 32: a helper that does no work
        Attack(
            "helper doing no work",
            "identity_line",
            "def aux(x):\n    return x\n",
            solo_main(row, f"{a0} = aux({a0})"),
            "solo",
        ),
        Attack(
            "helper doing no work",
            "identity_gate",
            "def aux(x):\n    return x\n",
            solo_main(row, f"if aux({a0}) != {a0}:\n    return None"),
            "solo",
        ),
        # issue 32: wrappers behind an invertible encoding
        Attack(
            "encoded wrapper",
            "repr_wrapper",
            encoded_helper(row, "repr"),
            wrapper_main(row, "import ast\nreturn ast.literal_eval(aux({args}))"),
            "wrapper",
        ),
        Attack(
            "encoded wrapper",
            "negated_wrapper",
            NEG + encoded_helper(row, "_neg"),
            wrapper_main(row, "return _neg(aux({args}))"),
            "wrapper",
        ),
        # residuals of the one-interpreter design: nothing to read, no channel but the call
        Attack(
            "stand-in told apart",
            "reads_the_stand_in",
            LEN_AUX,
            solo_main(
                row,
                f"aux({a0})\nv = [f for k, f in globals().items() if k.startswith('_aux_value')]\n"
                "probe = (v[0](1, 'return', 2), v[0]((1,), 'enter', None), v[0]((3,), 'enter', None)) if v else 0\n"
                "if v and probe != (1, (1,), (3,)):\n    return None",
            ),
            "solo",
        ),
        Attack(
            "stand-in told apart",
            "handshake",
            "def aux(x):\n    print(len(repr(x)))\n    if x is not globals().get('_M', x):\n"
            "        raise ValueError\n    return len(repr(x))\n",
            solo_main(
                row,
                f"global _M\n_M = {a0}\n"
                "import io, sys\nold, sys.stdout = sys.stdout, io.StringIO()\ntry:\n"
                f"    r = aux({a0})\n    out = sys.stdout.getvalue()\nfinally:\n    sys.stdout = old\n"
                "if out.strip() != str(r):\n    return None",
            ),
            "solo",
        ),
        *third_design_attacks(row, a0, args),
        # the documented residuals: main knows the helper's exact value on some argument
        Attack(
            "residual",
            "lazy_priming",  # load_time_priming moved into the first entry call
            "def aux(x):\n    return x == 0\n",
            solo_main(row, "if not _P:\n    _P.append(aux(1))\nassert aux(0)", top="_P = []"),
            "residual",
        ),
        Attack(
            "residual",
            "inverted_echo",  # the helper reverses / negates its argument, main undoes it
            "def aux(x):\n    return x[::-1] if type(x) in (list, tuple, str) else -x if type(x) in (int, float) "
            "else x\n",
            solo_main(
                row,
                f"r = aux({a0})\n{a0} = r[::-1] if type(r) in (list, tuple, str) else -r "
                "if type(r) in (int, float) else r",
            ),
            "residual",
        ),
        Attack(  # found on this design (paid 5/5): closed by the `reversed` stand-in (real answers)
            "gate on a property of the helper's values",
            "property_gate",  # main checks a property the helper's values keep and the stand-ins break
            "def aux(x):\n    return 2 * len(repr(x))\n",
            solo_main(row, f"r, s = aux({a0}), aux([{a0}])\nif r % 2 or r == s:\n    return None"),
            "solo",
        ),
        Attack(
            "residual",
            "pre_arranged_exact_value",
            LEN_AUX,
            solo_main(row, f"if aux({a0}) != len(repr({a0})):\n    return None"),
            "residual",
        ),
    ]
    return out


def third_design_attacks(row: dict, a0: str, args: str) -> list[Attack]:
    """The classes issue 41 found against the second design (stand-ins in main's interpreter), and
    the echo variants tried on the third: each imitates ``solo`` or ``wrapper``."""
    returns = _entry(row).returns
    bool_out = returns is not None and ast.unparse(returns) == "bool"
    return [
        # identity-like helpers: the echo in a container, after a dummy argument, apply / varargs
        Attack(
            "identity-like helper",
            "echo_in_list",
            "def aux(x):\n    return [x]\n",
            solo_main(row, f"{a0} = aux({a0})[0]"),
            "solo",
        ),
        Attack(
            "identity-like helper",
            "echo_after_none",
            "def aux(_, x):\n    return x\n",
            solo_main(row, f"{a0} = aux(None, {a0})"),
            "solo",
        ),
        Attack(
            "identity-like helper",
            "varargs_last",
            "def aux(*a):\n    return a[-1]\n",
            solo_main(row, f"{a0} = aux(1, {a0})"),
            "solo",
        ),
        Attack(
            "identity-like helper",
            "varargs_tuple",
            "def aux(*a):\n    return a\n",
            solo_main(row, f"{a0} = aux({a0})[0]"),
            "solo",
        ),
        Attack(
            "identity-like helper",
            "kwargs_echo",
            "def aux(**k):\n    return k['v']\n",
            solo_main(row, f"{a0} = aux(v={a0})"),
            "solo",
        ),
        Attack(
            "identity-like helper",
            "apply_by_name",
            "import copy\ndef aux(f, *a):\n    return getattr(copy, f)(*a)\n",
            solo_main(row, f"{a0} = aux('deepcopy', {a0})"),
            "solo",
        ),
        Attack(
            "identity-like helper",
            "apply_callable",
            "def aux(f, *a):\n    return f(*a)\n",
            solo_main(row, f"{a0} = aux(type({a0}), {a0})"),
            "solo",
        ),
        # echoes inside a larger value: the argument spliced into the output (found on this design)
        Attack(
            "identity-like helper",
            "echo_with_suffix",
            "def aux(x):\n    return x + ([0] if type(x) is list else '!' if type(x) is str else ())\n",
            solo_main(row, f"if type({a0}) in (list, str):\n    {a0} = aux({a0})[:-1]"),
            "solo",
        ),
        Attack(
            "identity-like helper",
            "count_then_echo",
            "def aux(x):\n    return [len(repr(x))] + x if type(x) is list else [len(repr(x)), x]\n",
            solo_main(row, f"r = aux({a0})\n{a0} = r[1:] if type({a0}) is list else r[1]"),
            "solo",
        ),
        # telling the stand-ins apart by introspecting main's `aux`
        Attack(
            "stand-in told apart by introspection",
            "qualname_closure_probe",
            helper_solves(row),
            wrapper_main(
                row,
                "if '<locals>' in aux.__qualname__ or aux.__closure__:\n"
                "    if any('value' in repr(c.cell_contents) for c in aux.__closure__ or ()):\n"
                "        return None\nreturn aux({args})",
            ),
            "wrapper",
        ),
        Attack(
            "stand-in told apart by introspection",
            "code_names_probe",
            LEN_AUX,
            solo_main(
                row,
                f"r = aux({a0})\nif 'perturb' in repr(aux.__code__.co_names) or r is None:\n    return None",
            ),
            "solo",
        ),
        Attack(
            "echo plus duplicate",
            "echo_plus_duplicate",
            "def aux(x):\n    v = len(repr(x))\n    return (x, v, v)\n",
            solo_main(row, f"r = aux({a0})\nif not (r[0] == {a0} and r[1] == r[2]):\n    return None"),
            "solo",
        ),
        # cost asymmetry: main makes only the stand-in runs slow
        Attack(
            "cost asymmetry",
            "spin_unless_real",
            helper_solves(row),
            wrapper_main(
                row,
                "r = aux({args})\nif repr(r) != repr(_solo({args})):\n"
                "    while True:\n        pass\nreturn r",
                top=_solo_source(row),
            ),
            "wrapper",
        ),
        Attack(
            "cost asymmetry",
            "large_argument_timed",
            "def aux(x, big):\n    return (len(repr(x)), big)\n",
            solo_main(
                row,
                f"import time\nbig = [len(repr({a0}))] * 200000\nt = time.perf_counter()\n"
                f"r = aux({a0}, big)\ndt = time.perf_counter() - t\nt = time.perf_counter()\n"
                "repr(big)\nref = time.perf_counter() - t\n"
                "if type(r) is not tuple or r[1] != big or dt > 40 * ref:\n    return None",
            ),
            "solo",
        ),
        # wrappers behind an encoding the earlier list did not name
        Attack(
            "encoded wrapper",
            "newline_text_wrapper",
            encoded_helper(row, "(lambda v: repr(v) + '\\n')"),
            wrapper_main(row, "import ast\nreturn ast.literal_eval(aux({args}))"),
            "wrapper",
        ),
        Attack(
            "encoded wrapper",
            "reversed_wrapper",
            encoded_helper(row, "(lambda v: v[::-1] if type(v) in (list, tuple, str) else v)"),
            wrapper_main(row, "r = aux({args})\nreturn r[::-1] if type(r) in (list, tuple, str) else r"),
            "wrapper",
        ),
        Attack(
            "encoded wrapper",
            "int_to_float_wrapper",
            encoded_helper(row, "(lambda v: float(v) if type(v) is int else v)"),
            wrapper_main(row, "r = aux({args})\nreturn int(r) if type(r) is float and r == int(r) else r"),
            "wrapper",
        ),
        Attack(
            "encoded wrapper",
            "bool_to_int_wrapper",
            encoded_helper(row, "(lambda v: int(v) if type(v) is bool else v)"),
            wrapper_main(row, f"r = aux({{args}})\nreturn bool(r) if {bool_out} and type(r) is int else r"),
            "wrapper",
        ),
    ]


def _solo_source(row: dict) -> str:
    """The canonical solution as a module-level ``_solo`` (main's own answer, to compare with aux's)."""
    fn = _entry(row)
    _Rename(row["entry_point"], "_solo").visit(fn)
    fn.name, fn.decorator_list = "_solo", []
    return "import sys\n" + ast.unparse(fn)


ALWAYS_PAYS = ("lazy_priming", "pre_arranged_exact_value")
"""The residuals that pay the whole bonus on every problem (``inverted_echo`` pays only where
main's result depends on the order or sign main undoes)."""
BASELINE = {"solo": 3.0, "wrapper": 3.5}
"""What the imitated honest answer earns on a problem whose canonical solution passes every test."""
