"""The cooperation bonus's third design (issue 41): helper and main in two sandboxes, judged on values.

Each attack class the issue found pays no more than the honest answer it imitates: ``solo`` (the
canonical main, helper unused: 3.0) or ``wrapper`` (the helper solves, main returns its result:
3.5). Each test fails on the design before (stand-ins inside main's interpreter).
"""

from __future__ import annotations

import pytest
from coop_attacks import attacks_for, encoded_helper, helper_solves, solo_main, wrapper_main

from comlrl_lightning.coding.sandbox import plain
from comlrl_lightning.coding.sandbox.results import SandboxConfig
from comlrl_lightning.coding.sandbox.split import run_split
from comlrl_lightning.coding.standin import helper_did_work, is_wrapper, perturbed, substitute
from comlrl_lightning.envs.base import Episode

SOLO, WRAPPER = 3.0, 3.5


def _value(coop, row, aux, main):
    return coop([[aux, main]], [Episode(0, row)], 0).values[0]


def test_main_reaches_the_helper_only_through_plain_values():
    calls = [plain.dumps([[i], {}]) for i in range(3)]
    helper = "G = 5\ndef aux(x):\n    return {x, 2 * x} if x else b'z'\n"
    main = (
        "def f(x):\n    try:\n        return [sorted(aux(x)) if x else aux(x).decode(), globals().get('G')]\n"
        "    except Exception as e:\n        return type(e).__name__\n"
    )
    rep = run_split(
        "", helper, "f", calls, main=main, config=SandboxConfig(timeout_s=4.0, test_timeout_s=1.0)
    )
    # sets and bytes cross; the helper's globals do not
    assert [o["o"] for o in rep.outputs] == [["z", None], [[1, 2], None], [[2, 4], None]]
    assert rep.aux_calls[1] == ([1], {}, {"o": {1, 2}})
    odd = run_split("", helper, "f", calls[:1], main="def f(x):\n    return aux(object())\n")
    assert odd.outputs == [{"x": "TypeError"}] and odd.aux_calls == []  # nothing else crosses


def test_an_identity_like_helper_earns_no_bonus(coop, rows):
    row = rows[4]  # the echo escaped the old identity stand-in (first argument only): 20/21 paid
    a0 = "numbers"
    for aux, line in [
        ("def aux(x):\n    return [x]\n", f"{a0} = aux({a0})[0]"),
        ("def aux(_, x):\n    return x\n", f"{a0} = aux(None, {a0})"),
        ("def aux(*a):\n    return a[-1]\n", f"{a0} = aux(1, {a0})"),
    ]:
        assert _value(coop, row, aux, solo_main(row, line)) == pytest.approx(SOLO), aux
    assert not helper_did_work([([[1]], {}, {"o": [[1]]}), ([[2]], {}, {"o": [[2]]})])
    assert helper_did_work([([[1]], {}, {"o": 1}), ([[2]], {}, {"o": 2})])


def test_an_answer_primed_while_main_loads_is_not_replayed_nor_evidence(coop, rows):
    row = rows[4]  # `_P = aux(1)` at load made "first answer replayed" replay False: 4.0 paid
    gate = "def aux(x):\n    return x == 0\n"
    assert _value(coop, row, gate, solo_main(row, "assert aux(0)", top="_P = aux(1)")) == pytest.approx(SOLO)
    forge = (  # main sends the harness's "entry calls begin" line itself (the channel's descriptor
        # is the one int in the stub's closure), then primes; cleaning keeps assignments before a def
        "import os\n_F = [os.write(c.cell_contents, b'\"entry\"\\n') for c in aux.__closure__ or ()"
        " if type(c.cell_contents) is int]\n_P = aux(1)"
    )
    assert _value(coop, row, gate, solo_main(row, "assert aux(0)", top=forge)) == pytest.approx(SOLO)
    first = substitute("first")
    assert first([1], {}, {"o": False}, False) == {"o": False}  # loading: the real value, not kept
    assert first([0], {}, {"o": True}, True) == {"o": True}
    assert first([1], {}, {"o": False}, True) == {"o": True}  # the first answer after entry


def test_echo_plus_duplicate_earns_no_bonus(coop, rows):
    row = rows[4]
    aux = "def aux(x):\n    v = len(repr(x))\n    return (x, v, v)\n"
    main = solo_main(row, "r = aux(numbers)\nif not (r[0] == numbers and r[1] == r[2]):\n    return None")
    assert _value(coop, row, aux, main) == pytest.approx(SOLO)
    assert perturbed(([1], 5, 5), [[1]]) == ([1], 6, 6)  # equal parts stay equal, the echo is kept


