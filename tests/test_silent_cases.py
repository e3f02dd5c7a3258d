"""Cases that were silent: each ends in a clear error naming what is wrong, or a line
saying what is applied."""

import json
import logging
import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from conftest import tiny_cli_config, tiny_trainer
from experiments import experiment
from test_marlhf import marlhf
from test_resume_config import CLI, cli_checkpoint  # noqa: F401, F811 - a fixture

from comlrl_lightning import MAGRPO
from comlrl_lightning.cli import main
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import RewardError, WeightedReward
from comlrl_lightning.infra.resume_config import ResumeConfigError
from comlrl_lightning.infra.sharded import ShardedTeamStrategy
from comlrl_lightning.tasks.toy.env import LengthRatioReward
from comlrl_lightning.team.team import Team

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ what a reward returns
def per_agent_credit(joint_actions, episodes, turn):
    """Agent i's reward is the length of its own completion: one row per joint action."""
    return [[float(len(text)) for text in joint_action] for joint_action in joint_actions]


def per_agent_credit_transposed(joint_actions, episodes, turn):
    """The same rewards, one row per agent: the shape a [J, N] check cannot tell apart when J = N."""
    return [list(column) for column in zip(*per_agent_credit(joint_actions, episodes, turn))]


SQUARE = [["a", "bbb"], ["cc", "d"]]  # 2 joint actions of 2 agents
EPISODES = [Episode(0, {"prompt": "p"})] * 2


def test_a_per_agent_reward_written_transposed_is_refused_even_when_the_shape_is_square():
    assert WeightedReward([per_agent_credit])(SQUARE, EPISODES, 0).total.tolist() == [[1.0, 3.0], [2.0, 1.0]]
    with pytest.raises(RewardError, match=r"'per_agent_credit_transposed' failed.*one row per agent"):
        WeightedReward([per_agent_credit_transposed])(SQUARE, EPISODES, 0)


def test_a_reward_returning_a_tensor_is_refused_naming_the_function():
    def tensor_reward(joint_actions, episodes, turn):
        return torch.ones(len(joint_actions), requires_grad=True)

    with pytest.raises(RewardError, match=r"'tensor_reward' failed.*returned a torch.Tensor.*tolist\(\)"):
        WeightedReward([tensor_reward])(SQUARE, EPISODES, 0)


# ------------------------------------------------------------------ the data module
def test_a_val_batch_size_of_zero_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"data.val_batch_size: got 0, must be >= 1 or None"):
        DecPOMDPDataModule([{"prompt": "p"}], ["{prompt}"], reward=LengthRatioReward(), val_batch_size=0)
    assert (
        DecPOMDPDataModule([{"prompt": "p"}], ["{prompt}"], LengthRatioReward(), batch_size=3).val_batch_size
        == 3
    )


def test_a_data_file_edited_in_place_before_a_resume_is_said(tmp_path, lightning_log):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    first = DecPOMDPDataModule(str(data), ["{prompt}"], LengthRatioReward())
    first.setup("fit")
    saved = first.state_dict()  # what a checkpoint holds of the data module
    same = DecPOMDPDataModule(str(data), ["{prompt}"], LengthRatioReward())
    with lightning_log.at_level(logging.INFO):
        same.load_state_dict(saved)
    assert "resume:" not in lightning_log.text
    data.write_text('{"prompt": "a"}\n{"prompt": "c"}\n')  # same path, other rows
    edited = DecPOMDPDataModule(str(data), ["{prompt}"], LengthRatioReward())
    edited.setup("fit")
    with lightning_log.at_level(logging.INFO):
        edited.load_state_dict(saved)
    assert (
        f"resume: data.dataset: the content of '{data}' differs from the checkpoint's (sha256:"
        in lightning_log.text
    )
    assert "(applied: its rows now run" in lightning_log.text


# ------------------------------------------------------------------ a resumed CLI fit
# CLI and the cli_checkpoint fixture (two steps of the toy config, its last.ckpt): tests/test_resume_config.py


def test_another_seed_on_resume_is_said_not_applied(cli_checkpoint, tmp_path, capsys):  # noqa: F811
    os.chdir(ROOT)
    main(["fit", *experiment("toy_length_ratio.yaml"), *CLI, f"--trainer.default_root_dir={tmp_path}",
          f"--ckpt_path={cli_checkpoint}", "--seed_everything=7"])  # fmt: skip
    err = capsys.readouterr().err
    assert "resume: seed_everything: checkpoint 0, given 7 (not applied: the run continues from the " in err


