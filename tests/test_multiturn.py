"""Multi-turn fits on the tiny model: self-play by role, per-turn outputs, transition templates."""

import os
from pathlib import Path

import pytest
from experiments import experiment

from comlrl_lightning import MAGRPO
from comlrl_lightning.cli import main
from comlrl_lightning.datamodules import DecPOMDPDataModule
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.toy import TargetLengthReward, length_ratio_rows
from comlrl_lightning.envs.transitions import RolePromptTransition

ROOT = Path(__file__).resolve().parents[1]


def test_role_prompt_transition_formats_own_and_teammate_completions():
    tr = RolePromptTransition([["A saw: {teammates}", "B revises {completion} on {topic}"]])
    out = tr(Episode(0, {"topic": "owls"}), 0, [["p0"], ["p1"]], [["a-text"], ["b-text"]])
    assert out == ["A saw: [Agent 1] b-text", "B revises b-text on owls"]
    assert (
        tr(Episode(0, {"topic": "owls"}), 1, [["p0"], ["p1"]], [["a"], ["b"]]) is None
    )  # past the last turn


def test_two_turn_self_play_fit_reports_both_turns(trainer_factory):
    got = {}

    class Grab(__import__("lightning").pytorch.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            got.update(outputs)

    dm = DecPOMDPDataModule(length_ratio_rows(8), ["Note on {topic}:"], TargetLengthReward(8),
                            transition=RolePromptTransition(["Revise {completion}:"]), batch_size=2)  # fmt: skip
    model = MAGRPO(
        agents="builtin:tiny-gpt2",
        num_agents=1,
        num_turns=2,
        num_generations=2,
        max_new_tokens=8,
        discount=0.5,
    )
    trainer_factory(max_steps=2, callbacks=[Grab()]).fit(model, dm)
    assert len(got["turn_rewards"]) == 2
    assert got["turn_rewards"][0].numel() == 2 * 2 and got["turn_rewards"][1].numel() == 2 * 2 * 2
    r0, r1 = got["turn_rewards"][0].view(2, 2), got["turn_rewards"][1].view(4, 2)
    assert got["turn_returns"][0].view(2, 2).flatten().tolist() == pytest.approx(
        (r0 + 0.5 * r1.mean(-1).view(2, 2)).flatten().tolist()
    )


def test_multi_turn_without_transition_is_a_config_error(trainer_factory):
    dm = DecPOMDPDataModule(length_ratio_rows(4), ["{topic}"], TargetLengthReward(8), batch_size=2)
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=1, num_turns=2, num_generations=2)
    with pytest.raises(ValueError, match="needs an env transition"):
        trainer_factory(max_steps=1).fit(model, dm)


def test_self_play_config_runs_from_the_cli(tmp_path):
    os.chdir(ROOT)
    main(["fit", *experiment("selfplay_grpo.yaml"), "--trainer.max_steps=2", "--trainer.enable_progress_bar=false",
          "--trainer.limit_val_batches=1", f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    assert list(tmp_path.rglob("events.out.tfevents.*"))
