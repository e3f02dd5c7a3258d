"""The CLI end to end on the tiny model: 2-agent and 1-agent fits, --print_config, bad keys."""

import glob
import os
from pathlib import Path

import pytest
import yaml
from experiments import experiment, subcommand

from comlrl_lightning.cli import main

ROOT = Path(__file__).resolve().parents[1]


def fit(config, tmp_path, *extra):
    os.chdir(ROOT)  # configs use paths relative to the repository root
    main(["fit", *experiment(config), "--trainer.enable_progress_bar=false",
          f"--trainer.logger.init_args.save_dir={tmp_path}", *extra])  # fmt: skip
    return glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)


def test_two_agent_toy_fit_writes_tensorboard_events(tmp_path):
    events = fit(
        "toy_length_ratio.yaml",
        tmp_path,
        "--trainer.max_steps=6",
        "--trainer.val_check_interval=2",
        "--trainer.log_every_n_steps=1",
    )
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(
        os.path.dirname(events[0])
    )  # the run's folder: validation before fit writes a file too
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"reward", "z_agent_0/loss", "z_agent_1/loss", "val/reward"} <= tags
    assert len(acc.Scalars("reward")) >= 1


def test_single_agent_grpo_fit(tmp_path):
    assert fit("toy_grpo.yaml", tmp_path, "--trainer.max_steps=3", "--trainer.limit_val_batches=1")


@pytest.mark.parametrize(
    ("mode", "extra"),
    [("one_shot", ["--model.init_args.dpo.num_train_epochs=2"]), ("online", ["--trainer.max_steps=4"])],
)
def test_madpo_toy_fit_logs_trls_dpo_metrics_and_one_shot_stops_itself(tmp_path, mode, extra):
    events = fit(
        "toy_madpo.yaml",
        tmp_path,
        f"--model.init_args.dpo.preference_mode={mode}",
        "--data.init_args.num_train=8",
        "--model.init_args.sampling.max_new_tokens=8",
        "--trainer.log_every_n_steps=1",
        *extra,
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(
        os.path.dirname(events[0])
    )  # the run's folder: validation before fit writes a file too
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"rewards/margins", "rewards/accuracies", "logps/chosen", "z_agent_1/rewards/margins"} <= tags
    assert {"reward", "z_agent_0/loss", "val/reward", "preference/num_pairs"} <= tags
    steps = [e.step for e in acc.Scalars("rewards/margins")]
    if (
        mode == "one_shot"
    ):  # 8 prompts x <= 4 pairs, 8 a batch: 2 passes of ceil(P / 8) updates, then it stops
        pairs = sum(e.value for e in acc.Scalars("preference/num_pairs"))
        assert len(steps) == 2 * -(-int(pairs / 2) // 8) and pairs > 0
    else:
        assert len(steps) == 2


def test_print_config_round_trips(tmp_path, capsys):
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *experiment("toy_length_ratio.yaml"), "--print_config"])
    assert exit_info.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["model"]["class_path"] == "comlrl_lightning.MAGRPO"
    assert cfg["model"]["init_args"]["rollout"]["num_generations"] == 4
    assert [a["model"] for a in cfg["model"]["init_args"]["agents"]] == ["builtin:tiny-gpt2"] * 2


def test_a_stray_optimizer_key_is_rejected_not_silently_applied(tmp_path, capsys):
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["fit", *experiment("toy_length_ratio.yaml"), "--optimizer=torch.optim.SGD", "--optimizer.lr=0.1"]
        )
    assert exit_info.value.code != 0
    assert "optimizer" in capsys.readouterr().err


def test_validate_subcommand_restores_a_fit_checkpoint(tmp_path, capsys):
    os.chdir(ROOT)
    fit("toy_length_ratio.yaml", tmp_path, "--trainer.max_steps=4", "--trainer.val_check_interval=2",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        f"--trainer.callbacks.dirpath={tmp_path}/ckpt", "--trainer.callbacks.save_last=true")  # fmt: skip
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    assert ckpt.exists()
    main(["validate", *experiment("toy_length_ratio.yaml"), f"--ckpt_path={ckpt}",
          "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={tmp_path}/val"])  # fmt: skip
    out = capsys.readouterr().out
    assert "val/reward" in out


def test_validate_before_fit_logs_validation_at_step_zero(tmp_path, capsys):
    events = fit("toy_length_ratio.yaml", tmp_path, "--validate_before_fit=true", "--trainer.max_steps=4",
                 "--trainer.val_check_interval=2")  # fmt: skip
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(events[0]).parent))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("val/reward")]
    assert steps[0] == 0 and len(steps) >= 2
    out = capsys.readouterr().out
    assert "TensorBoard logs:" in out
    # every reward term's start -> end is printed, and it is the logged first and last value
    terms = sorted(t for t in acc.Tags()["scalars"] if t.startswith("val/rewards/"))
    assert terms
    for t in terms:
        first, last = acc.Scalars(t)[0].value, acc.Scalars(t)[-1].value
        assert f"  {t}: {first:.3f} -> {last:.3f} ({last - first:+.3f}, {len(steps)} points)" in out


