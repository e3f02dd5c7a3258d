"""Config rules as a table against the config objects; aliases; flat (pre-grouping) arguments."""

import pytest

from comlrl_lightning import MAGRPO
from comlrl_lightning.core.config import (
    AdvantageConfig,
    LossConfig,
    PlacementConfig,
    RolloutConfig,
    SamplingConfig,
)  # fmt: skip
from comlrl_lightning.core.deprecations import group_flat_kwargs

BAD = [  # (config class, fields, the field the error must name)
    (RolloutConfig, dict(num_generations=1), "num_generations"),
    (RolloutConfig, dict(num_turns=0), "num_turns"),
    (RolloutConfig, dict(joint_mode="diagonal"), "joint_mode"),
    (RolloutConfig, dict(discount=1.5), "discount"),
    (AdvantageConfig, dict(advantage_mode="median"), "advantage_mode"),
    (RolloutConfig, dict(credit="difference"), "credit"),
    (RolloutConfig, dict(credit="counterfactual", joint_mode="cross"), "credit"),
    (AdvantageConfig, dict(scale_rewards="global"), "scale_rewards"),
    (AdvantageConfig, dict(advantage_eps=1e-6), "advantage_eps"),
    (LossConfig, dict(loss_type="mean"), "loss_type"),
    (LossConfig, dict(num_iterations=0), "num_iterations"),
    (LossConfig, dict(epsilon=0.0), "epsilon"),
    (LossConfig, dict(beta=-0.1), "beta"),
    (LossConfig, dict(delta=1.1, epsilon=0.2), "delta"),
    (LossConfig, dict(epsilon=0.2, epsilon_high=0.1), "epsilon_high"),
    (LossConfig, dict(importance_sampling_level="group"), "importance_sampling_level"),
    (LossConfig, dict(kl_mode="advantage"), "kl_mode"),
    (LossConfig, dict(micro_batch_size=0), "micro_batch_size"),
    (SamplingConfig, dict(temperature=0.0), "temperature"),
    (SamplingConfig, dict(top_p=0.0), "top_p"),
    (SamplingConfig, dict(max_new_tokens=0), "max_new_tokens"),
    (SamplingConfig, dict(max_new_tokens=32, max_completion_length=16), "max_completion_length"),
    (PlacementConfig, dict(parallel_training="ddp"), "parallel_training"),
]


@pytest.mark.parametrize("cls,kwargs,field", BAD, ids=[f"{c.__name__}-{f}" for c, _, f in BAD])
def test_bad_config_value_names_its_field_and_the_value(cls, kwargs, field):
    with pytest.raises(ValueError, match=field) as info:
        cls(**kwargs)
    assert repr(next(iter(kwargs.values()))) in str(info.value) or "must be" in str(info.value)


@pytest.mark.parametrize("kwargs,field", [
    (dict(agents=[{"model": "builtin:tiny-gpt2", "dtype": "fp8"}] * 2), r"agents\[0\].dtype"),
    (dict(agents=["builtin:nope", "builtin:tiny-gpt2"]), r"agents\[0\].model"),
    (dict(rollout=RolloutConfig(num_generations=8, num_turns=3, joint_mode="cross")), "max_generations_per_episode"),
    (dict(placement=PlacementConfig(parallel_training="mp")), "agent_devices"),
    (dict(num_agents=3, rollout=RolloutConfig(num_generations=8, num_turns=3, credit="cross_rewards")),
     "max_reward_calls_per_episode=16384"),
    (dict(learning_rate=0.0), "learning_rate"),
])  # fmt: skip
def test_module_level_rules_raise_at_construction(kwargs, field):
    args = dict(agents="builtin:tiny-gpt2", num_agents=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        MAGRPO(**args)  # construction never loads a model: loading happens in configure_model


def test_aliases_normalise_to_one_canonical_value():
    assert RolloutConfig(joint_mode="crossed").joint_mode == "cross"
    assert AdvantageConfig(scale_rewards=False).scale_rewards == "none"
    assert AdvantageConfig(scale_rewards=True).scale_rewards == "group"
    assert LossConfig(loss_type="token_mean").loss_type == "dapo"
    assert LossConfig(loss_type="sequence_mean").loss_type == "grpo"
    assert SamplingConfig(max_completion_length=16).max_new_tokens == 16


def test_derived_quantities_are_methods_of_the_config():
    assert RolloutConfig(num_generations=4).generations_per_episode(2) == 8
    assert RolloutConfig(num_generations=2, num_turns=2).generations_per_episode(2) == 2 * 2 * (1 + 2)
    assert RolloutConfig(num_generations=2, num_turns=2, joint_mode="cross").generations_per_episode(
        2
    ) == 2 * 2 * (1 + 4)
    assert LossConfig(num_iterations=3).max_steps_for(num_batches=5, num_agents=2) == 30
    assert LossConfig(epsilon=0.2).clip_high == 0.2 and LossConfig(epsilon_high=0.28).clip_high == 0.28
    # reward calls: counterfactual N=3, K=3 scores 3 + 3*3*2 = 21 joint actions per node, one node per turn 0
    assert RolloutConfig(num_generations=3, credit="counterfactual").reward_calls_per_episode(3) == 21
    assert RolloutConfig(num_generations=2, num_turns=2, joint_mode="cross").reward_calls_per_episode(
        2
    ) == 4 * (1 + 4)


def test_flat_arguments_go_to_their_group_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="scale_advantages"):
        groups = group_flat_kwargs(
            dict(num_generations=3, scale_advantages="none", loss_aggregation="token_mean"), {}
        )
    assert groups["rollout"].num_generations == 3
    assert groups["advantage"].scale_rewards == "none"
    assert groups["loss"].loss_type == "dapo"
    with pytest.raises(TypeError, match="num_generation"):
        group_flat_kwargs(dict(num_generation=3), {})
    with pytest.raises(ValueError, match="rollout"):
        group_flat_kwargs(dict(num_turns=2), dict(rollout=RolloutConfig(num_generations=3)))


