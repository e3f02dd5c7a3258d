"""Every long phase outside a training batch says when it starts (issue 33, item 6): MARLHF's phase 1,
one-shot MADPO's pair building, each round's build of the iterative trainers; before, each printed
nothing for minutes."""

import logging

import lightning.pytorch as pl
from test_madpo import _madpo
from test_madpo_iter import BATCH, TRAIN, _module
from test_marlhf import fit, marlhf, separable_pairs

from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.preference.pairs import write_pairs


def infos(log):
    """The INFO lines ``log`` (the conftest's ``lightning_log``: ``caplog`` that still sees Lightning's lines
    after a module such as ``benchmarks/lib/bench_lib.py`` raised Lightning's log level) captured."""
    return [r.getMessage() for r in log.records if r.levelno == logging.INFO]


def test_marlhf_phase_one_says_it_starts(trainer_factory, tmp_path, lightning_log):
    pl.seed_everything(0)
    with lightning_log.at_level(logging.INFO):
        fit(trainer_factory, marlhf(tmp_path, epochs=1), 1)
    assert ("MARLHF phase 1: building preference pairs from 4 prompts x 3 joint responses, then training the "
            "reward model (the RL phase follows)") in infos(lightning_log)  # fmt: skip


def test_marlhf_phase_one_from_a_pair_file_says_it_starts(trainer_factory, tmp_path, lightning_log):
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, separable_pairs(8))
    pl.seed_everything(0)
    with lightning_log.at_level(logging.INFO):
        fit(trainer_factory, marlhf(tmp_path, epochs=1, pairs_path=str(path)), 1)
    assert (f"MARLHF phase 1: 8 preference pairs read from {path}; training the reward model (the RL phase "
            "follows)") in infos(lightning_log)  # fmt: skip


def test_one_shot_madpo_says_it_builds_its_pairs(trainer_factory, lightning_log):
    pl.seed_everything(0)
    with lightning_log.at_level(logging.INFO):
        trainer_factory(max_steps=2).fit(_madpo("one_shot"), LengthRatioDataModule(batch_size=2, num_train=4))
    lines = [m for m in infos(lightning_log) if m.startswith("MADPO: building")]
    assert lines == ["MADPO: building the one-shot preference pairs from 4 training prompts x 3 joint responses "
                     "(no update until they are built)"]  # fmt: skip


def test_each_round_of_the_iterative_trainer_says_it_builds(trainer_factory, tmp_path, lightning_log):
    pl.seed_everything(0)
    with lightning_log.at_level(logging.INFO):
        trainer = trainer_factory(max_steps=-1, max_epochs=100, default_root_dir=tmp_path)
        trainer.fit(_module(), LengthRatioDataModule(batch_size=BATCH, num_train=TRAIN))
    assert [m for m in infos(lightning_log) if "building its pairs" in m] == [
        "MADPOIter: round 1/2: building its pairs (current vs current_copy)",
        "MADPOIter: round 2/2: building its pairs (current vs current_copy)",
    ]
