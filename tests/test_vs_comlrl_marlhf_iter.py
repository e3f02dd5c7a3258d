"""Differential against CoMLRL 1.4.3 ``MARLHFIterTrainer`` (``trainers/preference/iterative.py``):
a round's pairs when they are ordered by the previous round's reward model
(``preference_scoring_reward: reward_model``), episode by episode, and the round's pair count.

CoMLRL's own code runs: ``_generate_preference_pairs_for_item`` of a ``MARLHFIterTrainer`` built with
``object.__new__`` (its ``__init__`` loads models), so its ``_preference_scoring_raw_and_processed_rewards``
→ ``_compute_reward_model_rewards`` → ``_format_joint_text`` → ``_score_reward_texts`` path scores the
candidates. Stand-ins: its two generation calls return fixed texts (the same texts go to ours), its
``reward_model`` is our tiny sequence classifier's logit (CoMLRL's ``JointRewardModel`` head has a bias
that cancels in every comparison; ``joint_reward_model.py``), its tokenizer is ours, right-padded
(CoMLRL's ``AutoTokenizer`` default for GPT-2), and ``_preference_tensors_from_text`` (tokenisation
only). Ours: :func:`~comlrl_lightning.preference.comparator.candidates.build_candidates` with the env whose reward
is the learned model (what ``MARLHFIter``'s build uses from round 1 on).

Differences: none on these inputs. Scores are compared to 1e-5 (CoMLRL scores the current and the
comparator candidates in two batches, as ours does, with its own padding call).
"""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import comlrl.trainers.preference.iterative as iterative  # the test extra installs comlrl 1.4.3
import pytest
import torch

from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.envs.reward_model import JOINT_RESPONSE_TEMPLATE, RewardModelReward
from comlrl_lightning.preference.comparator import ComparatorSample, build_candidates
from comlrl_lightning.preference.joint_reward_model import load_reward_backbone
from comlrl_lightning.team.agents import AgentSpec

TINY = "builtin:tiny-gpt2"
FORMATS = ["solve: {x}", "check: {x}"]


@pytest.fixture(scope="module")
def reward_net():
    torch.manual_seed(0)
    net, tok = load_reward_backbone(TINY)
    return net.eval(), tok


def _theirs(net, tok, cur, cmp, x, mode, k, kc, limit):
    t = object.__new__(iterative.MARLHFIterTrainer)
    t.args = SimpleNamespace(
        pair_selection=mode,
        preference_pairs_per_sample=limit,
        preference_num_candidates=k,
        comparator_num_candidates=kc,
        joint_mode="aligned",
        log_reward_distribution=False,
        preference_scoring_reward="reward_model",
        reward_max_length=None,
    )
    t.num_agents, t.reward_processor, t.agents = 2, lambda r: r, None
    t.formatters = [lambda item, f=f: f.format(**item) for f in FORMATS]
    t.reward_func = lambda *a, **kw: pytest.fail("CoMLRL scored with the task reward")
    right = copy.deepcopy(tok)
    right.padding_side = "right"
    t.reward_tokenizer, t.reward_device = right, torch.device("cpu")
    t.reward_model = lambda input_ids, attention_mask: net(
        input_ids=input_ids, attention_mask=attention_mask
    ).logits[:, 0]
    prompts = [f.format(x=x) for f in FORMATS]
    t._generate_policy_outputs_for_item = lambda agents, item, num_candidates, **kw: [
        {"prompts": [prompts[i]], "completions": [cur[i]]} for i in range(2)
    ]
    t._generate_comparator_outputs_for_item = lambda item, iteration_idx, num_candidates, **kw: [
        {"prompts": [prompts[i]], "completions": [cmp[i]]} for i in range(2)
    ]
    t._preference_tensors_from_text = lambda *args: None
    return t._generate_preference_pairs_for_item({"x": x}, iteration_idx=1)


def _ours(net, tok, cur, cmp, x, mode, k, kc, limit, rng):
    rm = RewardModelReward(TINY, kind="sequence_classification", template=JOINT_RESPONSE_TEMPLATE)
    rm._model, rm._tokenizer = net, tok
    env = DecPOMDP(FORMATS, rm)
    rm.observe = env.observe  # each agent's prompt, as MARLHF's reward model reads it
    comparator = SimpleNamespace(sample=lambda prompts, n, episodes=None: ComparatorSample(cmp, [True], n))
    team = SimpleNamespace(tokenizers=[None, None], specs=[AgentSpec("x")] * 2)
    team.generate = lambda rendered, kk: [SimpleNamespace(texts=list(cur[i])) for i in range(2)]
    return build_candidates(team, env, comparator, [Episode(0, {"x": x})], k, kc, mode, limit, rng).pairs


@pytest.mark.parametrize("mode", ["reward_gap", "all", "random", "comparator_reward"])
@pytest.mark.parametrize("k, kc, limit", [(4, 4, None), (3, 4, 2)])
def test_a_round_ordered_by_the_reward_model_equals_comlrls(reward_net, mode, k, kc, limit):
    """Six episodes (a round): per episode the same pairs in the same order, rewards the reward model's
    scores of CoMLRL's joint text; the round's pair count equal."""
    net, tok = reward_net
    ours_total = theirs_total = 0
    for episode in range(6):
        rng = random.Random(episode)
        words = ["ok", "yes", "no", "maybe", "sure thing", "x", "later"]
        cur = [[" ".join(rng.choices(words, k=rng.randint(1, 3))) for _ in range(k)] for _ in range(2)]
        cmp = [[" ".join(rng.choices(words, k=rng.randint(1, 3))) for _ in range(kc)] for _ in range(2)]
        x = f"task {episode}"
        random.seed(episode)
        expected = _theirs(net, tok, cur, cmp, x, mode, k, kc, limit)
        got = _ours(net, tok, cur, cmp, x, mode, k, kc, limit, random.Random(episode))
        assert [(p.chosen, p.rejected, p.prompts) for p in got] == [
            (p.winner_completions, p.loser_completions, p.prompts) for p in expected
        ], (episode, cur, cmp)
        for a, b in zip(got, expected):
            assert a.chosen_reward == pytest.approx(b.winner_reward, abs=1e-5)
            assert a.rejected_reward == pytest.approx(b.loser_reward, abs=1e-5)
        ours_total, theirs_total = ours_total + len(got), theirs_total + len(expected)
    assert ours_total == theirs_total >= 6  # pairs were formed and compared, not only empty lists
