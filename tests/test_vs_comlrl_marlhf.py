"""Differential against CoMLRL 1.4.3's MARLHF reward model (``comlrl/trainers/preference/marlhf.py``).

CoMLRL's own code is called: ``JointRewardModel.forward`` (the scalar head on the last non-pad
token), and on an ``object.__new__`` ``MARLHFTrainer`` with the attributes they read (its
``__init__`` loads models) ``_format_joint_text`` / ``_format_joint_reward_text`` (the joint text),
``_score_reward_texts`` (tokenise and score) and ``_train_reward_model`` (the Bradley–Terry loss and
its update). ``_train_reward_model`` computes the loss inline and returns nothing, so the loss is
compared through its gradient on fixed scores (a model whose output is one parameter per text).

Differences, each with its cause (asserted below where they show in numbers):

1. The head's bias: CoMLRL's ``reward_head`` is ``Linear(h, 1)``; ours is the HF sequence
   classifier's bias-free ``score``. The Bradley–Terry gradient of a bias is 0, so CoMLRL's bias
   keeps its random initial value and every raw reward is shifted by it: ours = CoMLRL's − bias.
   Same loss, same gradients of every other weight, same preferences.
2. The last non-pad token: CoMLRL takes the last position whose attention mask is 1; the HF head
   takes the rightmost token that is not the pad id. They agree unless a text ends in the pad token
   itself (pad = EOS and a text ending in the EOS string): then HF reads the token before it.
3. Text: identical for CoMLRL's template (:data:`JOINT_RESPONSE_TEMPLATE`, the default); ours is a
   ``str.format`` template that may also use the episode's fields. CoMLRL truncates from the
   tokenizer's side; ours keeps the first ``reward_max_length`` tokens (right truncation).
4. Held-out pairs, skipped non-finite steps, a saved HF folder and resumable state: CoMLRL has none
   (it trains on every pair and steps whatever the loss).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

pytest.importorskip("comlrl")

from comlrl.trainers.preference.madpo import PreferencePair as ComlrlPair  # noqa: E402
from comlrl.trainers.preference.marlhf import JointRewardModel, MARLHFTrainer  # noqa: E402

from comlrl_lightning.envs.base import Episode  # noqa: E402
from comlrl_lightning.envs.reward_model import (  # noqa: E402
    JOINT_RESPONSE_TEMPLATE,
    RewardModelReward,
    sequence_logits,
)
from comlrl_lightning.preference.joint_reward_model import bradley_terry_loss  # noqa: E402
from comlrl_lightning.team.agents import AgentSpec, load_agent  # noqa: E402

PROMPTS = [
    ["Write a helper for:\nadd(a, b)", "Write add(a, b) using aux"],
    ["note on cats", "longer note on cats"],
]
CHOSEN = [["def aux(a, b):\n    return a + b", "def add(a, b):\n    return aux(a, b)"], ["cats", "cats purr"]]
REJECTED = [["pass", "def add(a, b): pass"], ["", "dogs"]]


def trainer(**attrs):
    t = object.__new__(MARLHFTrainer)
    t.num_agents, t.verbose, t.reward_device = 2, False, torch.device("cpu")
    for k, v in attrs.items():
        setattr(t, k, v)
    return t


def comlrl_pair(prompts, chosen, rejected):
    return ComlrlPair(
        prompts,
        chosen,
        rejected,
        agent_tensors=[],
        winner_reward=1.0,
        loser_reward=0.0,
        candidate_reward_mean=0.5,
    )


def ours(prompts, completions):
    rm = RewardModelReward("builtin:tiny-gpt2", template=JOINT_RESPONSE_TEMPLATE)
    return rm.render(completions, Episode(0, {}), 0, prompts)


def test_joint_text_equals_comlrls():
    t = trainer()
    for prompts, chosen, rejected in zip(PROMPTS, CHOSEN, REJECTED):
        assert ours(prompts, chosen) == t._format_joint_text(prompts, chosen)
        pair = comlrl_pair(prompts, chosen, rejected)
        assert ours(prompts, rejected) == t._format_joint_reward_text(pair, use_winner=False)
        assert ours(prompts, chosen) == t._format_joint_reward_text(pair, use_winner=True)


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    model, tok = load_agent(AgentSpec("builtin:tiny-gpt2"))
    return model.eval(), tok


def our_classifier(backbone_model, tok, head: nn.Linear):
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(backbone_model.config)
    config.num_labels, config.pad_token_id = 1, tok.pad_token_id
    model = AutoModelForSequenceClassification.from_config(config)
    model.base_model.load_state_dict(backbone_model.base_model.state_dict())
    with torch.no_grad():
        model.score.weight.copy_(head.weight)
    return model.eval()


def test_scores_at_the_last_non_pad_token_equal_comlrls_less_its_bias(backbone):
    model, tok = backbone
    theirs_model = JointRewardModel(copy.deepcopy(model)).eval()
    ours_model = our_classifier(model, tok, theirs_model.reward_head)
    texts = [ours(p, c) for p, c in zip(PROMPTS + PROMPTS, CHOSEN + REJECTED)]  # lengths differ: padding
    t = trainer(reward_model=theirs_model, reward_tokenizer=tok, args=SimpleNamespace(reward_max_length=None))
    with torch.no_grad():
        theirs = t._score_reward_texts(texts)
        mine = sequence_logits(ours_model, tok, texts, None, torch.device("cpu"))[:, 0]
    bias = theirs_model.reward_head.bias.item()
    assert bias != 0.0
    assert torch.allclose(mine + bias, theirs, atol=1e-5)  # difference 1: the bias, nothing else
    assert torch.equal(torch.argsort(mine), torch.argsort(theirs))


def test_a_sequence_ending_in_the_pad_token_is_read_one_token_earlier_by_the_hf_head(backbone):
    model, tok = backbone
    theirs_model = JointRewardModel(copy.deepcopy(model)).eval()
    ours_model = our_classifier(model, tok, theirs_model.reward_head)
    bias = theirs_model.reward_head.bias.item()
    short = torch.tensor([tok("agent text")["input_ids"]])
    ending_in_pad = torch.cat(
        [short, torch.tensor([[tok.pad_token_id]])], 1
    )  # e.g. pad = EOS, text ends in EOS
    with torch.no_grad():
        theirs = [theirs_model(ids, torch.ones_like(ids)).item() for ids in (short, ending_in_pad)]
        mine = [
            ours_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.item()
            for ids in (short, ending_in_pad)
        ]
    assert mine[1] == pytest.approx(mine[0], abs=1e-6)  # HF: the token before the pad (causal: same state)
    assert mine[0] + bias == pytest.approx(theirs[0], abs=1e-5)
    assert abs(theirs[1] - theirs[0]) > 1e-4  # CoMLRL: the pad token itself (difference 2)


class FixedScores(nn.Module):
    """A "reward model" whose score of text ``j`` is the parameter ``s[j]`` (input id ``j``)."""

    def __init__(self, scores):
        super().__init__()
        self.s = nn.Parameter(torch.tensor(scores))

    def forward(self, input_ids, attention_mask):
        return self.s[input_ids[:, 0]]


class TextIds:
    """A tokenizer giving each known text its index as its one token."""

    def __init__(self, texts):
        self.index = {t: i for i, t in enumerate(texts)}

    def __call__(self, texts, **kw):
        ids = torch.tensor([[self.index[t]] for t in texts])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bradley_terry_gradient_on_fixed_scores_equals_comlrls(seed):
    g = torch.Generator().manual_seed(seed)
    n = 5
    pairs = [comlrl_pair([f"p{i}", f"q{i}"], [f"w{i}", "a"], [f"l{i}", "b"]) for i in range(n)]
    t = trainer()
    texts = [t._format_joint_reward_text(p, use_winner=w) for w in (True, False) for p in pairs]
    scores = (torch.randn(2 * n, generator=g) * 3).tolist()
    model = FixedScores(scores)
    t.reward_model, t.reward_tokenizer = model, TextIds(texts)
    t.reward_optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # keeps the scores; the gradient stays
    t.args = SimpleNamespace(reward_train_batch_size=n, reward_num_train_epochs=1, reward_max_length=None)
    t._train_reward_model(pairs)  # one batch of every pair (the order does not change a mean's gradient)
    theirs = model.s.grad.clone()
    s = torch.tensor(scores, requires_grad=True)
    bradley_terry_loss(s[:n], s[n:]).backward()
    assert torch.allclose(s.grad, theirs, atol=1e-7)


def test_comlrls_head_bias_gets_no_gradient_and_keeps_its_initial_value(backbone):
    model, tok = backbone
    theirs_model = JointRewardModel(copy.deepcopy(model))
    bias0, weight0 = (
        theirs_model.reward_head.bias.detach().clone(),
        theirs_model.reward_head.weight.detach().clone(),
    )
    pairs = [comlrl_pair(p, c, r) for p, c, r in zip(PROMPTS, CHOSEN, REJECTED)]
    t = trainer(
        reward_model=theirs_model,
        reward_tokenizer=tok,
        reward_optimizer=torch.optim.SGD(theirs_model.parameters(), lr=0.5),
        args=SimpleNamespace(reward_train_batch_size=2, reward_num_train_epochs=2, reward_max_length=None),
    )
    t._train_reward_model(pairs)
    assert torch.equal(theirs_model.reward_head.bias, bias0)  # difference 1: a constant shift forever
    assert not torch.equal(theirs_model.reward_head.weight, weight0)
