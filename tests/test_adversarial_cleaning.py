"""Completions that try to stall the reward thread (issue 21): the static passes over untrusted
text (cleaning, the structure checks, the helper's ``return`` check) are linear or hard-budgeted.

The issue asks for a bound test here: at the 20,000-character cap each worst input costs at most
1 s, and the time at 20k over the time at 10k (summed over the inputs, best of seven, the two sizes
measured in turn in one run) is at most 2.5. Before the fix 800 stacked ``@x`` lines took 10.5 s and
the cap minutes.
"""

from __future__ import annotations

import time

import pytest

from comlrl_lightning.coding import code_text
from comlrl_lightning.coding.code_text import MAX_COMPLETION_CHARS, clean_completion
from comlrl_lightning.coding.data import load_humaneval_rows
from comlrl_lightning.coding.reward import CooperativeCodeReward


def worst_inputs(n: int) -> dict[str, str]:
    """Texts of ``n`` characters that made a pass super-linear before (or could)."""
    return {
        "stacked_decorators": ("@x\n" * n)[:n],
        "decorators_after_a_broken_def": ("def f(:\n" + "@x\n" * n)[:n],
        "unparseable_def_aux_lines": ("def aux(\n" * n)[:n],
        "blank_lines_then_a_def": "\n" * (n - 8) + "def f(:\n",
        "broken_top_level_blocks": ("def f():\n    pass\n" + "def g(:\n" * n)[:n],
        "fenced_blank_lines": ("```python\n" + "\n" * n)[:n],
        "nested_lambdas": _lambda_chain(n),
    }


def _lambda_chain(n: int) -> str:
    """The entry point of HumanEval/0 returning ``lambda: lambda: ... 0``, ``n`` characters: valid
    code whose ``compile()`` is quadratic in the nesting (3-16 s at 20k before the cap)."""
    head = "def has_close_elements(numbers, threshold):\n    return "
    return head + "lambda: " * ((n - len(head) - 2) // 8) + "0\n"


def _costs(reward: CooperativeCodeReward, row: dict, n: int, repeats: int = 7) -> tuple[dict, dict]:
    """Best-of-``repeats`` seconds per worst input at ``n`` and at ``n // 2`` characters, the two sizes
    measured in turn inside each repeat, so a change of machine load between them (CI shares 2 cores)
    moves both sides of the ratio alike (measured one after the other, a 2.55 ratio was seen at load 5)."""
    big, small = worst_inputs(n), worst_inputs(n // 2)
    best = {size: dict.fromkeys(big, float("inf")) for size in ("big", "small")}
    for _ in range(repeats):
        for k in big:
            for size, text in (("big", big[k]), ("small", small[k])):
                code_text._failed.clear()  # cold: no parse failure remembered from the last repeat
                t = time.perf_counter()
                reward.plan([text, text], row)  # the helper's and the main's static passes
                best[size][k] = min(best[size][k], (time.perf_counter() - t) / 2)
    return best["big"], best["small"]


@pytest.fixture(scope="module")
def row():
    return load_humaneval_rows()[0]


def test_static_passes_are_bounded_at_the_cap_and_linear(row):
    reward = CooperativeCodeReward()
    big, small = _costs(reward, row, MAX_COMPLETION_CHARS)
    assert max(big.values()) <= 1.0, big
    assert sum(big.values()) / sum(small.values()) <= 2.5, (big, small)


def test_the_stacked_decorators_still_clean_the_way_they_did(row):
    # the budget changes the cost, not the result on ordinary cut-off completions
    cut = "def aux(x):\n    return x + 1\n\n\ndef aux(x):\n    y = (x +"
    assert clean_completion(cut) == "def aux(x):\n    return x + 1"
    assert CooperativeCodeReward().plan(["def aux(\n    return 1", "x"], row).components["aux_defined"] == 0.4


def test_a_lambda_chain_past_the_cap_scores_zero_without_being_parsed(row):
    from comlrl_lightning.coding.code_text import MAX_LAMBDAS

    chain = _lambda_chain(MAX_COMPLETION_CHARS)
    assert chain.count("lambda") > MAX_LAMBDAS and compile(chain, "<c>", "exec")  # valid Python
    plan = CooperativeCodeReward().plan(["def aux(x):\n    return x\n", chain], row)
    assert plan.error == "too_nested" and plan.program is None  # never compiled, never run
    assert sum(plan.components.values()) == 0.0
    head = "def has_close_elements(numbers, threshold):\n    return "
    ok = head + "lambda: " * MAX_LAMBDAS + "0\n"  # at the cap: scored as usual (no error)
    plan = CooperativeCodeReward().plan(["def aux(x):\n    return x\n", ok], row)
    assert plan.error is None and plan.components["syntax"] == 0.5