# ------------------------------------------------------------------ fsdp2 checkpoint folders
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded before the config check")

    monkeypatch.setattr(Team, "load", refuse)


def _end_one_process_group(env: dict[str, str]) -> None:
    """After an fsdp2 fit in this process: the environment as it was (Lightning set _DIST_ENV for its
    one-process group) and no process group left, which would make every later fit of the test run
    distributed (Lightning then warns that epoch-level logs are not synced)."""
    for key in _DIST_ENV:
        os.environ.pop(key, None)
    os.environ.update(env)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def fsdp2_folder(tmp_path_factory):
    """A sharded checkpoint folder (meta.pt, shard files, sharding.json) of a 2-step fsdp2 fit on one
    process: the tiny CLI config (2 agents, num_generations 2)."""
    root = tmp_path_factory.mktemp("fsdp2_folder")
    saver = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
             "init_args": {"dirpath": str(root / "ckpt"), "save_last": True, "save_top_k": 0}}  # fmt: skip
    config = tiny_cli_config(root, "fsdp2", devices=1, enable_checkpointing=True, callbacks=[saver])
    env = {k: os.environ.pop(k) for k in [*_DIST_ENV] if k in os.environ}
    try:
        main(["fit", "--config", config, "--save_on_interrupt=false"])
    finally:
        _end_one_process_group(env)
    folder = root / "ckpt" / "last.ckpt"
    assert (folder / "meta.pt").is_file() and (folder / "sharding.json").is_file()
    return root, folder


_DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "RANK")


@pytest.mark.parametrize(
    ("strategy", "extra", "named"),
    [
        ("fsdp2", ["--model.init_args.rollout.num_generations=4"],
         "model.rollout.num_generations: checkpoint 2, given 4"),
        ("fsdp2", ["--model.init_args.agents=[{model: builtin:tiny-gpt2}, {model: builtin:smollm2-135m-instruct}]"],
         "model.agents.1.model: checkpoint 'builtin:tiny-gpt2', given 'builtin:smollm2-135m-instruct'"),
        ("auto", [], "a sharded checkpoint folder (written under trainer.strategy 'fsdp2'), given to a run of "
                     "another strategy"),
    ],
    ids=["num_generations", "agent-model", "folder-to-a-plain-run"],
)  # fmt: skip
def test_an_fsdp2_checkpoint_folder_gets_the_checks_of_a_file_before_any_model_loads(
    fsdp2_folder, tmp_path, monkeypatch, capsys, strategy, extra, named
):
    _, folder = fsdp2_folder
    no_model_loads(monkeypatch)
    config = tiny_cli_config(tmp_path, strategy, devices=1)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, f"--ckpt_path={folder}", *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") <= 4  # the refusal's lines, no traceback


def test_an_fsdp2_folder_resumed_from_python_is_refused_before_its_shards_load(fsdp2_folder, monkeypatch):
    from lightning.pytorch.strategies import ModelParallelStrategy

    _, folder = fsdp2_folder
    monkeypatch.setattr(
        ModelParallelStrategy, "load_checkpoint", lambda *a, **k: pytest.fail("shards loaded")
    )
    strategy = ShardedTeamStrategy()
    strategy._lightning_module = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=4)
    with pytest.raises(ResumeConfigError, match=r"model.rollout.num_generations: checkpoint 2, given 4"):
        strategy.load_checkpoint(folder)


# ------------------------------------------------------------------ MARLHF's reward-model folder
def marlhf_fit(tmp_path, seed_everything=0, **data_kw):
    """Seeded: MARLHF (pairs built from 4 prompts of the toy task) for one RL batch, its reward model
    kept in ``tmp_path / "rm"``."""
    pl.seed_everything(seed_everything, verbose=False)
    module = marlhf(tmp_path, epochs=1)
    data = LengthRatioDataModule(**{"num_train": 8, "num_val": 2, "batch_size": 2, "seed": 0, **data_kw})
    tiny_trainer(max_steps=MAGRPO.max_steps_for(1, 2)).fit(module, data)
    return module


