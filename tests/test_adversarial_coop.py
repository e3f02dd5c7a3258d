"""Attacks on the cooperation bonus (issue 21): every class earns no more than the honest answer it
imitates; the counterfactual's parts; hard-coded feedback; harness categories apart from names.

The attacks are built from each problem's canonical solution (``tests/coop_attacks.py``);
``benchmarks/attacks/coop_attacks.py`` runs the same list on all 164 problems (docs/attacks.md).
"""

from __future__ import annotations

import pytest
from coop_attacks import ALWAYS_PAYS, BASELINE, attacks_for, solo_main

from comlrl_lightning.coding.feedback import CodingFeedbackTransition
from comlrl_lightning.coding.recorder import recording_for
from comlrl_lightning.coding.reward import visible_tests
from comlrl_lightning.coding.sandbox import plain
from comlrl_lightning.coding.standin import is_wrapper, perturbed
from comlrl_lightning.envs.base import Episode

STATIC = 0.4 + 0.6 + 0.5


def _values(coop, row, pairs, turn=0):
    return coop([list(p) for p in pairs], [Episode(0, row) for _ in pairs], turn).values


def _check_problem(coop, row):
    atks = attacks_for(row)
    honest = [("def aux(x):\n    return x\n", solo_main(row))]  # the canonical main, aux unused
    values = _values(coop, row, honest + [(a.aux, a.main) for a in atks])
    assert values[0] == pytest.approx(BASELINE["solo"])
    got = {a.name: v for a, v in zip(atks, values[1:])}
    assert got["honest"] == pytest.approx(BASELINE["wrapper"])  # the honest wrapper keeps its half
    for a in atks:
        if a.baseline in BASELINE:
            assert got[a.name] <= BASELINE[a.baseline] + 1e-9, (a.cls, a.name, got[a.name])
        elif a.name in ALWAYS_PAYS:  # the documented residuals pay the whole bonus, never more
            assert got[a.name] == pytest.approx(4.0), (a.cls, a.name)
        else:  # a residual that pays only where the problem lets it (docs/attacks.md)
            assert got[a.name] <= 4.0 + 1e-9, (a.cls, a.name)


def test_no_attack_class_earns_more_than_the_honest_answer_it_imitates(coop, rows):
    _check_problem(coop, rows[4])  # a float output


@pytest.mark.slow
@pytest.mark.parametrize(
    "task", [0, 29, 32, 55]
)  # a bool, a list, a float with a helper in the prompt, a recursion
def test_no_attack_class_pays_on_other_output_types(coop, rows, task):
    _check_problem(coop, rows[task])


@pytest.mark.parametrize("task", [103, 137])  # outputs: a "0b..." text or -1; a number, a text or None
def test_a_wrapper_that_reverses_only_its_sequence_outputs_is_still_a_wrapper(coop, rows, task):
    # the final-code sweep (2026-12-05): reversed_wrapper earned 4.0 against the honest wrapper's 3.5 here
    atks = {a.name: a for a in attacks_for(rows[task])}
    honest, rev = atks["honest"], atks["reversed_wrapper"]
    values = _values(coop, rows[task], [(honest.aux, honest.main), (rev.aux, rev.main)])
    assert values[0] == pytest.approx(BASELINE["wrapper"]) and values[1] <= values[0] + 1e-9


MEAN = "def aux(numbers):\n    return sum(numbers) / len(numbers)\n"
MAD_MAIN = (
    "def mean_absolute_deviation(numbers):\n    m = aux(numbers)\n"
    "    return sum(abs(x - m) for x in numbers) / len(numbers)\n"
)
PAIR_AUX = "def aux(a, b, threshold):\n    return abs(a - b) < threshold\n"
PAIRS_MAIN = (
    "def has_close_elements(numbers, threshold):\n    for i, a in enumerate(numbers):\n"
    "        for j, b in enumerate(numbers):\n            if i != j and aux(a, b, threshold):\n"
    "                return True\n    return False\n"
)


