"""What a run shows where its user looks (issue 44, items 6 and 8): TensorBoard's SCALARS tab opens on
the team's curves, with no ``hp_metric`` card; a run whose output goes to a file prints plain metric
lines; a resume that restores the data position says nothing that contradicts it; the completion table
reaches W&B as a table, and a logger without a table API gets a one-line notice."""

import contextlib
import functools
import io
import os
import re
import warnings

import lightning.pytorch as pl
import psutil
import pytest
from experiments import ROOT
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from comlrl_lightning import MAGRPO
from comlrl_lightning.callbacks import CompletionLogger, ProgressLines, RewardLogger, default_progress_bar
from comlrl_lightning.callbacks.completion_logger import COLUMNS
from comlrl_lightning.cli import main
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.infra.quiet import NOT_RESUMABLE, POST_STEP_CHECKPOINT

TOY = ["--config", "configs/trainer/cpu.yaml", "--config", "configs/callbacks/default.yaml",
       "--config", "configs/toy_length_ratio.yaml", "--trainer.limit_val_batches=1",
       "--trainer.log_every_n_steps=1", "--model.init_args.sampling.max_new_tokens=8",
       "--model.init_args.rollout.num_generations=2", "--trainer.logger.init_args.version=0"]  # fmt: skip


# ---------------------------------------------------------------- TensorBoard's order, ported
def _is_break(c: str) -> bool:
    return c in "/_" or c.isdigit()


def _number_end(s: str, i: int) -> int:
    state = "natural"  # TensorBoard reads a number with its decimals and exponent
    while i < len(s):
        c = s[i]
        if state in ("natural", "real"):
            if c == "." and state == "natural":
                state = "real"
            elif c in "eE":
                state = "sign"
            elif not c.isdigit():
                break
        elif state == "sign":
            if not (c.isdigit() or c in "+-"):
                break
            state = "exp"
        elif not c.isdigit():
            break
        i += 1
    return i


def _number(text: str) -> float:  # JavaScript's parseFloat: the longest number at the start
    return float(re.match(r"\d+(\.\d*)?([eE][+-]?\d+)?", text).group(0))


def compare_tag_names(a: str, b: str) -> int:
    """TensorBoard's ``vz_sorting.compareTagNames`` (tensorboard 2.21, webfiles.zip): numbers compare
    by value; ``/``, ``_`` and digits sort before any other character (and equal to each other);
    the rest by code point."""
    i = j = 0
    while True:
        if i == len(a):
            return 0 if j == len(b) else -1
        if j == len(b):
            return 1
        if a[i].isdigit() and b[j].isdigit():
            i2, j2 = _number_end(a, i + 1), _number_end(b, j + 1)
            x, y = _number(a[i:i2]), _number(b[j:j2])
            if x != y:
                return -1 if x < y else 1
            i, j = i2, j2
            continue
        if _is_break(a[i]):
            if not _is_break(b[j]):
                return -1
        elif _is_break(b[j]):
            return 1
        elif a[i] != b[j]:
            return -1 if a[i] < b[j] else 1
        i, j = i + 1, j + 1


def scalar_panes(tags: list[str]) -> list[tuple[str, list[str]]]:
    """The SCALARS tab's panes in order: tags sorted by :func:`compare_tag_names`, grouped by the part
    before the first ``/`` in order of first appearance (``categorizeByPrefix``). The tab opens the
    first two (``_shouldOpen(index) = index <= 2``, index 0 being the hidden search pane)."""
    panes: dict[str, list[str]] = {}
    for tag in sorted(tags, key=functools.cmp_to_key(compare_tag_names)):
        panes.setdefault(tag.split("/", 1)[0], []).append(tag)
    return list(panes.items())


def test_the_ported_order_sorts_as_tensorboard_does():
    tags = ["reward", "agent_0/loss", "agent_10/loss", "agent_2/loss", "reward_std", "rewards/x/mean", "Zeta"]
    assert sorted(tags, key=functools.cmp_to_key(compare_tag_names)) == [
        "Zeta", "agent_0/loss", "agent_2/loss", "agent_10/loss", "reward", "reward_std", "rewards/x/mean",
    ]  # fmt: skip


