"""`CompletionLogger`: user turns, completions (as code blocks) and rewards as markdown in TensorBoard."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from comlrl_lightning.core.advantages import joint_action_indices


class CompletionLogger(pl.Callback):
    """Every ``every_n_steps`` batches, writes turn 0 of the step's rollout as TensorBoard text.

    Per episode, each agent's user turn (its prompt as the formatter wrote it, not the rendered
    chat template), then one entry per joint action: the shared reward first, then each agent's
    completion as a code block (:func:`completion_report`). Entries run over episodes, then joint
    actions (aligned: sample ``j`` of every agent; cross: the Cartesian product, as in
    :func:`comlrl_lightning.core.advantages.joint_action_indices`). Prompts and completions are
    cut to ``max_chars`` characters (``…`` marks a cut).

    The text goes to every :class:`TensorBoardLogger` in ``trainer.loggers`` (``add_text``), from
    rank zero only, at the same x-axis value as the step's scalars: the count of batches trained
    before this one (``fit_loop.epoch_loop._batches_that_stepped``), not ``global_step``, which
    grows by N optimizer steps per batch. It fires when that count plus one is a multiple of
    ``every_n_steps``, like ``log_every_n_steps``.

    Args:
        every_n_steps: log every this many batches (≥ 1).
        max_rows: at most this many joint actions per log (≥ 1).
        max_chars: at most this many characters per prompt/completion (≥ 1).
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
        text = completion_report(outputs, self.max_rows, self.max_chars)
        for writer in writers:
            writer.add_text(self.tag, text, global_step=step)


def completion_report(out: dict[str, Any], max_rows: int, max_chars: int) -> str:
    """Markdown of turn 0 of one training step's output dict, for TensorBoard's TEXT tab.

    Per episode: each agent's user turn (the formatter's prompt, without the chat template) as a
    quote, then one entry per joint action that starts with its shared reward, followed by each
    agent's completion as a fenced code block (fenced with more backticks than the completion holds,
    so a completion's own fences cannot break out).

    Args:
        out: the dict ``MAGRPO.training_step`` returns (``user_prompts`` (else ``prompts``),
            ``completions``, ``turn0_rewards`` ``[E, J]``, ``num_generations``).
        max_rows: at most this many joint actions in all; max_chars: cut each prompt and
            completion to this many characters (``…`` marks a cut).

    Returns:
        Markdown text.

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
    parts, rows = [], 0
    for e in range(num_episodes):
        if rows >= max_rows:
            break
        parts.append(f"### episode {e}")
        for i in range(n):
            prompt = prompts[i][e] if e < len(prompts[i]) else ""
            parts.append(f"**agent_{i} user turn**\n\n" + _quote(_cut(prompt, max_chars)))
        for a in range(j):
            if rows >= max_rows:
                break
            rows += 1
            parts.append(f"**reward {float(rewards[e, a]):.4g}** (joint action {a})")
            for i in range(n):
                parts.append(
                    f"agent_{i}:\n\n" + _code_block(_cut(completions[i][e * k + int(joint[a, i])], max_chars))
                )
    return "\n\n".join(parts)


def _cut(text: str, max_chars: int) -> str:
    return text[:max_chars] + "…" if len(text) > max_chars else text


def _quote(text: str) -> str:
    return "\n".join("> " + line for line in text.replace("\r\n", "\n").split("\n"))


def _code_block(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"