def test_an_echo_spliced_into_a_larger_value_earns_no_bonus(coop, rows):
    # found on this design: 4.0 on 3 of 5 list/str problems (x + [0] or x + "!"), 2 of 5 ([n] + x)
    for task in (7, 1):  # a list of strings, a string
        atk = {a.name: a for a in attacks_for(rows[task])}
        for name in ("echo_with_suffix", "count_then_echo"):  # an echo + a constant; work main ignores
            assert _value(coop, rows[task], atk[name].aux, atk[name].main) == pytest.approx(SOLO), (
                task,
                name,
            )
    assert perturbed([2, 1, 2], [[1, 2]]) == [3, 1, 2]  # the spliced argument is kept, the rest changes
    assert perturbed([1, 2], [[1, 2]]) == [2, 3]  # the whole output is not an echo kept
    assert not helper_did_work([([[1, 2]], {}, {"o": [1, 2, 0]}), ([[3]], {}, {"o": [3, 0]})])
    assert not helper_did_work([(["ab"], {}, {"o": "ab!"}), (["c"], {}, {"o": "c!"})])
    # an empty argument's echo is found nowhere: "" + "!" still fits x + "!" (paid on 3 of 14 problems)
    assert not helper_did_work([(["ab"], {}, {"o": "ab!"}), ([""], {}, {"o": "!"})])
    assert not helper_did_work([([[1, 2]], {}, {"o": [1, 2, 0]}), ([[]], {}, {"o": [0]})])
    assert helper_did_work([([[1, 2]], {}, {"o": [2, 1, 2]}), ([[3]], {}, {"o": [1, 3]})])


def test_a_gate_on_a_property_of_the_helpers_values_earns_no_bonus(coop, rows):
    # found on this design: a helper returning even numbers, main refusing an odd or a repeated
    # answer, broke perturbed (+1), first, identity and constant alike: 4.0 on 5 of 5 problems
    for task in (4, 13):  # a list argument, an int argument
        atk = next(a for a in attacks_for(rows[task]) if a.name == "property_gate")
        assert _value(coop, rows[task], atk.aux, atk.main) == pytest.approx(SOLO), task
    reverse = substitute("reversed", [{"o": 2}, {"o": 4}, {"x": "ValueError"}])
    assert reverse([0], {}, {"o": 9}, False) == {"o": 9}  # loading: the real value
    got = [reverse([k], {}, {"o": 9}, True) for k in range(4)]
    assert got == [{"x": "ValueError"}, {"o": 4}, {"o": 2}, {"x": "ValueError"}]  # then around again


def test_main_cannot_tell_the_stand_ins_apart_by_introspection(coop, rows):
    row = rows[4]  # a stand-in was a closure in main's interpreter: 21/21 paid
    aux = helper_solves(row)
    main = wrapper_main(
        row,
        "g = aux.__code__.co_consts\nif '<locals>' in aux.__qualname__ or aux.__closure__:\n"
        "    if any('_aux_value' in str(c) for c in g) or 'value' in aux.__qualname__:\n"
        "        return None\nreturn aux({args})",
    )
    assert _value(coop, row, aux, main) <= WRAPPER + 1e-9


def test_a_run_failing_only_by_time_under_stand_ins_earns_nothing(coop, rows):
    row = rows[4]  # the helper solves; main spins whenever the value is not the real one
    aux = helper_solves(row)
    main = wrapper_main(
        row,
        "r = aux({args})\nm = sum(numbers) / len(numbers)\n"
        "if abs(r - sum(abs(x - m) for x in numbers) / len(numbers)) > 1e-9:\n"
        "    while True:\n        pass\nreturn r",
    )
    assert _value(coop, row, aux, main) == pytest.approx(SOLO)


def test_a_whitespace_padded_text_wrapper_is_a_wrapper(coop, rows):
    row = rows[0]  # bool output: repr + newline reached 4.0 on 21/21
    aux = encoded_helper(row, "(lambda v: repr(v) + '\\n')")
    main = wrapper_main(row, "import ast\nreturn ast.literal_eval(aux({args}))")
    assert _value(coop, row, aux, main) == pytest.approx(WRAPPER)
    assert perturbed("[1, 2]\n") == "[2, 3]\n" and perturbed(" True ") == " False "


@pytest.mark.parametrize("task, enc, dec", [(13, "float", "int"), (29, "list", "(lambda v: v[::-1])")])
def test_cast_and_list_reversal_wrappers_are_wrappers(coop, rows, task, enc, dec):
    row = rows[task]  # int->float casts paid +0.5 on 11/21, list reversal on 8/21
    if dec.startswith("("):
        aux = encoded_helper(row, "(lambda v: v[::-1])")
    else:
        aux = encoded_helper(row, enc)
    main = wrapper_main(row, f"return {dec}(aux({{args}}))")
    assert _value(coop, row, aux, main) <= WRAPPER + 1e-9
    assert is_wrapper([{"o": 3}], [{"o": 4.0}]) and is_wrapper([{"o": [1, 2]}], [{"o": [2, 3]}])


@pytest.mark.slow
def test_the_canonical_main_earns_the_tests_on_every_problem(coop, rows):
    values = coop(
        [["def aux(x):\n    return x\n", solo_main(r)] for r in rows], [Episode(0, r) for r in rows], 0
    ).values
    assert [i for i, v in enumerate(values) if v != pytest.approx(SOLO)] == []
