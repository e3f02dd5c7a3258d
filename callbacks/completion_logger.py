"""`CompletionLogger`: sampled prompts, completions and rewards as a markdown table in TensorBoard."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from comlrl_lightning.core.advantages import joint_action_indices


class CompletionLogger(pl.Callback):
    """Every ``every_n_steps`` batches, writes turn 0 of the step's rollout as a TensorBoard text table.

    One row per joint action: the episode, each agent's prompt and completion, and the shared reward.
    Rows run over episodes, then joint actions (aligned: sample ``j`` of every agent; cross: the
    Cartesian product, as in :func:`comlrl_lightning.core.advantages.joint_action_indices`). Cells are cut
    to ``max_chars`` characters (``…`` marks a cut), ``|`` is escaped and newlines become ``<br>``
    so a completion cannot break the table.

    The text goes to every :class:`TensorBoardLogger` in ``trainer.loggers`` (``add_text``), from
    rank zero only, at the same x-axis value as the step's scalars: the count of batches trained
    before this one (``fit_loop.epoch_loop._batches_that_stepped``), not ``global_step``, which
    grows by N optimizer steps per batch. It fires when that count plus one is a multiple of
    ``every_n_steps``, like ``log_every_n_steps``.

    Args:
        every_n_steps: log every this many batches (≥ 1).
        max_rows: at most this many table rows per log (≥ 1).
        max_chars: at most this many characters per prompt/completion cell (≥ 1).
        tag: TensorBoard text tag.

    Raises:
        ValueError: a bound below 1.
    """

    def __init__(
        self, every_n_steps: int = 25, max_rows: int = 8, max_chars: int = 300, tag: str = "completions"
    ) -> None:
        super().__init__()
        bounds = {"every_n_steps": every_n_steps, "max_rows": max_rows, "max_chars": max_chars}
        for name, value in bounds.items():
            if value < 1:
                raise ValueError(f"CompletionLogger.{name}: got {value}, must be >= 1")
        self.every_n_steps, self.max_rows, self.max_chars, self.tag = every_n_steps, max_rows, max_chars, tag

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero or not isinstance(outputs, Mapping) or "completions" not in outputs:
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        if (step + 1) % self.every_n_steps:
            return
        writers = [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not writers:
            return
        text = completion_table(outputs, self.max_rows, self.max_chars)
        for writer in writers:
            writer.add_text(self.tag, text, global_step=step)


def completion_table(out: dict[str, Any], max_rows: int, max_chars: int) -> str:
    """A markdown table of turn 0 of one training step's output dict.

    Args:
        out: the dict ``MAGRPO.training_step`` returns (``prompts``, ``completions``, ``turn0_rewards``
            ``[E, J]``, ``num_generations``).
        max_rows: row limit; max_chars: cell limit (characters, before escaping).

    Returns:
        Markdown: a header row ``episode | agent_0 prompt | agent_0 completion | … | reward`` and up
        to ``max_rows`` rows.

    Raises:
        ValueError: ``J`` is neither ``K`` (aligned) nor ``K^N`` (cross).
    """
    prompts, completions, rewards = out["prompts"], out["completions"], out["turn0_rewards"]
    k, n = int(out["num_generations"]), len(completions)
    num_episodes, j = rewards.shape
    if j == k:
        joint = joint_action_indices(n, k, "aligned")
    elif j == k**n:
        joint = joint_action_indices(n, k, "cross")
    else:
        raise ValueError(f"turn0_rewards has {j} joint actions per episode; expected K={k} or K^N={k**n}")
    agent_cols = [f"agent_{i} {col}" for i in range(n) for col in ("prompt", "completion")]
    header = ["episode", *agent_cols, "reward"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for e in range(num_episodes):
        for a in range(j):
            if len(lines) - 2 >= max_rows:
                break
            cells = [str(e)]
            for i in range(n):
                cells.append(_cell(prompts[i][e] if e < len(prompts[i]) else "", max_chars))
                cells.append(_cell(completions[i][e * k + int(joint[a, i])], max_chars))
            cells.append(f"{float(rewards[e, a]):.4g}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(text: str, max_chars: int) -> str:
    if len(text) > max_chars:
        text = text[:max_chars] + "…"
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "<br>")
