"""Honest helper/main solutions still earn the cooperation bonus (issue 41's guard against a
judgement that refuses real cooperation): each pair of ``tests/honest_pairs.py`` passes every
test and earns the whole bonus, 4.0 (no pair has a bool output, where the reward pays 3.5).

The three pairs marked ``xfail`` are refused by the value judgement today (docs/attacks.md,
"honest pairs"): a key function whose values only order the items is not changed in effect by the
``perturbed`` stand-in (one added to every key keeps their order), and a count of the helper's
values above 0 moves by exactly one under it, which reads as a wrapper. Pair 91 (a count of a
predicate's answers) and HumanEval/0's pair predicate guarded the choice of the ``reversed``
stand-in: the answer to the call before kept their per-test counts.
"""

from __future__ import annotations

import pytest
from honest_pairs import PAIRS

from comlrl_lightning.coding.reward import CooperativeCodeReward
from comlrl_lightning.coding.sandbox.results import SandboxConfig
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import PASS_AT_1

GENUINE = 4.0
REFUSED = {
    19: "a key function: perturbed keys (+1 each) keep the order, the perturbed run passes",
    116: "a key function: perturbed keys (+1 each) keep the order, the perturbed run passes",
    108: "a count of values > 0: each changed count is the real one + 1, read as a wrapper",
}


RETRIES = 2
"""Times a pair that lost its bonus in the joint call is scored again, alone (see :func:`judged`)."""


def _score(pairs, rows):
    coop = CooperativeCodeReward(SandboxConfig(timeout_s=8.0, test_timeout_s=3.0))
    try:
        res = coop([[p.aux, p.main] for p in pairs], [Episode(0, rows[p.task]) for p in pairs], 0)
    finally:
        coop.close()
    levels = ("tests", "coop_calls_aux", "coop_nontrivial")
    return {
        p.task: (res.values[k], res.metrics[PASS_AT_1][k], {n: res.metrics[n][k] for n in levels})
        for k, p in enumerate(pairs)
    }


@pytest.fixture(scope="module")
def judged(rows):
    """Every pair scored in one reward call (they run in parallel, 6 sandbox runs each), with a
    test time limit of 3 s, not 1 s: a stand-in run with a timeout is no evidence, and time is not
    what these pairs pin. At a load of 10-13 on 2 cores a pair still lost its bonus in 2 of 6 runs
    (docs/attacks.md, "Honest pairs"), each scoring 4.0 alone right after; so a pair (not one of the
    known refusals) that lost it is scored again alone, up to :data:`RETRIES` times, and keeps its
    best score. A judgement that refuses a pair does so every time: the retries do not hide it."""
    out = _score(PAIRS, rows)
    for _ in range(RETRIES):
        lost = [p for p in PAIRS if p.task not in REFUSED and out[p.task][0] != pytest.approx(GENUINE)]
        if not lost:
            break
        for p in lost:
            again = _score([p], rows)[p.task]
            if again[0] > out[p.task][0]:
                out[p.task] = again
    return out


def test_the_honest_pairs_are_at_least_twenty_problems_with_distinct_work():
    assert len({p.task for p in PAIRS}) == len(PAIRS) >= 20 + len(REFUSED)
    assert all(p.aux.strip() not in ("def aux(x):\n    return x",) for p in PAIRS)


@pytest.mark.parametrize(
    "pair",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=REFUSED[p.task]))
        if p.task in REFUSED
        else p
        for p in PAIRS
    ],
    ids=[f"{p.task}-{p.work.split(' (')[0].replace(' ', '_')}" for p in PAIRS],
)
def test_an_honest_pair_whose_main_needs_the_helper_earns_the_bonus(judged, pair):
    value, passed, levels = judged[pair.task]
    assert passed == 1.0, "the pair must be a correct solution"
    assert value == pytest.approx(GENUINE), levels