GENUINE = [
    # (task, helper, main, reward): the helper's value is needed and main does more than pass it on
    (4, MEAN, MAD_MAIN, 4.0),  # the helper computes the mean, main the deviation
    (
        2,  # the helper takes the integer part, main subtracts it
        "import math\ndef aux(x):\n    return math.floor(x)\n",
        "def truncate_number(number):\n    return number - aux(number)\n",
        4.0,
    ),
    (
        12,  # the helper finds the longest length, main picks the first string that long
        "def aux(strings):\n    return max(len(s) for s in strings)\n",
        "def longest(strings):\n    if not strings:\n        return None\n    n = aux(strings)\n"
        "    for s in strings:\n        if len(s) == n:\n            return s\n",
        4.0,
    ),
    (
        8,  # the helper sums, main multiplies and returns both
        "def aux(numbers):\n    return sum(numbers)\n",
        "def sum_product(numbers):\n    p = 1\n    for n in numbers:\n        p *= n\n"
        "    return aux(numbers), p\n",
        4.0,
    ),
    # a bool output cannot tell an aggregating main from a wrapper by values (docs/attacks.md):
    # the helper's half only
    (0, PAIR_AUX, PAIRS_MAIN, 3.5),
]


@pytest.mark.parametrize("task, helper, main, reward", GENUINE, ids=[str(g[0]) for g in GENUINE])
def test_genuine_cooperation_earns_the_bonus(coop, rows, task, helper, main, reward):
    """Scored up to three times, keeping the best, as the honest pairs are (``tests/test_honest_pairs.py``):
    under load an honest team can lose its bonus to time alone (docs/attacks.md, "Honest pairs"; seen here
    once at a load of 6 beside the attack sweep). A refusal by the value judgement repeats every time and
    a judgement that pays more fails on the first score: the retries hide neither."""
    got = _values(coop, rows[task], [(helper, main)])[0]
    for _ in range(2):
        if got >= reward - 1e-9:
            break
        got = max(got, _values(coop, rows[task], [(helper, main)])[0])
    assert got == pytest.approx(reward)


@pytest.mark.parametrize(
    "value",
    [True, False, 0, -1, 7, 0.0, -1.0, 1e17, "", "ab", [1, 2], (3,), {"a": 1}, [[True]], "5", "[1, 2]"],
)
def test_perturbed_keeps_the_type_and_changes_the_value(value):
    out = perturbed(value)
    assert type(out) is type(value) and out != value
    if isinstance(value, (list, tuple, dict)):
        assert len(out) == len(value)


def test_perturbed_leaves_what_it_cannot_change():
    assert perturbed(None) is None and perturbed([]) == [] and perturbed({}) == {}
    nan = float("nan")
    assert perturbed(nan) is nan and perturbed(float("inf")) == float("inf")  # was 0.5: told apart


def test_perturbed_text_of_a_value_is_the_text_of_the_perturbed_value():
    # a helper returning repr / str / JSON of the answer is perturbed like the answer itself
    assert perturbed("5") == "6" and perturbed("[1, 2]") == "[2, 3]" and perturbed("'ab'") == "'ab0'"
    assert perturbed('{"a": true}') == '{"a": false}' and perturbed("abc") == "abc0"


def test_a_wrapper_is_a_main_whose_changed_outputs_are_the_perturbed_helper_outputs():
    real = [{"o": 1}, {"o": [1, 2]}, {"x": "ValueError"}, None]
    assert is_wrapper(real, [{"o": 2}, {"o": [2, 3]}, {"o": 5}, {"o": 1}])
    assert not is_wrapper(real, [{"o": 3}, {"o": [2, 3]}, None, None])  # one output is not perturbed(real)
    assert not is_wrapper(real, real)  # nothing changed: no evidence either way, no wrapper
    assert is_wrapper([{"o": 0.25}], [{"o": 1.5 + 1e-9}])  # a finely rounded float is the same output
    assert not is_wrapper([{"o": 0.25}], [{"o": 1.51}])


