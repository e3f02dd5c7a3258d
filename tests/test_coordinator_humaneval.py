"""The coordinator's HumanEval example: the reviser's prompt and the shared reward of a revision."""

import pytest

from comlrl_lightning.coding.code_text import clean_completion
from comlrl_lightning.coding.reward import load_humaneval_rows
from comlrl_lightning.coordinator.humaneval import (
    HumanEvalEpisodes,
    ProposerPrompt,
    ReviserPrompt,
    RevisionReward,
)
from comlrl_lightning.envs.base import Episode

ROW = load_humaneval_rows()[0]
SOLUTION = ROW["prompt"] + ROW["canonical_solution"]
BROKEN = "def ("


def test_the_reviser_sees_the_problem_and_the_proposers_cleaned_draft():
    draft = "Sure! Here it is:\n```python\ndef f(x):\n    return x\n```\nHope it helps."
    prompt = ReviserPrompt()(ROW, {"proposer": draft})
    assert f"Draft:\n```python\n{clean_completion(draft)}\n```" in prompt
    assert "Hope it helps" not in prompt and ROW["entry_point"] in prompt
    assert ROW["prompt"].strip("\n") in ProposerPrompt()(ROW, {})
    with pytest.raises(KeyError, match="no response of 'proposer'"):
        ReviserPrompt()(ROW, {})


def test_revision_reward_pays_for_the_revision_and_logs_the_draft():
    reward = RevisionReward(syntax_weight=0.5)
    ep = Episode(0, ROW)
    out = reward([[BROKEN, SOLUTION], [SOLUTION, BROKEN]], [ep, ep], 0)
    assert out.values == [1.5, 0.0]  # all tests pass + compiles; nothing
    assert out.metrics["pass_rate"] == [1.0, 0.0] and out.metrics["compiles"] == [1.0, 0.0]
    assert out.metrics["all_passed"] == [1.0, 0.0]
    assert out.metrics["draft_pass_rate"] == [0.0, 1.0]


def test_humaneval_episodes_use_the_fixed_split():
    train, val = HumanEvalEpisodes("train").episodes(), HumanEvalEpisodes("val").episodes()
    assert (len(train), len(val)) == (131, 33)
    assert not {e.data["task_id"] for e in train} & {e.data["task_id"] for e in val}
    assert len(HumanEvalEpisodes("train", max_samples=3).episodes()) == 3
    with pytest.raises(ValueError, match="episodes.split: got 'test'"):
        HumanEvalEpisodes("test")