# ---------------------------------------------------------------- one CLI fit, its output to a "file"
@pytest.fixture(scope="module")
def toy_fit(tmp_path_factory):
    """Two batches of the toy config through the CLI, stdout a StringIO (not a terminal): the root,
    the printed text and the scalar tags written."""
    root = tmp_path_factory.mktemp("logging_order")
    os.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["fit", *TOY, "--trainer.max_steps=4", f"--trainer.default_root_dir={root}"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(root / "toy_length_ratio" / "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    return root, out.getvalue(), acc.Tags()["scalars"]


def test_tensorboard_opens_on_team_curves_and_every_agent_pane_comes_last(toy_fit):
    _, _, tags = toy_fit
    panes = scalar_panes(tags)
    per_agent = [i for i, (name, _) in enumerate(panes) if re.fullmatch(r"z_agent_\d+", name)]
    assert len(per_agent) == 2, [name for name, _ in panes]  # one pane per agent
    assert per_agent == [len(panes) - 2, len(panes) - 1]  # below every team pane, val/ included
    opened = [tag for _, pane in panes[:2] for tag in pane]
    assert opened and not any("agent" in tag for tag in opened)
    assert {"reward", "val/reward", "clip_ratio/low_mean"} <= set(tags)  # TRL's team names kept


def test_the_cli_default_logger_writes_no_hp_metric(toy_fit):
    assert "hp_metric" not in toy_fit[2]


def test_output_to_a_file_gets_a_metrics_line_every_log_every_n_steps(toy_fit):
    _, printed, _ = toy_fit
    lines = [line for line in printed.splitlines() if line.startswith("epoch ")]
    assert [line.split(" | ")[0] for line in lines] == ["epoch 0 batch 1/2", "epoch 0 batch 2/2"]
    for line in lines:  # the step's reward, each agent's loss, the held-out reward from before the fit
        assert re.search(r" \| reward [-\d.e]+ \| loss [-\d.e]+ [-\d.e]+ \| val/reward [-\d.e]+ \| ", line), (
            line
        )
    assert re.search(r"^validation after batch 0 \| val/reward [-\d.e]+$", printed, re.M)
    assert "Epoch 0" not in printed  # no rich bar drawn into the file


def test_an_exact_resume_prints_no_warning_that_the_dataloader_is_not_resumable(toy_fit):
    root, _, _ = toy_fit
    ckpt = root / "toy_length_ratio" / "version_0" / "checkpoints" / "last.ckpt"
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        main(["fit", *TOY, "--trainer.max_steps=6", "--validate_before_fit=false",
              f"--trainer.default_root_dir={root / 'resumed'}", f"--ckpt_path={ckpt}"])  # fmt: skip
    assert not [w for w in caught if re.match(NOT_RESUMABLE, str(w.message))]
    assert NOT_RESUMABLE not in str(warnings.filters)  # and no filter outlives the resume


def test_batch_end_checkpoints_of_the_post_step_state_print_no_code_sample(tmp_path):
    pl.seed_everything(0)
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, rollout={"num_generations": 2},
                   sampling={"max_new_tokens": 6})  # fmt: skip
    saver = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path, every_n_train_steps=2, save_top_k=0, save_last=True
    )
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, max_steps=MAGRPO.max_steps_for(2, 2), callbacks=[saver])  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))
    assert (tmp_path / "last.ckpt").exists()
    assert not [w for w in caught if re.match(POST_STEP_CHECKPOINT, str(w.message))]
    assert POST_STEP_CHECKPOINT not in str(warnings.filters)


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_the_rich_bar_and_a_file_the_lines(monkeypatch):
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert isinstance(default_progress_bar(), ProgressLines)
    monkeypatch.setattr("sys.stdout", Terminal())
    assert type(default_progress_bar()).__name__ == "RichProgress"


# ---------------------------------------------------------------- the completion table's loggers
def tiny_fit(logger, tmp_path):
    pl.seed_everything(0)
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, rollout={"num_generations": 2},
                   sampling={"max_new_tokens": 6})  # fmt: skip
    trainer = pl.Trainer(accelerator="cpu", logger=logger, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, limit_val_batches=0, max_steps=MAGRPO.max_steps_for(1, 2),
                         callbacks=[RewardLogger(), CompletionLogger(every_n_steps=1)], log_every_n_steps=1,
                         default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))


def test_the_completion_table_reaches_wandb_as_a_table(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged = []
    real = WandbLogger.log_metrics

    def spy(self, metrics, step=None):
        logged.append((metrics, step))
        return real(self, metrics, step)

    monkeypatch.setattr(WandbLogger, "log_metrics", spy)
    logger = WandbLogger(save_dir=str(tmp_path), project="completions", offline=True)
    try:
        tiny_fit(logger, tmp_path)
    finally:
        wandb.finish()
        wandb.teardown()  # stops wandb-core: a child process left alive fails later tests' "no child of ours"
    assert not psutil.Process().children(recursive=True)
    tables = [(m["completions"], step) for m, step in logged if "completions" in m]
    assert len(tables) == 1 and isinstance(tables[0][0], wandb.Table) and tables[0][1] == 0
    table = tables[0][0]
    assert table.columns == list(COLUMNS)
    assert len(table.data) == 2 * 2 * 2  # 2 episodes x 2 joint actions x 2 agents
    assert [row[3] for row in table.data[:2]] == ["agent_0", "agent_1"] and isinstance(
        table.data[0][6], float
    )


def test_a_logger_without_a_table_api_gets_one_line_saying_so(tmp_path, capsys):
    tiny_fit(CSVLogger(str(tmp_path)), tmp_path)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("CompletionLogger")]
    assert notes == ["CompletionLogger: CSVLogger cannot show a table; the completion table goes to "
                     "TensorBoard (TEXT tab) and W&B only"]  # fmt: skip
