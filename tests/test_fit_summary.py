"""FitSummary: a Python ``trainer.fit`` prints the end-of-fit summary, a resumed run's summary starts at
the first value ever recorded, and a held-out scalar that fell is flagged (issue 33, item 6)."""

import re

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from comlrl_lightning import MAGRPO
from comlrl_lightning.callbacks import FitSummary
from comlrl_lightning.callbacks.fit_summary import summary_line
from comlrl_lightning.datamodules import LengthRatioDataModule


class Validations(pl.Callback):
    """The ``val/reward`` of every validation run (not the sanity check), in order."""

    def __init__(self):
        self.values = []

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.values.append(float(trainer.callback_metrics["val/reward"]))


def fit(tmp_path, max_steps, ckpt_path=None, callbacks=()):
    pl.seed_everything(0)
    module = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, learning_rate=1e-3,
                    max_new_tokens=6, val_sampling=True)  # fmt: skip
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_steps, val_check_interval=2, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=tmp_path, callbacks=list(callbacks))  # fmt: skip
    trainer.fit(
        module, LengthRatioDataModule(num_train=16, num_val=2, batch_size=2, seed=0), ckpt_path=ckpt_path
    )
    return trainer


def summary(out, key):
    match = re.search(
        rf"^  {re.escape(key)}: (-?\d+\.\d+) -> (-?\d+\.\d+) \(([+-]\d+\.\d+), (\d+) points\)", out, re.M
    )
    assert match, out
    return float(match.group(1)), float(match.group(2)), int(match.group(4))


def test_a_python_fit_prints_the_summary_of_what_it_logged(tmp_path, capsys):
    # before the fix only comlrl-lightning fit printed it (cli.py after_fit); a Python fit printed nothing
    seen = Validations()
    trainer = fit(tmp_path, MAGRPO.max_steps_for(6, 2), callbacks=[seen])
    out = capsys.readouterr().out
    assert "Fit summary (start -> end):" in out
    assert len(seen.values) == 3  # batches 2, 4, 6
    first, last, points = summary(out, "val/reward")
    assert (first, last, points) == (round(seen.values[0], 3), round(seen.values[-1], 3), 3)
    assert sum(isinstance(c, FitSummary) for c in trainer.callbacks) == 1  # the module added one


def test_a_listed_summary_is_used_and_not_doubled(tmp_path, capsys):
    mine = FitSummary(keys=["val/reward"])
    trainer = fit(tmp_path, MAGRPO.max_steps_for(2, 2), callbacks=[mine])
    assert [c for c in trainer.callbacks if isinstance(c, FitSummary)] == [mine]
    out = capsys.readouterr().out
    assert out.count("Fit summary") == 1 and "  reward:" not in out and "  val/reward:" in out


def test_a_resumed_run_summarises_from_the_first_value_ever_recorded(tmp_path, capsys):
    # before the fix the summary read the resumed run's own logs only: it began at the resume
    seen = Validations()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=MAGRPO.max_steps_for(4, 2),
                           save_top_k=0, save_last=True)  # fmt: skip
    fit(tmp_path, MAGRPO.max_steps_for(4, 2), callbacks=[seen, ckpt])
    capsys.readouterr()
    fit(
        tmp_path, MAGRPO.max_steps_for(8, 2), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"), callbacks=[seen]
    )
    out = capsys.readouterr().out
    assert len(seen.values) == 4  # 2 before the resume, 2 after
    first, last, points = summary(out, "val/reward")
    # the checkpoint at batch 4 is written at that batch's end, before its validation: it holds batch 2's value
    assert (first, last, points) == (round(seen.values[0], 3), round(seen.values[-1], 3), 3)


@pytest.mark.parametrize(
    "key,values,flagged",
    [("val/reward", [0.529, 0.391], True), ("val/reward", [0.391, 0.529], False), ("reward", [0.5, 0.1], False),
     ("val/pass@1", [0.5, 0.25], True)],
)  # fmt: skip
def test_a_held_out_scalar_that_fell_is_flagged(key, values, flagged):
    # before the fix MADPO's toy went 0.529 -> 0.391 and the summary line read like any other
    line = summary_line(key, values, 40)
    assert ("FELL" in line) == flagged
    assert line.startswith(f"{key}: {values[0]:.3f} -> {values[-1]:.3f}")
