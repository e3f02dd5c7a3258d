"""`CompletionLogger`: prompts, completions and rewards as a table in TensorBoard's TEXT tab."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

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

    The text goes to every :class:`TensorBoardLogger` in ``trainer.loggers`` (``add_text``), from
    rank zero only, at the same x-axis value as the step's scalars: the count of batches trained
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
        text = completion_report(outputs, self.max_rows, self.max_chars)
        for writer in writers:
            writer.add_text(self.tag, text, global_step=step)


COLUMNS = ("episode", "joint action", "turn", "agent", "prompt", "completion", "reward")
"""The columns of :func:`completion_report`'s table."""


def completion_report(out: dict[str, Any], max_rows: int, max_chars: int | None) -> str:
    """A markdown table of turn 0 of one training step's output dict, for TensorBoard's TEXT tab.

    Columns :data:`COLUMNS`; one row per agent of each joint action (episode-major, joint actions in
    order, agents in order). ``prompt`` is the agent's user turn (the formatter's prompt, without
    the chat template), shown in the episode's first joint action only; ``reward`` is the joint
    action's shared reward, on each of its rows. Every cell is a ``<pre>`` block (monospace, its
    indentation kept, never wrapped: TensorBoard breaks table text at any character, so a wide code
    cell would squeeze every other column to one character): HTML-escaped, ``|`` cannot end it, line
    breaks become ``<br>``, markdown's characters (``*``, ``_``, backticks, brackets) are entities so
    markdown cannot format code. A table wider than its card scrolls sideways.

    Args:
        out: the dict ``MAGRPO.training_step`` returns (``user_prompts`` (else ``prompts``),
            ``completions``, ``turn0_rewards`` ``[E, J]``, ``num_generations``).
        max_rows: at most this many joint actions in all; max_chars: cut each prompt and
            completion to this many characters (``…`` marks a cut); None: no cut.

    Returns:
        Markdown text: a header row, a separator row, ``N`` rows per joint action shown.

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
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    shown = 0
    for e in range(num_episodes):
        for a in range(j):
            if shown >= max_rows:
                return "\n".join(lines)
            shown += 1
            for i in range(n):
                prompt = (prompts[i][e] if e < len(prompts[i]) else "") if a == 0 else ""
                completion = completions[i][e * k + int(joint[a, i])]
                texts = [
                    str(e),
                    str(a),
                    "0",
                    f"agent_{i}",
                    _cut(prompt, max_chars),
                    _cut(completion, max_chars),
                ]
                cells = [_cell(t) for t in [*texts, f"{float(rewards[e, a]):.4g}"]]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
