"""MARLHF's reward-model folder is reused (finished, or mid-training) only for the config it records;
another config is refused naming each difference."""

import os

import pytest
import torch
from test_marlhf import fit, marlhf, separable_pairs

from comlrl_lightning.preference.pairs import write_pairs


def pair_file(tmp_path, name, n):
    path = tmp_path / name
    write_pairs(path, separable_pairs(n))
    return str(path)


def test_a_finished_folder_is_reused_for_its_own_config(trainer_factory, tmp_path):
    pairs = pair_file(tmp_path, "pairs.jsonl", 8)
    first = marlhf(tmp_path, epochs=1, pairs_path=pairs)
    fit(trainer_factory, first, 1)
    again = marlhf(tmp_path, epochs=1, pairs_path=pairs)
    again.after_reward_epoch = lambda epoch: pytest.fail("trained again instead of reusing the folder")
    fit(trainer_factory, again, 1)
    assert again.reward_info["history"] == first.reward_info["history"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"epochs": 2}, "reward_model.reward_num_train_epochs: folder 1, given 2"),
        ({"pairs": 12}, "pairs_sha256: folder '"),
    ],
    ids=["epochs", "other-pairs"],
)
def test_a_finished_folder_with_another_config_is_refused_naming_the_difference(
    trainer_factory, tmp_path, change, named
):
    fit(trainer_factory, marlhf(tmp_path, epochs=1, pairs_path=pair_file(tmp_path, "a.jsonl", 8)), 1)
    other = pair_file(tmp_path, "b.jsonl", change.get("pairs", 8))
    second = marlhf(tmp_path, epochs=change.get("epochs", 1), pairs_path=other)
    with pytest.raises(ValueError, match="reward_model.reward_model_dir") as err:
        fit(trainer_factory, second, 1)
    assert named in str(err.value) and "a finished reward model" in str(err.value)


def test_a_phase1_state_with_another_learning_rate_is_refused(trainer_factory, tmp_path):
    class Stop(Exception):
        pass

    def stop(epoch):
        raise Stop

    pairs = pair_file(tmp_path, "pairs.jsonl", 8)
    first = marlhf(tmp_path, epochs=2, pairs_path=pairs)
    first.after_reward_epoch = stop
    with pytest.raises(Stop):
        fit(trainer_factory, first, 1)
    assert os.path.exists(tmp_path / "rm" / "phase1_state.pt")
    second = marlhf(tmp_path, epochs=2, pairs_path=pairs)
    second.reward_config.reward_learning_rate = 5e-3
    with pytest.raises(ValueError, match=r"reward_model.reward_learning_rate: folder 0.001, given 0.005"):
        fit(trainer_factory, second, 1)
    assert torch.load(tmp_path / "rm" / "phase1_state.pt", weights_only=False)["epoch"] == 1  # left as it was