def test_a_wrapper_behind_an_invertible_encoding_is_a_wrapper():
    real = [{"o": 2}, {"o": [1.5, -2.0]}]
    # -(perturbed(-real)): 1.5 -> -1.5 -> 1.0 -> -1.0 (v + 1 + |v|), -2.0 -> 2.0 -> 3.0 -> -3.0
    negated = [{"o": 1}, {"o": [-1.0, -3.0]}]
    assert is_wrapper(real, negated)
    assert is_wrapper([{"o": "abc"}], [{"o": "0abc"}])  # reversed
    # numbers negated, other items as they are (then perturbed: "a" -> "a0", -2 -> -1 -> 1)
    assert is_wrapper([{"o": ("a", 2)}], [{"o": ("a0", 1)}])
    assert not is_wrapper(real, [{"o": 1}, {"o": [2.5, -2.5]}])  # not one encoding for every call


# ----------------------------------------------------------------------------- hard-coded feedback
def _lookup_main(row, indices):
    """An entry point that answers, from a table, the calls of the given tests only."""
    rec, table = recording_for(row), {}
    for i in indices:
        for key, out in zip(rec.calls[i], rec.expected[i]):
            if "o" in out:
                args, kwargs = plain.loads(key)
                table[repr((list(args), kwargs))] = plain.decode(out["o"])
    return (
        f"def {row['entry_point']}(*args, **kwargs):\n"
        f"    return _T.get(repr((list(args), kwargs)))\n_T = {table!r}\n"
    )


def test_a_revision_answering_the_quoted_asserts_earns_no_test_term(coop, rows):
    row = rows[0]
    rec = recording_for(row)
    shown = visible_tests(len(rec.tests))
    main = _lookup_main(row, shown)
    first, later = (_values(coop, row, [("def aux(x):\n    return x\n", main)], t)[0] for t in (0, 1))
    assert first > STATIC  # the visible tests pass (a turn-0 answer is not fed back yet)
    assert later == pytest.approx(STATIC)  # revisions: hidden tests only, and those fail
    canonical = solo_main(row)
    assert _values(coop, row, [("def aux(x):\n    return x\n", canonical)], 1)[0] == pytest.approx(3.0)


def test_a_problem_without_hidden_tests_has_no_test_term_on_revisions(coop, rows):
    single = next(r for r in rows if len(recording_for(r).tests) == 1)
    canonical = solo_main(single)
    at0, at1 = (_values(coop, single, [("def aux(x):\n    return x\n", canonical)], t)[0] for t in (0, 1))
    assert at0 == pytest.approx(3.0) and at1 == pytest.approx(STATIC)


# ------------------------------------------------------------------ categories from the judge only
@pytest.mark.parametrize("name", ["Timeout", "UnsupportedOutput", "CallMismatch"])
def test_an_exception_named_like_a_category_reads_as_an_exception(coop, rows, name):
    main = f"class {name}(Exception):\n    pass\ndef has_close_elements(numbers, threshold):\n    raise {name}()\n"
    report = coop.report_for(["def aux(x):\n    return x\n", main], rows[0])
    assert {t.status for t in report.tests} == {"error"}
    assert {t.error_type for t in report.tests} == {"Exception"}
    text = CodingFeedbackTransition(coop).feedback(report)
    assert "an exception" in text and "timeout" not in text and "unsupported" not in text


def test_a_real_timeout_still_reads_as_a_timeout(coop, rows):
    main = "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n"
    report = coop.report_for(["def aux(x):\n    return x\n", main], rows[0])
    assert report.tests[0].status == "timeout"
    assert "a timeout" in CodingFeedbackTransition(coop).feedback(report)