@pytest.fixture(scope="module")
def finished_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("marlhf_folder")
    marlhf_fit(root)
    return root


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"lo": 1.0}, "task_reward.functions.0.settings.lo: folder 2.0, given 1.0"),
        ({"seed": 1}, "seed: folder 0, given 1"),
        ({"data_seed": 1}, "prompts: folder 'sha256:"),
    ],
    ids=["task-reward", "seed", "prompts"],
)
def test_a_finished_reward_model_is_not_reused_for_another_task_reward_seed_or_prompts(
    finished_folder, change, named
):
    data_kw = (
        {"lo": change["lo"]}
        if "lo" in change
        else {"seed": change["data_seed"]}
        if "data_seed" in change
        else {}
    )
    with pytest.raises(ValueError, match="reward_model.reward_model_dir") as err:
        marlhf_fit(finished_folder, seed_everything=change.get("seed", 0), **data_kw)
    assert named in str(err.value) and "a finished reward model" in str(err.value)


def test_a_finished_reward_model_reused_for_its_own_recipe_says_so(finished_folder, lightning_log):
    with lightning_log.at_level(logging.INFO):
        module = marlhf_fit(finished_folder)
    assert (
        f"reward_model.reward_model_dir: '{finished_folder / 'rm'}' holds a finished reward model made "
        in (lightning_log.text)
    )
    recipe = json.loads((finished_folder / "rm" / "marlhf.json").read_text())["recipe"]
    assert recipe["seed"] == 0 and recipe["prompts"].startswith("sha256:")
    assert recipe["task_reward"]["functions"] == [
        {"name": "comlrl_lightning.tasks.toy.env.LengthRatioReward", "settings": {"hi": 3.0, "lo": 2.0}}
    ]
    assert module.reward_info["recipe"] == recipe


# ------------------------------------------------------------------ MADPO's online mode
def test_online_mode_says_once_that_it_ignores_num_train_epochs(recwarn):
    from comlrl_lightning import MADPO
    from comlrl_lightning.preference.dpo import DPOConfig

    given = DPOConfig(preference_mode="online", num_train_epochs=7)  # as jsonargparse builds it
    MADPO(agents="builtin:tiny-gpt2", num_agents=2, dpo=given)  # the module copies it
    lines = [str(w.message) for w in recwarn if "dpo.num_train_epochs" in str(w.message)]
    assert lines == ["dpo.num_train_epochs: got 7, which preference_mode='online' ignores (each batch's pairs "
                     "are trained on in one update; it applies to 'one_shot')"]  # fmt: skip


def test_a_folder_of_an_earlier_version_is_used_with_a_line_naming_what_it_does_not_record(
    tmp_path, lightning_log
):
    from comlrl_lightning.preference.reward_model_folder import check_recipe

    recipe = {"source": "builtin:tiny-gpt2", "reward_model": {"reward_seed": 0}, "seed": 0, "prompts": "sha256:ab",
              "task_reward": {"functions": [{"name": "m.f"}], "weights": [1.0], "processor": None}}  # fmt: skip
    earlier = {k: v for k, v in recipe.items() if k not in ("seed", "prompts", "task_reward")}
    with lightning_log.at_level(logging.INFO):
        check_recipe(str(tmp_path), "a finished reward model", earlier, recipe)
    assert (
        "it does not record seed, prompts, task_reward (an earlier version): not compared: using it"
        in lightning_log.text
    )
    with pytest.raises(ValueError, match=r"reward_model.reward_seed: folder 1, given 0"):
        check_recipe(
            str(tmp_path), "a finished reward model", {**earlier, "reward_model": {"reward_seed": 1}}, recipe
        )


def test_use_checkpoint_config_reads_an_fsdp2_folders_config(fsdp2_folder, tmp_path, monkeypatch, capsys):
    class Built(Exception):
        pass

    def stop(*args, **kwargs):
        raise Built  # the config is parsed and said by now: no need to train

    _, folder = fsdp2_folder
    monkeypatch.setattr(Team, "load", stop)
    config = tiny_cli_config(tmp_path, "fsdp2", devices=1)
    env = {k: os.environ.pop(k) for k in _DIST_ENV if k in os.environ}
    try:
        with pytest.raises(Built):
            main(["fit", "--config", config, f"--ckpt_path={folder}", "--use_checkpoint_config=true",
                  "--model.init_args.rollout.num_generations=4"])  # fmt: skip
    finally:
        _end_one_process_group(env)
    err = capsys.readouterr().err
    assert "resume: model.rollout.num_generations: given 4 ignored, the checkpoint's 2 used" in err
