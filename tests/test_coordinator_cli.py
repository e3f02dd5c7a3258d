"""``comlrl-lightning coordinate``: the shipped HumanEval proposer/reviser config, on tiny learners."""

import glob
import os
from pathlib import Path

import pytest
import yaml
from experiments import experiment, subcommand

from comlrl_lightning.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = str(ROOT / "configs" / "coordinator_humaneval_smollm2.yaml")


def test_the_example_header_runs_the_coordinate_subcommand_on_its_own_file():
    assert subcommand("coordinator_humaneval_smollm2.yaml") == "coordinate"
    assert experiment("coordinator_humaneval_smollm2.yaml", "coordinate") == [
        "--config", "configs/coordinator_humaneval_smollm2.yaml"]  # fmt: skip


def tiny_learners(tmp_path, num_rounds=2):
    """A second --config: the shipped example with tiny learners, 2 rounds, logs in tmp_path."""
    module = {"class_path": "comlrl_lightning.MAGRPO",
              "init_args": {"agents": "builtin:tiny-llama-gpt2tok", "rollout": {"num_generations": 2},
                            "sampling": {"max_new_tokens": 16, "max_prompt_length": 256}, "learning_rate": 1e-3}}  # fmt: skip
    override = {"num_rounds": num_rounds, "root_dir": str(tmp_path / "run"), "progress_bar": False, "eval_every": 2,
                "learners": [{"name": "proposer", "module": module}, {"name": "reviser", "module": module}]}  # fmt: skip
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(override))
    return str(path)


def test_print_config_shows_the_shipped_example(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["coordinate", "--config", SHIPPED, "--print_config"])
    assert exit_info.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert [x["name"] for x in cfg["learners"]] == ["proposer", "reviser"]
    assert [s["learner"] for s in cfg["stages"]] == ["proposer", "reviser"]
    assert cfg["schedule"]["class_path"].endswith("Alternate")
    assert cfg["learners"][0]["module"]["init_args"]["agents"] == "builtin:smollm2-135m-instruct"


def test_a_bad_key_in_a_coordinator_config_is_rejected(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["coordinate", "--config", SHIPPED, "--num_roundz=3"])
    assert exit_info.value.code != 0
    assert "num_roundz" in capsys.readouterr().err


@pytest.mark.slow
def test_the_shipped_humaneval_example_runs_from_the_cli_on_tiny_learners(tmp_path, capsys):
    os.chdir(ROOT)
    main(["coordinate", "--config", SHIPPED, "--config", tiny_learners(tmp_path)])
    out = capsys.readouterr().out
    assert "learner proposer: reward first" in out and "trained at rounds [0]" in out
    assert "learner reviser: reward first" in out and "trained at rounds [1]" in out
    assert "seconds per round: median" in out
    assert "held-out after 2 rounds: val/reward " in out and " val/pass@1 " in out
    run = tmp_path / "run"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    system = EventAccumulator(glob.glob(str(run / "coordinator" / "events.out.tfevents.*"))[0])
    system.Reload()
    tags = set(system.Tags()["scalars"])
    assert {
        "reward",
        "seconds_per_round",
        "rewards/revision/pass_rate/mean",
        "rewards/revision/draft_pass_rate/mean",
        "val/reward",
        "val/pass@1",
        "val/rewards/revision/pass_rate/mean",
    } <= tags
    assert [e.step for e in system.Scalars("val/pass@1")] == [2]
    for name, trained in (("proposer", [1.0, 0.0]), ("reviser", [0.0, 1.0])):
        acc = EventAccumulator(glob.glob(str(run / "learners" / name / "events.out.tfevents.*"))[0])
        acc.Reload()
        assert [e.value for e in acc.Scalars("trained")] == trained
        assert os.path.exists(run / "learners" / name / "checkpoints" / "round-000002.ckpt")
        assert os.path.exists(run / "learners" / name / "agent" / "config.json")
    assert os.path.exists(run / "coordinator" / "checkpoints" / "round-000002.pt")
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["learners"][0]["module"]["init_args"]["agents"] == "builtin:tiny-llama-gpt2tok"