def test_hparams_hold_plain_dicts_that_rebuild_the_same_module():
    model = MAGRPO(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        rollout=RolloutConfig(num_generations=3, joint_mode="crossed"),
    )
    assert model.hparams.rollout["joint_mode"] == "cross"
    again = MAGRPO(**{k: v for k, v in model.hparams.items()})
    assert again.rollout_config == model.rollout_config and again.loss == model.loss


def test_aliases_fill_in_their_baseline_and_refuse_a_different_explicit_one():
    from comlrl_lightning import MAREINFORCE, MARLOO, AdvantageConfig

    model = MAREINFORCE(agents="builtin:tiny-gpt2", advantage=AdvantageConfig(scale_rewards="none"))
    assert model.advantage.advantage_mode == "raw" and model.advantage.scale_rewards == "none"
    with pytest.raises(
        ValueError, match=r"advantage_mode: got 'max', but MAREINFORCE is MAGRPO with advantage_mode='raw'"
    ):
        MAREINFORCE(agents="builtin:tiny-gpt2", advantage=AdvantageConfig(advantage_mode="max"))
    # an explicit 'mean' was silently replaced by the alias's rloo before
    with pytest.raises(ValueError, match=r"got 'mean', but MARLOO .*'rloo'"):
        MARLOO(agents="builtin:tiny-gpt2", advantage={"advantage_mode": "mean"})
    # the alias's own value, and its saved hparams, are accepted back
    loo = MARLOO(agents="builtin:tiny-gpt2", advantage={"advantage_mode": "rloo"})
    assert MARLOO(**dict(loo.hparams)).advantage.advantage_mode == "rloo"
    assert MAGRPO(agents="builtin:tiny-gpt2").advantage.advantage_mode == "mean"
    assert (
        MAGRPO(agents="builtin:tiny-gpt2", advantage={"advantage_mode": "max"}).advantage.advantage_mode
        == "max"
    )


def test_default_groups_are_copied_so_one_module_cannot_change_another():
    a, b = MAGRPO(agents="builtin:tiny-gpt2"), MAGRPO(agents="builtin:tiny-gpt2")
    a.loss.beta = 0.5
    assert b.loss.beta == 0.0 and LossConfig().beta == 0.0


def test_an_alias_config_from_the_cli_leaves_the_baseline_unset_and_re_runs(tmp_path, capsys):
    """The config LightningCLI saves for an alias must rebuild the alias (it used to dump the field's
    default ``advantage_mode: mean``, which the alias then silently replaced)."""
    import os
    from pathlib import Path

    import yaml
    from experiments import experiment

    from comlrl_lightning import MARLOO
    from comlrl_lightning.cli import main

    os.chdir(Path(__file__).resolve().parents[1])  # configs use paths relative to the repository root

    def print_config(*args):
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", *args, "--print_config"])
        assert exit_info.value.code == 0
        return capsys.readouterr().out

    saved = tmp_path / "config.yaml"
    saved.write_text(print_config(*experiment("toy_grpo.yaml"), "--model.class_path=comlrl_lightning.MARLOO"))
    init = yaml.safe_load(print_config("--config", str(saved)))["model"]["init_args"]
    assert init["advantage"]["advantage_mode"] is None
    again = MARLOO(**{k: v for k, v in init.items() if k not in ("optimizer", "scheduler")})
    assert again.advantage.advantage_mode == "rloo"


def test_epsilon_high_below_epsilon_is_refused_naming_both():
    # it would clip the positive side below 1 + epsilon
    with pytest.raises(ValueError, match=r"^epsilon_high: got 0.1, must be >= epsilon = 0.2 or None"):
        LossConfig(epsilon=0.2, epsilon_high=0.1)
    assert LossConfig(epsilon=0.2, epsilon_high=0.2).clip_high == 0.2


def test_explicit_raw_with_group_scaling_warns_naming_both_fields(recwarn):
    with pytest.warns(UserWarning, match=r"advantage_mode='raw' with scale_rewards='group'.*advantage_eps"):
        AdvantageConfig(advantage_mode="raw", scale_rewards="group")
    with pytest.warns(UserWarning, match=r"advantage_mode='raw' with scale_rewards='group'"):
        MAGRPO(
            agents="builtin:tiny-gpt2",
            num_agents=2,
            advantage=dict(advantage_mode="raw", scale_rewards="group"),
        )
    AdvantageConfig(advantage_mode="raw")  # raw's own default (none) and a baseline with group: silent
    AdvantageConfig(advantage_mode="mean", scale_rewards="group")
    assert not [w for w in recwarn if "advantage_mode='raw'" in str(w.message)]


def test_bnpo_with_micro_batches_warns_that_the_gradient_depends_on_micro_batch_size(recwarn):
    with pytest.warns(UserWarning, match=r"loss_type='bnpo' with micro_batch_size=2.*gradient"):
        LossConfig(loss_type="bnpo", micro_batch_size=2)
    LossConfig(loss_type="bnpo")
    LossConfig(loss_type="dapo", micro_batch_size=2)
    assert not [w for w in recwarn if "bnpo" in str(w.message)]
