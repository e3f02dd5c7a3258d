"""A resumed run's config against its checkpoint's: refused changes named before any model
loads, safe ones applied (a new learning rate reaches the optimizers), --use_checkpoint_config."""

import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from experiments import experiment
from lightning.pytorch.callbacks import ModelCheckpoint

from comlrl_lightning import MAGRPO
from comlrl_lightning.cli import main
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.infra.resume_config import (
    APPLY,
    REFUSE,
    ResumeConfigError,
    policy_of,
    resume_differences,
)
from comlrl_lightning.team.team import Team

ROOT = Path(__file__).resolve().parents[1]


def test_the_table_refuses_what_cannot_change_and_applies_step_sizes():
    assert policy_of("rollout.num_generations")[0] == REFUSE
    assert policy_of("agents.1.model")[0] == REFUSE
    assert policy_of("agents")[0] == REFUSE  # the team's size
    assert policy_of("rounds.num_rounds")[0] == REFUSE
    assert policy_of("comparator.comparator_policy")[0] == REFUSE
    assert policy_of("some_future_knob")[0] == REFUSE  # not listed: refused
    assert policy_of("comparator.comparator_api_timeout")[0] == APPLY
    assert policy_of("agents.1.device")[0] == APPLY
    assert policy_of("learning_rate")[0] == APPLY
    assert policy_of("agents.0.learning_rate")[0] == APPLY
    assert policy_of("rollout.num_generations_eval")[0] == APPLY


def test_differences_name_field_old_and_new_and_a_class_swap_alone():
    saved = {
        "_class_path": "comlrl_lightning.MADPO",
        "learning_rate": 1e-3,
        "rollout": {"num_generations": 4},
    }
    given = {**saved, "learning_rate": 0.05, "rollout": {"num_generations": 2}}
    diffs = {d.field: (d.saved, d.given, d.policy) for d in resume_differences(saved, given)}
    assert diffs == {"learning_rate": (1e-3, 0.05, APPLY), "rollout.num_generations": (4, 2, REFUSE)}
    swapped = resume_differences(saved, {**given, "_class_path": "comlrl_lightning.MAGRPO"})
    assert [(d.field, d.saved, d.given, d.policy) for d in swapped] == [
        ("class_path", "comlrl_lightning.MADPO", "comlrl_lightning.MAGRPO", REFUSE)
    ]
    newer = {**saved, "rollout": {"num_generations": 4, "a_field_added_later": 1}}
    assert resume_differences(saved, newer) == []  # a checkpoint of an earlier version still resumes
    older = resume_differences({**saved, "critic": {"critic_type": "v"}}, saved)  # another module's group
    assert [(d.field, d.given, d.policy) for d in older] == [("critic.critic_type", "<absent>", REFUSE)]
    team = resume_differences({"agents": [{"model": "a"}] * 2}, {"agents": [{"model": "a"}] * 3})
    assert [(d.field, d.saved, d.given) for d in team][0] == ("agents", 2, 3)


# ------------------------------------------------------------------ the CLI
CLI = ["--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=0", "--trainer.max_steps=2"]


@pytest.fixture(scope="module")
def cli_checkpoint(tmp_path_factory):
    """One batch of the toy config through the CLI, its last.ckpt."""
    root = tmp_path_factory.mktemp("cli_resume")
    os.chdir(ROOT)
    main(["fit", *experiment("toy_length_ratio.yaml"), *CLI, f"--trainer.default_root_dir={root}",
          "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
          f"--trainer.callbacks.dirpath={root}/ckpt", "--trainer.callbacks.save_last=true"])  # fmt: skip
    return root / "ckpt" / "last.ckpt"


def resume(ckpt, root, *extra):
    os.chdir(ROOT)
    main(["fit", *experiment("toy_length_ratio.yaml"), *CLI, "--trainer.max_steps=4",
          f"--trainer.default_root_dir={root}", f"--ckpt_path={ckpt}", *extra])  # fmt: skip


