"""The cooperation bonus's counterfactual: the helper's values replaced by trusted stand-ins.

The entry point and the helper run in two sandboxes (:mod:`comlrl_lightning.coding.sandbox.split`):
``main`` reaches ``aux`` only through a call carrying plain values, relayed by a trusted broker.
The stand-ins live in that broker (:func:`substitute`), never in either candidate process: in
every run the helper runs on main's actual arguments and returns its real value (so a stand-in's
answer costs the same time), and the broker hands main, by *kind*:

- ``real``: the helper's value;
- ``perturbed``: :func:`perturbed` of it (same type, every part changed consistently: equal parts
  stay equal, so an internal check such as ``r[1] == r[2]`` still holds; parts equal to one of the
  call's whole arguments are kept, so an echo of the argument still matches);
- ``first``: the first answer of a call made after main loaded, replayed (a helper used as a
  constant gate; the harness, not main, tells the broker when the entry point's calls begin, so a
  call made while main loads cannot choose the replayed answer: ``load_time_priming``);
- ``identity``: the call's first argument (a helper that does no work);
- ``constant``: the empty / zero value of the real value's type;
- ``reversed``: the real run's answers in reverse order (call k of n gets the answer to call
  n + 1 - k): real values of the helper, so a gate on a property they all share (``r % 2 == 0``
  for a helper returning even numbers, two calls' answers differing) passes, while a main that
  needs each call's own answer fails. (The answer to the call before, tried first, kept too many
  counts of a predicate's answers: a sparse run of booleans shifted by one sums the same per test.)

The bonus's first half needs (:func:`helper_did_work`): every test passes in the real run; in
each stand-in run some test fails and no call ran out of time (time is never evidence: a run
failing only by time earns nothing, and the stand-in runs' per-call budgets come from the real
run, :func:`budgets`); and the real helper's outputs are not those of an identity-like stand-in:
:func:`echo_templates` of every call (each argument echoed in the output replaced by its position)
is not one and the same. The second half: the entry point is not a wrapper
(:func:`is_wrapper`, up to :data:`ENCODINGS`). Limits: ``docs/attacks.md``.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Sequence

STAND_INS = ("perturbed", "first", "identity", "constant", "reversed")
"""The kinds a needed helper makes some test fail under."""
TEXT_CHARS = 1000
"""Longest string the perturbation reads as a literal (``repr``/``str``/JSON of a plain value)."""
DEPTH = 32
"""Deepest plain value the perturbation looks into (deeper parts are left as they are)."""


def _key(value: object) -> str:
    from comlrl_lightning.coding.sandbox import plain

    return json.dumps(plain.encode(value), sort_keys=True)


def _text(s: str, keep: frozenset[str], d: int, runs: Sequence[list[str]] = ()) -> str:
    """A string that is the text of a plain value (``repr``, ``str`` or JSON, whitespace-padded or
    not) becomes the same text of the perturbed value; any other string gets a ``"0"`` appended."""
    core = s.strip()
    head, tail = s[: len(s) - len(s.lstrip())], s[len(core) + len(s) - len(s.lstrip()) :]
    if len(s) <= TEXT_CHARS and d < DEPTH and core:
        for load, dump in ((ast.literal_eval, repr), (ast.literal_eval, str), (json.loads, json.dumps)):
            try:
                lit = load(core)
                if dump(lit) == core:
                    new = dump(_perturb(lit, keep, d + 1, True, runs))
                    if type(new) is str and new != core:
                        return head + new + tail
            except Exception:  # noqa: BLE001 - not a text of that kind
                pass
    return s + "0"


def _spliced(keys: list[str], runs: Sequence[list[str]], whole: bool) -> set[int]:
    """Positions of ``keys`` (a sequence's items) inside a contiguous run equal to one of ``runs``
    (a list/tuple argument's items); a run covering every item counts only when ``whole``."""
    if not keys or not runs:
        return set()
    sep = "\x00"  # never inside a key: JSON escapes control characters
    hay, starts, pos = sep + sep.join(keys) + sep, [], 0
    for k in keys:  # text offset of each item, to map a match back to item positions
        starts.append(pos)
        pos += len(k) + 1
    index = {s: i for i, s in enumerate(starts)}
    out: set[int] = set()
    for run in runs:
        if len(run) > len(keys) or (len(run) == len(keys) and not whole):
            continue
        needle, at = sep + sep.join(run) + sep, hay.find(sep + sep.join(run) + sep)
        while at >= 0:  # str.find is linear-time even on repetitive items
            i = index[at]
            out.update(range(i, i + len(run)))
            at = hay.find(needle, at + 1)
    return out


def _runs(args: Sequence[object]) -> list[list[str]]:
    """The items' keys of each non-empty list/tuple argument (an echo may be spliced in whole)."""
    return [[_key(x) for x in a] for a in args if type(a) in (list, tuple) and a]


def _perturb(v: object, keep: frozenset[str], d: int, top: bool, runs: Sequence[list[str]] = ()) -> object:
    t = type(v)
    if not top and keep and t is not bool and _key(v) in keep:
        return v  # a whole argument inside the output: an echo, kept
    if t is bool:
        return not v
    if t is int:
        return v + 1
    if t is float:  # an integral float as its int (a cast is the same value), else far enough to tell
        if abs(v) < 2**52 and v == int(v):
            return v + 1.0
        return v + 1.0 + abs(v) if abs(v) < 1e300 else v
    if t is str:
        return _text(v, keep, d, runs)
    if t is bytes:
        return v + b"0"
    if d >= DEPTH:
        return v
    if t is list or t is tuple:  # an argument's items spliced in (`[n] + x`) are an echo too, kept
        kept = _spliced([_key(x) for x in v], runs, not top) if runs else set()
        return t(x if i in kept else _perturb(x, keep, d + 1, False, runs) for i, x in enumerate(v))
    if t is set or t is frozenset:
        return t(_perturb(x, keep, d + 1, False, runs) for x in v)
    if t is dict:
        return {k: _perturb(x, keep, d + 1, False, runs) for k, x in v.items()}
    return v


def perturbed(value: object, args: Sequence[object] = ()) -> object:
    """The ``perturbed`` stand-in's value for a plain helper output (same type, another value;
    ``None``, empty containers, NaN and infinities stay): every part changed by the same rule (so
    equal parts stay equal), except parts inside a container equal to one of ``args`` (whole) and
    items of a list/tuple that form one of ``args`` (a list/tuple) spliced in, as in ``[n] + x``."""
    keep = frozenset(_key(a) for a in args)
    return _perturb(value, keep, 0, True, _runs(args))


def _zero(v: object) -> object:
    t = type(v)
    return t() if t in (bool, int, float, str, bytes, list, tuple, dict, set, frozenset) else None


def substitute(kind: str, answers: Sequence[dict] = ()):
    """The broker's map for one run of ``kind`` (:func:`comlrl_lightning.coding.sandbox.split.run_split`):
    ``(args, kwargs, real output, entered) -> output main gets``; ``None`` for ``real``. Calls
    made before the entry point's calls begin (``entered`` false: main loading) get the real value.
    ``answers``: the real run's helper outputs in call order (``reversed`` answers call k of n
    with the one of call n + 1 - k, and wraps around past n)."""
    if kind == "real":
        return None
    first: list[dict] = []
    seen = [0]

    def sub(args: list, kwargs: dict, real: dict, entered: bool) -> dict:
        if not entered:  # main is loading: an answer primed here is neither replayed nor judged
            return real
        if not first:
            first.append(real)
        if kind == "first":
            return first[0]
        if kind == "reversed":  # real answers of other calls: any property they share is kept
            seen[0] += 1
            return answers[-seen[0] % len(answers)] if answers else real
        if kind == "identity":
            return {"o": args[0] if args else next(iter(kwargs.values()), None)}
        if "o" not in real:
            return real
        if kind == "perturbed":
            return {"o": perturbed(real["o"], list(args) + list(kwargs.values()))}
        return {"o": _zero(real["o"])}

    return sub


def echo_templates(args: list, kwargs: dict, out: object) -> set[str]:
    """``out`` with every part equal to one of the call's whole arguments replaced by that
    argument's position (a bool only where the argument is that same bool), an argument's text
    inside a string output and an argument's items spliced into a list/tuple output too, as text.
    An empty text/list argument is found nowhere, so its echo may sit anywhere in the output:
    one template per place it could be (``"" + "!"`` fits ``x + "!"``), for outputs up to 64 long."""
    named = [(f"<arg {i}>", a) for i, a in enumerate(args)] + [(f"<arg {k}>", a) for k, a in kwargs.items()]
    whole = {_key(a): name for name, a in named}
    texts = sorted(((a, n) for n, a in named if type(a) is str and a), key=lambda p: -len(p[0]))
    seqs = [(n, [_key(x) for x in a]) for n, a in named if type(a) in (list, tuple) and a]

    def text(v: str) -> str:
        for a, name in texts:  # an argument's text inside the output (`x + "!"`): an echo
            v = v.replace(a, name)
        return v

    def items(v: list | tuple, d: int) -> list[object]:
        got: list[object] = [walk(x, d + 1) for x in v]
        keys = [_key(x) for x in v]
        for name, run in seqs:  # an argument's items spliced in (`x + [0]`): one echo
            at = sorted(_spliced(keys, [run], True))
            for i in at:
                got[i] = None if i - 1 in at and got[i - 1] in (name, None) else name
        return [x for x in got if x is not None]

    def walk(v: object, d: int) -> object:
        k = _key(v)
        if k in whole:
            return whole[k]
        t = type(v)
        if t is str and texts:
            return json.dumps(text(v))
        if d < DEPTH and (t is list or t is tuple):
            return [t.__name__, *items(v, d)]
        if d < DEPTH and t is dict:
            return ["dict", *([_key(a), walk(x, d + 1)] for a, x in v.items())]
        return k

    found = {json.dumps(walk(out, 0))}
    empty = [n for n, a in named if type(a) in (str, list, tuple) and not a and type(a) is type(out)]
    if empty and _key(out) not in whole and len(out) <= 64:
        if type(out) is str:
            rep = text(out)
            found |= {
                json.dumps(json.dumps(rep[:i] + n + rep[i:])) for n in empty for i in range(len(rep) + 1)
            }
        else:
            got = items(out, 0)
            found |= {
                json.dumps([type(out).__name__, *got[:i], n, *got[i:]])
                for n in empty
                for i in range(len(got) + 1)
            }
    return found


def helper_did_work(aux_calls: Sequence[tuple[list, dict, dict]]) -> bool:
    """Whether the helper's real outputs differ from every identity-like stand-in's: no one fixed
    template of their arguments fits all of its calls (``x``, ``[x]``, ``(None, x)``, ``(x, c,
    c)``, ``x + [0]``, ``x + "!"``...; a helper returning one value on every call is such a
    template too)."""
    common: set[str] | None = None
    for a, k, out in aux_calls:
        shapes = echo_templates(a, k, out["o"]) if "o" in out else {json.dumps(sorted(out.items()))}
        common = shapes if common is None else common & shapes
        if not common:
            return True
    return False


def budgets(durations: Sequence[float | None], limit: float) -> list[float]:
    """Per-call time limits of a stand-in run from the real run's call durations: four times the
    real call plus a second, at most ``limit`` (a call slower only under a stand-in is a timeout,
    and a run with a timeout is no evidence, so the budget bounds what a spinning main costs and
    need not be tight: with a quarter second, ``test_cooperation_bonus_only_when_aux_is_called``'s
    honest wrapper lost its bonus once at a load of 15 on 2 cores and kept it when run alone;
    its calls take 0.2 ms, so the budget was scheduling jitter of the broker's round trip)."""
    return [limit if d is None else min(limit, 4 * d + 1.0) for d in durations]


def stand_in_fields(real, limit: float) -> dict:
    """What a stand-in run takes from the real run's report: its per-call ``budgets`` and the
    helper's real ``answers`` in call order (the ``reversed`` stand-in's values)."""
    return {
        "budgets": tuple(budgets(real.durations, limit)),
        "answers": tuple(out for _, _, out in real.aux_calls),
    }


def fails_not_by_time(rep) -> bool:
    """A stand-in run (a judged report) is evidence only when some test failed and nothing ran out
    of time (main's calls, the helper's calls, the run itself): time is never a verdict; nor is a
    run whose broker was told more than once that the entry point's calls begin."""
    if rep is None or rep.all_passed or getattr(rep, "helper_timeouts", 0):
        return False
    if getattr(rep, "entries", 1) != 1:  # main sent the harness's ENTRY line itself
        return False
    outs = getattr(rep, "outputs", [])
    return bool(outs) and all(o is not None and o.get("t") != "timeout" for o in outs)


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
    # a value that is not a sequence stays as it is (as _negated leaves text): a wrapper that reverses
    # only its sequence outputs (HumanEval/103 returns "0b..." or -1, /137 a number, a text or None)
    # is still a wrapper; raising here rejected the encoding for every call (+0.5 it had not earned)
    return v[::-1] if type(v) in (str, list, tuple) else v


ENCODINGS = {"identity": lambda v: v, "negation": _negated, "reversal": _reversed}
"""Invertible maps ``e`` (each its own inverse) a wrapper may put between the helper's value and
its output: the entry point is a wrapper when ``output = e(perturbed(e(real output)))`` fits every
changed call. Text encodings (``repr``, ``str``, JSON of the answer, padded with whitespace or not)
need no entry: :func:`perturbed` changes such a text to the text of the perturbed value; casts
(int/float/bool) are equal in :func:`_close`."""


def is_wrapper(real: Sequence[dict | None], pert: Sequence[dict | None], inputs: Sequence = ()) -> bool:
    """Whether, for one encoding ``e`` of :data:`ENCODINGS`, every call whose plain output changed
    between the ``real`` and the ``perturbed`` run changed to ``e(perturbed(e(real output)))`` (and
    at least one did): the entry point returns what the helper returned, up to ``e``. ``inputs``:
    each call's arguments (parts of the output equal to one are kept, as the broker keeps them)."""
    changed = [
        (a["o"], b["o"], inputs[i] if i < len(inputs) else ())
        for i, (a, b) in enumerate(zip(real, pert))
        if a is not None and b is not None and "o" in a and "o" in b and _key(a["o"]) != _key(b["o"])
    ]
    if not changed:
        return False
    for enc in ENCODINGS.values():
        try:
            if all(_close(enc(perturbed(enc(a), args)), b) for a, b, args in changed):
                return True
        except (TypeError, ValueError, OverflowError):
            continue
    return False


def _close(a: object, b: object) -> bool:
    """Plain values equal up to casts (int, float and bool compare by value), floats within
    ``1e-6`` (HumanEval's usual tolerance), strings up to surrounding whitespace."""
    num = (bool, int, float)
    if type(a) in num and type(b) in num:
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6) or a != a and b != b
    if type(a) is str and type(b) is str:
        return a.strip() == b.strip()
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(_close(a[k], b[k]) for k in a)
    return a == b
