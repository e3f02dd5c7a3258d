"""Each enumerated knob is declared once (``core/choices.Choice``): the config's types, checks and
the generated lists in the docs all come from that declaration."""

import ast
import typing
from pathlib import Path

import pytest

from comlrl_lightning import choice_docs
from comlrl_lightning.core import choices
from comlrl_lightning.core.config import AdvantageConfig, LossConfig, RolloutConfig

DECLARED = {
    "joint_mode",
    "credit",
    "solved_return",
    "advantage_mode",
    "scale_rewards",
    "loss_type",
    "importance_sampling_level",
    "kl_mode",
    "on_nonfinite",
    "generation_backend",
    "adapter_rollouts",
    "TRLReward.agent",
    "parallel_training",
    "critic_type",
    "RewardModelReward.kind",
    "pair_selection",
    "preference.loss_type",
    "preference_mode",
    "collaboration_mode",
    "rl_algorithm",
    "comparator_policy",
    "comparator_generation_mode",
    "comparator_api_format",
    "comparator_on_error",
    "preference_scoring_reward",
    "preference_replay_mode",
    "cooperation_task",
}


def test_every_generated_list_in_the_docs_matches_its_declaration():
    stale = []
    for rel in choice_docs.DOCS:
        text = (choice_docs.ROOT / rel).read_text()
        if choice_docs.render(text) != text:
            stale.append(rel)
    assert not stale, f"run `python -m comlrl_lightning.choice_docs`: stale choice lists in {stale}"


def test_every_declared_choice_is_listed_in_both_docs():
    assert set(choices.REGISTRY) == DECLARED
    for rel in choice_docs.DOCS:
        text = (choice_docs.ROOT / rel).read_text()
        missing = [f for f in DECLARED if f"<!-- choices:{f} -->" not in text]
        assert not missing, f"{rel} lacks the lists of {missing}"


def test_render_rewrites_only_between_the_markers():
    text = "before\n<!-- choices:kl_mode -->\nstale\n<!-- /choices -->\nafter\n"
    out = choice_docs.render(text)
    assert out.startswith("before\n<!-- choices:kl_mode -->\n- `loss`: ") and out.endswith(
        "<!-- /choices -->\nafter\n"
    )
    assert "stale" not in out and "- `reward`: " in out


def test_the_config_literal_and_check_come_from_the_declaration():
    from comlrl_lightning.core.advantages import ADVANTAGE_MODE
    from comlrl_lightning.core.loss import LOSS_TYPE

    hints = typing.get_type_hints(LossConfig)
    assert typing.get_args(hints["loss_type"]) == (*LOSS_TYPE.values, *LOSS_TYPE.aliases)
    assert (
        typing.get_args(typing.get_type_hints(AdvantageConfig)["advantage_mode"])[0] == ADVANTAGE_MODE.literal
    )
    with pytest.raises(
        ValueError, match=r"advantage_mode: got 'median', allowed: \['mean', 'max', 'rloo', 'raw'"
    ):
        AdvantageConfig(advantage_mode="median")
    with pytest.raises(
        ValueError, match=r"joint_mode: got 'grid', allowed: \['aligned', 'cross', 'crossed'\]"
    ):
        RolloutConfig(joint_mode="grid")


def test_choice_docs_imports_exactly_the_modules_that_declare_a_choice():
    """``core/choices.py`` imports nothing upward; the docs generator's table is its list instead, so
    a module that declares a choice and is missing from the table fails here."""
    package = Path(choice_docs.__file__).parent
    declaring = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Choice" for n in ast.walk(tree)):
            parts = path.relative_to(package.parent).with_suffix("").parts
            declaring.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert {m.__name__ for m in choice_docs.DECLARING} == declaring
