"""`CompletionLogger`: prompts, completions and rewards as a table in TensorBoard's TEXT tab and in W&B."""

from __future__ import annotations

import html
import sys
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

from comlrl_lightning.core.advantages import joint_action_indices


class CompletionLogger(pl.Callback):
    """Every ``every_n_steps`` batches, writes turn 0 of the step's rollout as a TensorBoard text table.

    One row per agent of each joint action: episode, joint action, turn, agent, its user turn (the
    prompt as the formatter wrote it, not the rendered chat template), its completion and the joint
    action's shared reward (:func:`completion_report`). Rows run over episodes, then joint actions
    (aligned: sample ``j`` of every agent; cross: the Cartesian product, as in
    :func:`comlrl_lightning.core.advantages.joint_action_indices`). A completion is shown in full
    (unless ``max_chars`` is given), as preformatted monospace text whose column is as wide as its
    longest line: code reads as code.

    The table goes to every logger in ``trainer.loggers`` that has a table API, from rank zero only:
    a :class:`TensorBoardLogger` gets the markdown text (``add_text``), a :class:`WandbLogger` a
    ``wandb.Table`` of plain-text cells (``log_table``, key ``tag``). Any other logger (CSV, MLflow,
    ...) gets none, and the fit says so once, in one line on stderr, at its start. Each is logged at the
    same x-axis value as the step's scalars: the count of batches trained
    before this one (``fit_loop.epoch_loop._batches_that_stepped``), not ``global_step``, which
    grows by N optimizer steps per batch. It fires when that count plus one is a multiple of
    ``every_n_steps``, like ``log_every_n_steps``.

    Args:
        every_n_steps: log every this many batches (≥ 1).
        max_rows: at most this many joint actions per log (≥ 1).
        max_chars: at most this many characters per prompt/completion (≥ 1; ``…`` marks a cut);
            None (default): the full text.
        tag: TensorBoard text tag.

    Raises:
        ValueError: a bound below 1.
    """

    def __init__(
        self,
        every_n_steps: int = 25,
        max_rows: int = 8,
        max_chars: int | None = None,
        tag: str = "completions",
    ) -> None:
        super().__init__()
        bounds = {"every_n_steps": every_n_steps, "max_rows": max_rows, "max_chars": max_chars}
        for name, value in bounds.items():
            if value is not None and value < 1:
                raise ValueError(f"CompletionLogger.{name}: got {value}, must be >= 1")
        self.every_n_steps, self.max_rows, self.max_chars, self.tag = every_n_steps, max_rows, max_chars, tag

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        others = sorted({type(lg).__name__ for lg in trainer.loggers if not isinstance(lg, _TABLE_LOGGERS)})
        if trainer.is_global_zero and others:
            print(
                f"CompletionLogger: {', '.join(others)} cannot show a table; the completion table goes to "
                "TensorBoard (TEXT tab) and W&B only",
                file=sys.stderr,
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero or not isinstance(outputs, Mapping) or "completions" not in outputs:
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        if (step + 1) % self.every_n_steps:
            return
        loggers = [lg for lg in trainer.loggers if isinstance(lg, _TABLE_LOGGERS)]
        if not loggers:
            return
        rows = completion_rows(outputs, self.max_rows, self.max_chars)
        for logger in loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text(self.tag, markdown_table(rows), global_step=step)
            else:
                logger.log_table(key=self.tag, columns=list(COLUMNS), data=[list(r) for r in rows], step=step)


_TABLE_LOGGERS = (TensorBoardLogger, WandbLogger)
"""The loggers :class:`CompletionLogger` writes its table to."""


COLUMNS = ("episode", "joint action", "turn", "agent", "prompt", "completion", "reward")
"""The columns of :func:`completion_rows`' table."""


def completion_rows(out: dict[str, Any], max_rows: int, max_chars: int | None) -> list[tuple]:
    """Turn 0 of one training step's output dict as table rows, one per agent of each joint action.

    Rows run episode-major, joint actions in order, agents in order; columns :data:`COLUMNS`:
    episode, joint action, turn (0) as ints, ``agent_<i>``, its user turn (the formatter's prompt,
    without the chat template; in the episode's first joint action only, else ``""``), its completion
    (prompt and completion cut to ``max_chars``, ``…`` marking a cut; None: no cut) and the joint
    action's shared reward (a float, on each of its rows).

    Args:
        out: the dict ``MAGRPO.training_step`` returns (``user_prompts`` (else ``prompts``),
            ``completions``, ``turn0_rewards`` ``[E, J]``, ``num_generations``).
        max_rows: at most this many joint actions in all.
        max_chars: the cut of each prompt and completion (characters); None: none.

    Raises:
        ValueError: ``J`` is neither ``K`` (aligned) nor ``K^N`` (cross).
    """
    prompts, completions, rewards = (
        out.get("user_prompts") or out["prompts"],
        out["completions"],
        out["turn0_rewards"],
    )
    k, n = int(out["num_generations"]), len(completions)
    num_episodes, j = rewards.shape
    if j == k:
        joint = joint_action_indices(n, k, "aligned")
    elif j == k**n:
        joint = joint_action_indices(n, k, "cross")
    else:
        raise ValueError(f"turn0_rewards has {j} joint actions per episode; expected K={k} or K^N={k**n}")
    rows: list[tuple] = []
    pairs = [(e, a) for e in range(num_episodes) for a in range(j)][:max_rows]
    for e, a in pairs:
        for i in range(n):
            prompt = (prompts[i][e] if e < len(prompts[i]) else "") if a == 0 else ""
            completion = completions[i][e * k + int(joint[a, i])]
            reward = float(rewards[e, a])
            rows.append((e, a, 0, f"agent_{i}", _cut(prompt, max_chars), _cut(completion, max_chars), reward))
    return rows


def markdown_table(rows: list[tuple]) -> str:
    """:func:`completion_rows` as a markdown table for TensorBoard's TEXT tab.

    Every cell is a ``<pre>`` block (monospace, its indentation kept, never wrapped: TensorBoard breaks
    table text at any character, so a wide code cell would squeeze every other column to one
    character): HTML-escaped, ``|`` cannot end it, line breaks become ``<br>``, markdown's characters
    (``*``, ``_``, backticks, brackets) are entities so markdown cannot format code. A table wider
    than its card scrolls sideways. The reward is shown to 4 significant digits.

    Returns:
        A header row, a separator row, then one line per row.
    """
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for *texts, reward in rows:
        cells = [_cell(str(t)) for t in [*texts, f"{reward:.4g}"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def completion_report(out: dict[str, Any], max_rows: int, max_chars: int | None) -> str:
    """:func:`markdown_table` of :func:`completion_rows` (the text ``CompletionLogger`` gives TensorBoard)."""
    return markdown_table(completion_rows(out, max_rows, max_chars))


def _cut(text: str, max_chars: int | None) -> str:
    return text[:max_chars] + "…" if max_chars is not None and len(text) > max_chars else text


_MARKDOWN = str.maketrans({c: f"&#{ord(c)};" for c in "*_`[]\\~"})
"""Markdown's inline markup characters as HTML entities: ``__init__`` stays ``__init__`` in code."""


def _cell(text: str) -> str:
    """``text`` as one table cell: a ``<pre>`` block (spaces kept, no markdown formatting), escaped, no
    ``|``, ``<br>`` line breaks; ``""`` for no text."""
    # every line boundary markdown could end a table row at (\r, \x0b, \x85, \u2028, ...), not only \n
    rows = [html.escape(r).replace("|", "&#124;").translate(_MARKDOWN) for r in text.splitlines()]
    return "<pre>" + "<br>".join(rows) + "</pre>" if text else ""