def test_summary_line_gives_pass_at_k_a_wilson_interval_over_the_problems():
    from comlrl_lightning.cli import summary_line
    from comlrl_lightning.core.evaluation import wilson_interval

    line = summary_line("val/pass@2", [0.0, 0.25], 40)
    lo, hi = wilson_interval(0.25, 40)
    assert line.startswith("val/pass@2: 0.000 -> 0.250 (+0.250, 2 points)")
    assert f"over 40 problems: [0.000, {wilson_interval(0.0, 40)[1]:.3f}] -> [{lo:.3f}, {hi:.3f}]" in line
    assert "interval" not in summary_line("val/reward", [0.5, 0.75], 40)


def test_saved_config_keeps_template_formatters_verbatim(tmp_path):
    fit("toy_grpo.yaml", tmp_path, "--trainer.max_steps=1", "--trainer.limit_val_batches=0")
    saved = yaml.safe_load(next(tmp_path.rglob("config.yaml")).read_text())
    assert saved["data"]["init_args"]["formatters"] == ["Note on {topic}:"]


@pytest.mark.parametrize(
    "config",
    sorted(
        p.name
        for p in (ROOT / "configs").glob("*.yaml")  # blocks: subfolders
        if subcommand(p.name) == "fit"
    ),
)  # coordinator configs: test_coordinator_cli
def test_every_shipped_experiment_parses_with_print_config(config, capsys):
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *experiment(config), "--print_config"])
    assert exit_info.value.code == 0, capsys.readouterr().err
    init = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]
    assert init["rollout"]["num_generations"] >= 1 and init["sampling"]["max_new_tokens"] >= 1
    if "dpo" in init:  # MADPO: preference and DPO groups instead of the policy-gradient ones
        iterative = "rounds" in init  # MADPOIter: pairs against its comparator (CoMLRL's iterative default)
        selection = "comparator_reward" if iterative else "reward_gap"
        assert init["dpo"]["loss_type"] == "sigmoid" and init["preference"]["pair_selection"] == selection
        assert "loss" not in init and "advantage" not in init
        return
    assert init["loss"]["loss_type"] in ("sequence_sum", "grpo")  # every group listed
    if init.get(
        "critic"
    ):  # IAC / MAAC: a critic group where MAGRPO has its advantage group (MARLHF: both keys)
        assert init["critic"]["critic_type"] == "v" and "advantage" not in init
    else:
        # advantage_mode is listed: unset (None) unless the experiment names it (MAGRPO then uses mean)
        assert init["advantage"]["advantage_mode"] in (None, "mean")
        assert init["rollout"]["num_generations"] >= 2


def test_default_root_dir_moves_the_logs_of_a_shipped_config(tmp_path):
    os.chdir(ROOT)
    main(["fit", *experiment("toy_grpo.yaml"), "--trainer.enable_progress_bar=false", "--trainer.max_steps=1",
          "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert glob.glob(str(tmp_path / "toy_grpo" / "version_0" / "events.out.tfevents.*"))


def test_hparams_yaml_lists_the_agents(tmp_path):
    fit("toy_length_ratio.yaml", tmp_path, "--trainer.max_steps=2", "--trainer.limit_val_batches=0")
    (path,) = glob.glob(str(tmp_path / "**" / "hparams.yaml"), recursive=True)
    hparams = yaml.safe_load(open(path))
    assert [a["model"] for a in hparams["agents"]] == ["builtin:tiny-gpt2"] * 2
    assert hparams["rollout"]["num_generations"] == 4


def test_every_shipped_fit_config_validates_at_step_zero():
    # before the fix the toys did not, so "did it learn?" had no baseline in their logs
    from experiments import subcommand

    names = sorted(os.path.basename(p) for p in glob.glob(str(ROOT / "configs" / "*.yaml")))
    fits = [n for n in names if subcommand(n) == "fit"]
    assert len(fits) >= 19
    assert [
        n
        for n in fits
        if yaml.safe_load((ROOT / "configs" / n).read_text()).get("validate_before_fit") is not True
    ] == []


def test_a_resumed_fit_does_not_validate_its_fresh_weights_at_step_zero(tmp_path):
    # validate_before_fit (now in every shipped config) on a resume would log the *initial* weights' val/reward
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    os.chdir(ROOT)
    first = fit("toy_length_ratio.yaml", tmp_path / "a", "--trainer.max_steps=4", "--trainer.val_check_interval=2",
                "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                f"--trainer.callbacks.dirpath={tmp_path}/ckpt", "--trainer.callbacks.save_last=true")  # fmt: skip
    resumed = fit("toy_length_ratio.yaml", tmp_path / "b", "--trainer.max_steps=8", "--trainer.val_check_interval=2",
                  f"--ckpt_path={tmp_path}/ckpt/last.ckpt")  # fmt: skip
    steps = []
    for events in (first, resumed):
        acc = EventAccumulator(str(Path(events[0]).parent))
        acc.Reload()
        steps.append([e.step for e in acc.Scalars("val/reward")])
    assert steps[0][0] == 0  # the first run validates before fit
    assert 0 not in steps[1] and steps[1]  # the resumed one does not, and still validates as it trains
