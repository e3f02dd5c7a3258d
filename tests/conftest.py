import os

os.environ["HF_HUB_OFFLINE"] = "1"
# 2 shared cores: spinning OpenMP threads waiting for a core slow torch down by an order of magnitude
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning.pytorch as pl  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)

if os.environ.get(
    "COMLRL_TOLERANCE_AUDIT"
):  # how close each tolerance check comes to failing: tests/tolerance_audit.py
    import tolerance_audit

    tolerance_audit.install(os.environ["COMLRL_TOLERANCE_AUDIT"])


def tiny_trainer(max_steps: int, **kwargs) -> pl.Trainer:
    """A quiet CPU trainer for tests."""
    defaults = dict(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    defaults.update(kwargs)
    return pl.Trainer(max_steps=max_steps, **defaults)


def tiny_cli_config(tmp_path, strategy, **trainer) -> str:
    """A ``fit --config`` YAML (written into ``tmp_path``): MAGRPO, two tiny-gpt2 agents with reference
    models, 2 steps on the length-ratio task under ``strategy``; ``trainer`` adds trainer fields."""
    import yaml

    config = {
        "trainer": {"strategy": strategy, "accelerator": "cpu", "max_steps": 2, "logger": False,
                    "enable_progress_bar": False, "enable_checkpointing": False, "limit_val_batches": 0,
                    "default_root_dir": str(tmp_path), **trainer},
        "model": {"class_path": "comlrl_lightning.MAGRPO",
                  "init_args": {"agents": [{"model": "builtin:tiny-gpt2"}] * 2, "rollout": {"num_generations": 2},
                                "sampling": {"max_new_tokens": 8}, "loss": {"beta": 0.1}}},
        "data": {"class_path": "comlrl_lightning.datamodules.LengthRatioDataModule",
                 "init_args": {"num_train": 8, "batch_size": 2}},
    }  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture
def trainer_factory():
    return tiny_trainer


@pytest.fixture(scope="module")
def coop():
    """The cooperative coding reward (one per test module: its judge and its cache of reports)."""
    from comlrl_lightning.coding.reward import CooperativeCodeReward

    reward = CooperativeCodeReward()
    yield reward
    reward.close()


@pytest.fixture(scope="module")
def rows():
    """The 164 HumanEval rows."""
    from comlrl_lightning.coding.data import load_humaneval_rows

    return load_humaneval_rows()


@pytest.fixture
def lightning_log(caplog):
    """``caplog`` that also sees ``rank_zero_info`` lines, even after a test made Lightning's logger stop
    propagating (``caplog.text``)."""
    import logging

    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)
