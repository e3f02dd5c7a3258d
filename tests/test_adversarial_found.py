"""Attacks on the rebuilt coding reward that paid (security review, branch ``attack``), now fixed.

Each test states the behaviour the reward *should* have. They were filed ``xfail(strict=True)``
with the reason each failed; every fix removed its marker, so each now must pass (the outcomes
and the remaining limits are in docs/attacks.md).
"""

from __future__ import annotations

import pytest

from comlrl_lightning.coding.feedback import CodingFeedbackTransition
from comlrl_lightning.coding.recorder import recording_for
from comlrl_lightning.coding.reward import visible_tests
from comlrl_lightning.envs.base import Episode

HEAD = "def has_close_elements(numbers, threshold):\n"
SOLUTION_BODY = (
    "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
    "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n"
)
TRIVIAL_AUX = "def aux(x):\n    return x\n"
HELPER_SOLVES = "def aux(numbers, threshold):\n" + SOLUTION_BODY
NO_BONUS = 0.4 + 0.6 + 0.5 + 1.5  # correct main, no cooperation bonus


def _values(coop, rows, pairs):
    return coop([list(p) for p in pairs], [Episode(0, rows[0]) for _ in pairs], 0).values


GATES = {
    # aux returns a constant; main solves alone but refuses to answer when aux's value is what a stub gives
    "is_none_gate": (
        "def aux(x):\n    return 1\n",
        HEAD + "    if aux(numbers) is None:\n        return None\n" + SOLUTION_BODY,
    ),
    "assert_gate": ("def aux(x):\n    return True\n", HEAD + "    assert aux(numbers)\n" + SOLUTION_BODY),
    "truthiness_gate": (
        "def aux(x):\n    return True\n",
        HEAD + "    ok = aux(numbers)\n    if not ok:\n        return 0\n" + SOLUTION_BODY,
    ),
}


@pytest.mark.parametrize("name", list(GATES))
def test_a_constant_helper_used_as_a_gate_earns_no_bonus(coop, rows, name):
    assert _values(coop, rows, [GATES[name]])[0] == pytest.approx(NO_BONUS)


@pytest.mark.parametrize(
    "body",
    [
        "    r = aux(numbers, threshold)\n    return r\n",
        "    return aux(numbers, threshold) or False\n",
        "    pass\n    return aux(numbers, threshold)\n",
    ],
)
def test_a_wrapper_in_disguise_is_still_a_trivial_wrapper(coop, rows, body):
    assert _values(coop, rows, [(HELPER_SOLVES, HEAD + body)])[0] == pytest.approx(NO_BONUS + 0.5)


LEAK_TABLE = [
    "KeyError",
    "IndexError",
    "ZeroDivisionError",
    "LookupError",
    "OverflowError",
    "RuntimeError",
    "ArithmeticError",
    "EOFError",
]
LEAK_MAIN = (
    "import os\n_attack = exec("
    + repr(
        "import gc, builtins\n"
        "JOB = next(o for o in gc.get_objects() if type(o) is dict and 'calls' in o and 'entry_point' in o)\n"
        f"builtins._LEAK = [{', '.join(LEAK_TABLE)}][len(JOB['calls'][-1]) % 8]\n"
    )
    + ")\n"
    + HEAD
    + "    import builtins\n    raise builtins._LEAK('x')\n"
)


def test_feedback_carries_no_information_about_hidden_test_inputs(coop, rows):
    rec = recording_for(rows[0])
    hidden = {k for i, t in enumerate(rec.calls) if i not in visible_tests(len(rec.tests)) for k in t}
    last = rec.keys[-1]
    assert last in hidden  # the encoded value depends on a hidden test's input only
    text = CodingFeedbackTransition(coop).feedback(coop.report_for([TRIVIAL_AUX, LEAK_MAIN], rows[0]))
    assert LEAK_TABLE[len(last) % 8] not in text, text


FORGED_ISO = (
    "import os\n_attack = exec("
    + repr('import os, sys\nos.write(int(sys.argv[2]), b\'{"k":"iso","items":["FORGED-layer"]}\\n\')\n')
    + ")\n"
    + HEAD
    + "    return None\n"
)


def test_the_candidate_cannot_add_layers_to_the_isolation_report(coop, rows):
    report = coop.report_for([TRIVIAL_AUX, FORGED_ISO], rows[0])
    if "seccomp" not in report.isolation:
        pytest.skip("needs the bubblewrap path (the fallback reports its own two iso records first)")
    assert "FORGED-layer" not in report.isolation