def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded before the config check")

    monkeypatch.setattr(Team, "load", refuse)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--model.init_args.rollout.num_generations=2"], "model.rollout.num_generations: checkpoint 4, given 2"),
        (["--model=comlrl_lightning.IAC"], "model.class_path: checkpoint 'comlrl_lightning.MAGRPO', given "
                                           "'comlrl_lightning.IAC'"),
        (["--model.init_args.agents=[{model: builtin:tiny-gpt2}]"], "model.agents: checkpoint 2, given 1"),
    ],
    ids=["num_generations", "class-swap", "team-shape"],
)  # fmt: skip
def test_a_refused_change_on_resume_ends_before_any_model_loads_naming_it(
    cli_checkpoint, tmp_path, monkeypatch, capsys, extra, named
):
    no_model_loads(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        resume(cli_checkpoint, tmp_path, *extra)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "--use_checkpoint_config true" in err


def test_a_changed_learning_rate_trainer_limit_and_batch_size_are_applied_and_said(
    cli_checkpoint, tmp_path, capsys
):
    resume(cli_checkpoint, tmp_path, "--model.init_args.learning_rate=0.05", "--data.init_args.batch_size=2")
    err = capsys.readouterr().err
    assert "resume: model.learning_rate: checkpoint 0.001, given 0.05 (applied" in err
    assert "resume: trainer.max_steps: checkpoint 2, given 4 (applied: the given trainer runs)" in err
    assert "resume: data.init_args.batch_size: checkpoint 4, given 2 (applied" in err
    hparams = yaml.safe_load(next(tmp_path.rglob("hparams.yaml")).read_text())
    assert hparams["learning_rate"] == 0.05


def test_use_checkpoint_config_takes_the_saved_config_and_names_what_it_ignores(
    cli_checkpoint, tmp_path, capsys
):
    resume(
        cli_checkpoint,
        tmp_path,
        "--model.init_args.rollout.num_generations=2",
        "--use_checkpoint_config=true",
    )
    err = capsys.readouterr().err
    assert "resume: model.rollout.num_generations: given 2 ignored, the checkpoint's 4 used" in err
    # only the lines of what changed: a trainer setting the checkpoint's record leaves out (its callbacks list)
    # and the given config leaves unset is no line ("checkpoint '<absent>', given None")
    said = sorted(line.split(":")[1].strip() for line in err.splitlines() if line.startswith("resume:"))
    assert said == ["model.rollout.num_generations", "trainer.default_root_dir", "trainer.max_steps"]
    hparams = yaml.safe_load(next(tmp_path.rglob("hparams.yaml")).read_text())
    assert hparams["rollout"]["num_generations"] == 4


# ------------------------------------------------------------------ a Python fit
class Rates(pl.Callback):
    """The learning rates the optimizers step with, per batch."""

    def __init__(self):
        self.rates = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.rates.append([g["lr"] for opt in trainer.optimizers for g in opt.param_groups])


def fit(tmp_path, batches, ckpt_path=None, scheduler=None, **model_kw):
    pl.seed_everything(0)
    kw = dict(
        agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=6, learning_rate=1e-3
    )
    model = MAGRPO(**{**kw, **model_kw}, scheduler=scheduler)
    rates = Rates()
    saver = ModelCheckpoint(dirpath=str(tmp_path), save_last=True, save_top_k=0)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, callbacks=[rates, saver],
                         max_steps=MAGRPO.max_steps_for(batches, 2))  # fmt: skip
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=8), ckpt_path=ckpt_path)
    return rates.rates


def halving(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)


@pytest.mark.parametrize("scheduler", [None, halving], ids=["constant", "scheduled"])
def test_a_new_learning_rate_reaches_the_optimizers_after_resume(tmp_path, scheduler):
    fit(tmp_path, 1, scheduler=scheduler)
    rates = fit(tmp_path, 2, ckpt_path=str(tmp_path / "last.ckpt"), scheduler=scheduler, learning_rate=0.05)
    # one batch was trained: each agent's scheduler stepped once (x 0.5) under the old rate
    assert rates == [[0.05 * (0.5 if scheduler else 1.0)] * 2]


def test_a_python_resume_with_another_group_size_is_refused(tmp_path):
    fit(tmp_path, 1)
    with pytest.raises(ResumeConfigError, match=r"model.rollout.num_generations: checkpoint 2, given 4"):
        fit(tmp_path, 2, ckpt_path=str(tmp_path / "last.ckpt"), num_generations=4)


def test_a_magrpo_config_resumed_from_a_madpo_checkpoint_is_refused(tmp_path, monkeypatch, capsys):
    os.chdir(ROOT)  # the case: it trained MADPO and exited 0
    main(["fit", *experiment("toy_madpo.yaml"), *CLI, "--model.init_args.dpo.preference_mode=online",
          "--data.init_args.num_train=4", "--model.init_args.sampling.max_new_tokens=4",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
          f"--trainer.callbacks.dirpath={tmp_path}/ckpt", "--trainer.callbacks.save_last=true"])  # fmt: skip
    no_model_loads(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        resume(tmp_path / "ckpt" / "last.ckpt", tmp_path / "resumed")
    assert exit_info.value.code == 2
    assert "model.class_path: checkpoint 'comlrl_lightning.MADPO', given 'comlrl_lightning.MAGRPO'" in (
        capsys.readouterr().err
    )


def test_run_lines_say_nothing_of_a_setting_unrecorded_on_one_side_and_unset_on_the_other():
    from comlrl_lightning.infra.resume_config import run_lines

    saved = {
        "trainer.max_steps": 2,
        "seed_everything": 0,
    }  # a list-valued setting (callbacks) is not recorded
    assert run_lines(saved, {**saved, "trainer.callbacks": None}) == []
    assert run_lines({**saved, "data.val_batch_size": None}, saved) == []
    (line,) = run_lines(saved, {**saved, "trainer.callbacks": None, "trainer.max_steps": 4})
    assert line.startswith("resume: trainer.max_steps: checkpoint 2, given 4 (applied")
    (line,) = run_lines(saved, {**saved, "trainer.limit_val_batches": 0})  # absent against a value: said
    assert "checkpoint '<absent>', given 0" in line
